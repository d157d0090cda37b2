"""Training curves: train/validation loss (and learning rate) from metrics files, runs overlaid.

The metrics format is JSON Lines: one JSON object per line, one line per logged step; attnlab's
own schema is :mod:`attnlab.training.metrics` (``step``, ``split``, ``loss``, ``lr``). The reader
is tolerant, so any trainer that writes something close to this works:

- ``step`` (also ``global_step``, ``iter``, ``iteration``): a number; lines without one are
  skipped;
- train loss: ``train_loss``, ``loss`` or ``train/loss``;
- validation loss: ``val_loss``, ``valid_loss``, ``validation_loss``, ``eval_loss`` or
  ``val/loss``; or ``loss`` on a line whose ``split`` (or ``phase``) is ``val``, ``valid``,
  ``validation`` or ``eval``;
- learning rate (optional): ``lr`` or ``learning_rate``;
- lines whose ``split`` is ``final`` (attnlab's figures for a model made at the end, such as the
  checkpoint average) are not points of a curve and are skipped;
- anything else (tokens/s, grad norm, time) is ignored. Blank lines, lines that are not JSON
  objects (a half-written last line) and non-finite values are skipped and counted.

A run is a metrics file, or a directory holding ``metrics.jsonl`` (else every ``*.jsonl`` in it,
in name order). A ``.json`` file holding a list of such objects also works.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from attnlab.io import parse_json_line
from attnlab.viz._mpl import new_figure, save_figure

if TYPE_CHECKING:
    from matplotlib.figure import Figure

METRICS_NAME = "metrics.jsonl"
STEP_KEYS = ("step", "global_step", "iter", "iteration")
TRAIN_KEYS = ("train_loss", "loss", "train/loss")
VAL_KEYS = ("val_loss", "valid_loss", "validation_loss", "eval_loss", "val/loss")
LR_KEYS = ("lr", "learning_rate")
VAL_SPLITS = ("val", "valid", "validation", "eval")

Points = list[tuple[float, float]]


@dataclass
class RunMetrics:
    """The curves of one run: ``(step, value)`` points, in file order."""

    name: str
    train: Points = field(default_factory=list)
    val: Points = field(default_factory=list)
    lr: Points = field(default_factory=list)
    skipped: int = 0  # lines that were blank, not JSON objects, had no step or bad values


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if math.isfinite(value) else None


def _first(record: Mapping[str, Any], keys: Sequence[str]) -> float | None:
    for k in keys:
        if k in record:
            return _number(record[k])
    return None


def parse_records(records: Iterable[Any], name: str = "run") -> RunMetrics:
    """Sort metric records (dicts) into train/val/lr curves; see the module docstring."""
    run = RunMetrics(name)
    for rec in records:
        step = _first(rec, STEP_KEYS) if isinstance(rec, dict) else None
        if step is None:
            run.skipped += 1
            continue
        split = str(rec.get("split", rec.get("phase", "train"))).lower()
        if split == "final":
            run.skipped += 1
            continue
        val = _first(rec, VAL_KEYS)
        if split in VAL_SPLITS:
            val = val if val is not None else _first(rec, ("loss",))
            train = None
        else:
            train = _first(rec, TRAIN_KEYS)
        lr = _first(rec, LR_KEYS)
        if train is None and val is None and lr is None:
            run.skipped += 1
        for points, value in ((run.train, train), (run.val, val), (run.lr, lr)):
            if value is not None:
                points.append((step, value))
    return run


def _lines(file: Path) -> Iterable[Any]:
    text = file.read_text(encoding="utf-8", errors="replace")  # a bad byte spoils one line
    if file.suffix == ".json":
        data = parse_json_line(text)  # None when it is not one JSON document
        if isinstance(data, list):
            yield from data
            return
    for line in text.splitlines():
        if not line.strip():
            continue
        yield parse_json_line(line)  # None: counted as skipped


def metrics_files(path: str | os.PathLike[str]) -> list[Path]:
    """The metrics files of a run: the file itself, or a directory's ``metrics.jsonl`` (else all
    its ``*.jsonl``).

    Raises:
        FileNotFoundError: for a missing path or a directory without metrics files.
    """
    p = Path(path)
    if p.is_file():
        return [p]
    if not p.exists():
        raise FileNotFoundError(f"no such run directory or metrics file: {p}")
    if (p / METRICS_NAME).is_file():
        return [p / METRICS_NAME]
    found = sorted(p.glob("*.jsonl"))
    if not found:
        raise FileNotFoundError(f"{p} holds no {METRICS_NAME} (nor any *.jsonl metrics file)")
    return found


def read_metrics(path: str | os.PathLike[str], *, name: str | None = None) -> RunMetrics:
    """Read one run's metrics (a file or a run directory), named after it.

    Raises:
        FileNotFoundError: see :func:`metrics_files`.
        ValueError: if no line has a step and a loss or learning rate.
    """
    files = metrics_files(path)
    p = Path(path)
    label = name or (p.name if p.is_dir() else p.stem if p.stem != "metrics" else p.parent.name)
    records = (r for f in files for r in _lines(f))
    run = parse_records(records, label or str(p))
    if not (run.train or run.val or run.lr):
        raise ValueError(
            f"{path}: no usable metrics: each line must be a JSON object with 'step' and a loss "
            f"({', '.join(TRAIN_KEYS + VAL_KEYS)}) or learning rate ({', '.join(LR_KEYS)})"
        )
    return run


def plot_curves(
    runs: Sequence[RunMetrics | str | os.PathLike[str]],
    *,
    log_y: bool = False,
    title: str = "",
    path: str | os.PathLike[str] | None = None,
) -> Figure:
    """Train (solid) and validation (dashed, dots) loss of several runs, one colour per run; a
    second axes with the learning rate when any run logs one.

    Args:
        runs: :class:`RunMetrics` or paths for :func:`read_metrics`.
        log_y: logarithmic loss axis.

    Raises:
        ValueError: for no runs; see :func:`read_metrics` for paths.
    """
    if not runs:
        raise ValueError("plot_curves needs at least one run")
    loaded = [r if isinstance(r, RunMetrics) else read_metrics(r) for r in runs]
    names = [r.name for r in loaded]
    if len(set(names)) < len(names):  # the same directory name twice: number them
        names = [f"{n} ({i})" for i, n in enumerate(names)]
    has_lr = any(r.lr for r in loaded)
    fig = new_figure(8.0, 6.5 if has_lr else 4.5)
    axes = fig.subplots(2, 1, sharex=True, height_ratios=[2.2, 1]) if has_lr else [fig.subplots()]
    ax = axes[0]
    for i, (run, name) in enumerate(zip(loaded, names, strict=True)):
        if run.train:
            ax.plot(
                *zip(*run.train, strict=True), "-", color=f"C{i}", lw=1.2, label=f"{name} train"
            )
        if run.val:
            ax.plot(
                *zip(*run.val, strict=True), "--o", color=f"C{i}", lw=1.2, ms=3, label=f"{name} val"
            )
        if has_lr and run.lr:
            axes[1].plot(*zip(*run.lr, strict=True), "-", color=f"C{i}", lw=1.2, label=name)
    if log_y:
        ax.set_yscale("log")
    ax.set(ylabel="loss", title=title or "Training curves")
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=8)
    if has_lr:
        axes[1].set(ylabel="learning rate")
        axes[1].ticklabel_format(axis="y", style="sci", scilimits=(-3, 3))
        axes[1].grid(alpha=0.3)
    axes[-1].set_xlabel("step")
    if path is not None:
        save_figure(fig, path)
    return fig


__all__ = [
    "METRICS_NAME",
    "RunMetrics",
    "metrics_files",
    "parse_records",
    "plot_curves",
    "read_metrics",
]
