"""The learning-rate schedule curve: §5.3's eq. (3) ("noam"), warmup + cosine, constant.

The values are the library's own schedule functions (:mod:`attnlab.training.schedules`), evaluated
at every step from 1 to ``steps``. Several ``(d_model, warmup)`` pairs can be overlaid, as in the
Annotated Transformer's figure. For ``noam`` the values are learning rates (the paper has no base
rate); for ``cosine``/``constant`` they are multipliers of the optimizer's ``lr`` unless ``lr`` is
given.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Sequence
from typing import TYPE_CHECKING

from attnlab.training.schedules import SCHEDULES, make_schedule
from attnlab.viz._mpl import new_figure, save_figure

if TYPE_CHECKING:
    from matplotlib.figure import Figure


def schedule_curves(
    kind: str,
    *,
    steps: int = 20000,
    d_model: Sequence[int] = (512,),
    warmup: Sequence[int] = (4000,),
    total_steps: int | None = None,
    min_ratio: float = 0.0,
    factor: float = 1.0,
    lr: float | None = None,
    decay_fraction: float = 0.2,
    decay: str = "linear",
) -> dict[str, tuple[list[int], list[float]]]:
    """Curve label -> ``(steps 1..steps, values)`` for each combination of the arguments.

    Args:
        kind: a :data:`~attnlab.training.schedules.SCHEDULES` key (noam, cosine, wsd,
            constant).
        steps: the last step drawn. d_model: widths (noam). warmup: warmup steps (all kinds).
        total_steps: cosine's and wsd's end (default ``steps``). min_ratio: their floor.
        factor: noam's multiplier. lr: multiply cosine/wsd/constant values by this base rate.
        decay_fraction, decay: wsd's decay (the last fraction of ``total_steps``, its shape).

    Raises:
        ValueError: for an unknown kind (listing the valid ones), ``steps < 1`` or arguments the
            schedule rejects.
    """
    if kind not in SCHEDULES:
        raise ValueError(f"unknown schedule {kind!r}; valid: {', '.join(SCHEDULES.keys())}")
    if steps < 1:
        raise ValueError(f"steps must be >= 1, got {steps}")
    xs = list(range(1, steps + 1))
    curves: dict[str, tuple[list[int], list[float]]] = {}
    scale = 1.0 if lr is None or kind == "noam" else lr
    if kind == "noam":
        for d, w in itertools.product(d_model, warmup):
            f = make_schedule("noam", d_model=d, warmup=w, factor=factor)
            curves[f"d_model={d}, warmup={w}"] = (xs, [f(s) for s in xs])
    elif kind == "cosine":
        for w in warmup:
            f = make_schedule(
                "cosine", warmup=w, total_steps=total_steps or steps, min_ratio=min_ratio
            )
            curves[f"warmup={w}, total={total_steps or steps}"] = (xs, [scale * f(s) for s in xs])
    elif kind == "wsd":
        for w in warmup:
            f = make_schedule(
                "wsd",
                warmup=w,
                total_steps=total_steps or steps,
                decay_fraction=decay_fraction,
                min_ratio=min_ratio,
                decay=decay,
            )
            label = f"warmup={w}, decay {decay} over the last {decay_fraction:.0%}"
            curves[label] = (xs, [scale * f(s) for s in xs])
    else:
        for w in warmup:
            f = make_schedule(kind, warmup=w)
            curves[f"warmup={w}"] = (xs, [scale * f(s) for s in xs])
    return curves


def plot_schedule(
    kind: str,
    *,
    steps: int = 20000,
    d_model: Sequence[int] = (512,),
    warmup: Sequence[int] = (4000,),
    total_steps: int | None = None,
    min_ratio: float = 0.0,
    factor: float = 1.0,
    lr: float | None = None,
    decay_fraction: float = 0.2,
    decay: str = "linear",
    path: str | os.PathLike[str] | None = None,
) -> Figure:
    """Draw :func:`schedule_curves` (same arguments) on one axes, marking each curve's peak."""
    curves = schedule_curves(
        kind,
        steps=steps,
        d_model=d_model,
        warmup=warmup,
        total_steps=total_steps,
        min_ratio=min_ratio,
        factor=factor,
        lr=lr,
        decay_fraction=decay_fraction,
        decay=decay,
    )
    fig = new_figure(7.5, 4.3)
    ax = fig.subplots()
    for i, (label, (xs, ys)) in enumerate(curves.items()):
        ax.plot(xs, ys, color=f"C{i}", lw=1.6, label=label)
        peak = max(range(len(ys)), key=ys.__getitem__)
        ax.plot([xs[peak]], [ys[peak]], "o", color=f"C{i}", ms=4)
        ax.annotate(
            f"peak {ys[peak]:.3g} @ {xs[peak]}",
            (xs[peak], ys[peak]),
            textcoords="offset points",
            xytext=(6, 4),
            fontsize=7,
            color=f"C{i}",
        )
    if kind == "noam":
        ylabel, title = (
            "learning rate",
            ("Noam schedule, eq. (3): d_model^-0.5 · min(step^-0.5, step · warmup^-1.5)"),
        )
    else:
        ylabel = "learning rate" if lr is not None else "multiplier of the optimizer's lr"
        title = {"cosine": "Linear warmup + cosine decay", "constant": "Constant (+ warmup)"}.get(
            kind, kind
        )
    ax.set(xlabel="step", ylabel=ylabel, title=title, xlim=(0, steps), ylim=(0, None))
    ax.ticklabel_format(axis="y", style="sci", scilimits=(-3, 3))
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    if path is not None:
        save_figure(fig, path)
    return fig


__all__ = ["plot_schedule", "schedule_curves"]
