"""Benchmark plots: time and peak memory against the problem size n, on log-log axes.

:func:`plot_benchmark` takes benchmark rows — dicts with the size, a series name, and the
measured time and memory — as the benchmarks in ``benchmarks/`` write them (the attention scaling
benchmark's ``cases`` fit as they are), and draws one line per series (and per mode, dashed for
the second), with dotted ``∝ n`` and ``∝ n²`` reference slopes: on log-log axes a power law is a
straight line whose slope is its exponent. Rows whose ``status`` is not ``"ok"`` and missing or
non-positive values are left out.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from attnlab.io import read_json
from attnlab.viz._mpl import new_figure, save_figure

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

LINE_STYLES = ("-", "--", "-.", ":")


def load_benchmark(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """Rows of a benchmark results JSON: a list of rows, or an object with ``cases``, ``rows``
    or ``results`` holding one.

    Raises:
        FileNotFoundError: for a missing file. ValueError: for a file without rows.
    """
    p = Path(path)
    if not p.is_file():
        raise FileNotFoundError(f"no such benchmark results file: {p}")
    data = read_json(p, what="benchmark results file")
    if isinstance(data, dict):
        data = next((data[k] for k in ("cases", "rows", "results") if k in data), None)
    if not isinstance(data, list) or not all(isinstance(r, dict) for r in data):
        raise ValueError(f"{p}: expected a list of result rows (or an object with 'cases')")
    return data


def _series(
    rows: Iterable[Mapping[str, Any]], x: str, y: str, group: str, style: str | None
) -> dict[tuple[str, str], list[tuple[float, float]]]:
    out: dict[tuple[str, str], list[tuple[float, float]]] = {}
    for r in rows:
        if r.get("status", "ok") != "ok":
            continue
        xv, yv = r.get(x), r.get(y)
        if not isinstance(xv, int | float) or not isinstance(yv, int | float):
            continue
        if xv <= 0 or yv <= 0 or not math.isfinite(yv):
            continue
        key = (str(r.get(group, "")), str(r.get(style, "")) if style else "")
        out.setdefault(key, []).append((float(xv), float(yv)))
    return {k: sorted(v) for k, v in out.items()}


def _references(ax: Axes, points: Sequence[tuple[float, float]], powers: Sequence[int]) -> None:
    """Dotted ``∝ n^p`` lines through the geometric mean of the values at the smallest n."""
    if not points:
        return
    xs = sorted({p[0] for p in points})
    x0 = xs[0]
    ys0 = [y for x, y in points if x == x0]
    y0 = math.exp(sum(math.log(y) for y in ys0) / len(ys0))
    for p in powers:
        name = "∝ n" if p == 1 else f"∝ n^{p}" if p != 2 else "∝ n²"
        ax.plot(xs, [y0 * (x / x0) ** p for x in xs], ":", color="grey", lw=1, label=name)


def plot_benchmark(
    rows: Iterable[Mapping[str, Any]],
    *,
    x: str = "n",
    group: str = "backend",
    style: str | None = "mode",
    time_key: str = "time_s",
    memory_key: str | None = "peak_mem_bytes",
    references: Sequence[int] = (1, 2),
    x_label: str = "sequence length n",
    title: str = "",
    path: str | os.PathLike[str] | None = None,
) -> Figure:
    """Log-log time (and memory) against ``x``, one line per ``group`` (x ``style``) value.

    Args:
        rows: result dicts, e.g. ``load_benchmark(path)`` or a benchmark's ``cases``.
        x, group, style: the keys of the size, the series name and an optional second split
            (line style), e.g. ``"mode"``: forward / forward_backward.
        time_key: seconds. memory_key: bytes (drawn in MiB), or ``None`` for time only.
        references: exponents of the dotted reference slopes.

    Returns:
        A figure with one axes (time) or two (time, memory: when any row has a memory value).

    Raises:
        ValueError: if no row has a positive ``x`` and time.
    """
    rows = list(rows)
    times = _series(rows, x, time_key, group, style)
    if not times:
        raise ValueError(f"no benchmark row has positive {x!r} and {time_key!r} values")
    mems = _series(rows, x, memory_key, group, style) if memory_key else {}
    panels = [(times, "time (s)", 1.0)] + ([(mems, "peak memory (MiB)", 2.0**-20)] if mems else [])
    fig = new_figure(6.0 * len(panels) + 0.5, 4.6)
    axes = fig.subplots(1, len(panels), squeeze=False)[0]
    groups = sorted({g for g, _ in times})
    styles = sorted({s for _, s in times})
    for ax, (series, label, scale) in zip(axes, panels, strict=True):
        every = []
        for (g, s), pts in series.items():
            colour = f"C{groups.index(g) % 10}" if g in groups else "black"
            line = LINE_STYLES[styles.index(s) % 4] if s in styles else "-"
            name = g + (f" ({s})" if s and len(styles) > 1 else "")
            xs, ys = zip(*pts, strict=True)
            ax.plot(xs, [y * scale for y in ys], line, marker="o", ms=3.5, color=colour, label=name)
            every += [(px, py * scale) for px, py in pts]
        _references(ax, every, references)
        ax.set(xscale="log", yscale="log", xlabel=x_label, ylabel=label)
        ax.grid(True, which="both", alpha=0.3)
    axes[0].legend(fontsize=7)
    fig.suptitle(title or "Benchmark: time and memory vs n (log-log)", fontsize=11)
    if path is not None:
        save_figure(fig, path)
    return fig


__all__ = ["load_benchmark", "plot_benchmark"]
