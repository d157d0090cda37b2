"""The picture of ``attnlab analyze --plot``: the FLOP shares against the sequence length.

:func:`sweep_figure` draws the rows of :func:`attnlab.analysis.scaling.sweep_seq_len` (one curve
per group of :data:`~attnlab.analysis.flops.FLOP_GROUPS`, the block and layer crossovers as
vertical lines); :func:`plot_sweep` writes it to a file.

Curves that coincide would hide one another: for transformer-base the pre-softmax projection
("other") costs within 0.1 percentage points of the attention projections at every length, and
a ViT with ``d_ff = 2·d_model`` has projections and FFN exactly equal. :func:`coinciding_curves`
finds such groups (equal within a tolerance at every plotted point); the figure then draws each
member of a group in its own line style and marker (solid with small filled markers, then dashed
with larger hollow ones, then dotted), so both stay visible, and says "A = B" in the legend.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from attnlab.analysis.flops import FLOP_GROUPS
from attnlab.analysis.scaling import Crossover

_STYLES = {
    "projections": ("o", "-"),
    "attention": ("s", "-"),
    "ffn": ("^", "-"),
    "other": ("x", "--"),
}
# line style and marker size of the second, third, ... member of a coinciding group: drawn on top
# of the first, dashed or dotted with larger hollow markers, so the first shows through
_OVERLAP_STYLES = (((0, (5, 4)), 8), ((0, (1, 3)), 11))


def coinciding_curves(curves: Mapping[str, Sequence[float]], tol: float) -> list[list[str]]:
    """Groups of curves equal within ``tol`` at every point: each group lists two or more names
    in the order of ``curves``; a curve joins the group of the first earlier curve it matches.

    Raises:
        ValueError: for a negative or non-finite ``tol``, or curves of different lengths.
    """
    if not isinstance(tol, int | float) or not math.isfinite(tol) or tol < 0:
        raise ValueError(f"tol must be a finite number >= 0, got {tol!r}")
    lengths = {name: len(ys) for name, ys in curves.items()}
    if len(set(lengths.values())) > 1:
        raise ValueError(f"the curves must have one length each, got {lengths}")
    groups: list[list[str]] = []
    for name, ys in curves.items():
        for group in groups:
            first = curves[group[0]]
            if all(abs(a - b) <= tol for a, b in zip(ys, first, strict=True)):
                group.append(name)
                break
        else:
            groups.append([name])
    return [g for g in groups if len(g) > 1]


def sweep_figure(
    rows: list[dict[str, float]], *, title: str = "", crossover: Crossover | None = None,
    tol: float = 1.0,
) -> Any:  # fmt: skip
    """The FLOP shares (%) against the sequence length (log x), as a matplotlib figure; curves
    within ``tol`` percentage points of each other at every length are marked as coinciding.

    Raises:
        ImportError: without matplotlib (``pip install matplotlib``).
        ValueError: for no rows, or a bad ``tol`` (:func:`coinciding_curves`).
    """
    if not rows:
        raise ValueError("the sweep has no rows to draw")
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as e:  # pragma: no cover - depends on the environment
        raise ImportError("plotting needs matplotlib: pip install matplotlib") from e
    n = [r["seq_len"] for r in rows]
    curves = {g: [100 * r[g] for r in rows] for g in FLOP_GROUPS if any(r[g] > 0 for r in rows)}
    groups = coinciding_curves(curves, tol)
    member = {name: (i, g) for g in groups for i, name in enumerate(g)}
    fig, ax = plt.subplots(figsize=(7, 4.2))
    for name, ys in curves.items():
        i, group = member.get(name, (0, [name]))
        marker, solid = _STYLES[name]
        ls: Any = solid
        size, label, face = 4, name, None
        if i:
            ls, size = _OVERLAP_STYLES[min(i, len(_OVERLAP_STYLES)) - 1]
            label, face = f"{name} (= {group[0]})", "none"
        ax.plot(n, ys, ls=ls, marker=marker, ms=size, mfc=face, mew=1.2, label=label, zorder=2 + i)
    if crossover is not None:
        for x, label in (
            (crossover.block, "block crossover"),
            (crossover.layer, "layer crossover"),
        ):
            if n[0] <= x <= n[-1]:
                ax.axvline(x, color="grey", ls="--", lw=0.8)
                ax.annotate(label, (x, 95), rotation=90, fontsize=7, ha="right", va="top")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("sequence length n")
    ax.set_ylabel("share of forward matmul FLOPs (%)")
    ax.set_ylim(0, 100)
    ax.set_title(title or "Where the FLOPs go")
    ax.grid(alpha=0.3)
    notes = [" = ".join(g) + f" (within {tol:g} pp)" for g in groups]
    ax.legend(title="\n".join(notes) or None, title_fontsize=8)
    fig.tight_layout()
    return fig


def plot_sweep(
    rows: list[dict[str, float]], path: str | Path, *, title: str = "",
    crossover: Crossover | None = None, tol: float = 1.0,
) -> Path:  # fmt: skip
    """Draw :func:`sweep_figure` into ``path`` (PNG, SVG, ... by its suffix) and return it.

    Raises:
        ImportError: without matplotlib (``pip install matplotlib``).
    """
    fig = sweep_figure(rows, title=title, crossover=crossover, tol=tol)
    import matplotlib.pyplot as plt  # importable: sweep_figure imported it

    out = Path(path)
    try:
        fig.savefig(out, dpi=120)
    finally:
        plt.close(fig)
    return out


__all__ = ["coinciding_curves", "plot_sweep", "sweep_figure"]
