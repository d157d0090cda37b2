"""Expert load over training: the per-expert token counts an MoE run logs, as one heatmap per layer.

Records are metrics dicts (a ``metrics.jsonl`` line) with a ``step`` and, under ``moe_load``,
``{layer name: [assignments routed to each expert]}`` — what the trainer logs for an MoE model
(:meth:`attnlab.training.moe.MoEStepStats.fields`). Records without ``moe_load`` are skipped.
Each panel shows, per logged step (x) and expert (y), the fraction of that layer's assignments
the expert received: a balanced layer is a flat ``1/E`` colour, a collapsed one a bright stripe.
``attnlab viz experts RUN_DIR`` draws it for a run directory.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from attnlab.training.metrics import read_metrics
from attnlab.viz._mpl import new_figure, save_figure
from attnlab.viz.curves import metrics_files

if TYPE_CHECKING:
    from matplotlib.figure import Figure

LOAD_KEY = "moe_load"


@dataclass
class ExpertLoad:
    """Per layer, the load fractions ``[step][expert]`` at ``steps``."""

    steps: list[float] = field(default_factory=list)
    layers: dict[str, list[list[float]]] = field(default_factory=dict)


def expert_load(records: Iterable[Any]) -> ExpertLoad:
    """Collect the ``moe_load`` counts of metric records as fractions per step.

    Raises:
        ValueError: if no record has a step and ``moe_load``, or a layer changes expert count.
    """
    out = ExpertLoad()
    for rec in records:
        if not isinstance(rec, Mapping) or not isinstance(rec.get(LOAD_KEY), Mapping):
            continue
        if not isinstance(rec.get("step"), int | float):
            continue
        out.steps.append(float(rec["step"]))
        for name, counts in rec[LOAD_KEY].items():
            total = float(sum(counts)) or 1.0
            rows = out.layers.setdefault(str(name), [])
            if rows and len(rows[0]) != len(counts):
                raise ValueError(f"layer {name}: {len(counts)} experts, earlier {len(rows[0])}")
            rows.append([c / total for c in counts])
    if not out.steps or not out.layers:
        raise ValueError(f"no record has a 'step' and {LOAD_KEY!r} counts of some layer")
    return out


def read_expert_load(path: str | os.PathLike[str]) -> ExpertLoad:
    """:func:`expert_load` of a run directory or metrics file.

    Raises:
        FileNotFoundError: for a missing path or a directory without metrics.
        ValueError: if no line holds expert load (not an MoE run).
    """
    records = [r for f in metrics_files(path) for r in read_metrics(f)]
    try:
        return expert_load(records)
    except ValueError as e:
        raise ValueError(f"{path}: {e} (is it a mixture-of-experts run?)") from None


def plot_expert_load(
    load: ExpertLoad | Iterable[Any],
    *,
    layers: Sequence[str] | None = None,
    title: str = "",
    path: str | os.PathLike[str] | None = None,
) -> Figure:
    """One heatmap per MoE layer: share of the layer's assignments per expert over training.

    Args:
        load: an :class:`ExpertLoad` or metric records for :func:`expert_load`.
        layers: which layers to draw (default all, in logged order).

    Raises:
        ValueError: for no data or an unknown layer name.
    """
    data = load if isinstance(load, ExpertLoad) else expert_load(load)
    names = list(data.layers) if layers is None else list(layers)
    unknown = [n for n in names if n not in data.layers]
    if unknown or not names:
        raise ValueError(f"unknown layers {unknown}; logged: {list(data.layers)}")
    fig = new_figure(8.0, 1.2 + 1.6 * len(names))
    axes = fig.subplots(len(names), 1, sharex=True, squeeze=False)[:, 0]
    s0, s1 = data.steps[0], data.steps[-1] if len(data.steps) > 1 else data.steps[0] + 1
    top = max(v for n in names for row in data.layers[n] for v in row)  # one colour scale
    image = None
    for ax, name in zip(axes, names, strict=True):
        rows = data.layers[name]  # (S, E)
        grid = [list(col) for col in zip(*rows, strict=True)]  # (E, S)
        extent = (s0, s1, -0.5, len(grid) - 0.5)
        image = ax.imshow(grid, aspect="auto", origin="lower", cmap="viridis", vmin=0.0,
                          vmax=top, extent=extent, interpolation="nearest")  # fmt: skip
        ax.set_ylabel(f"{name}\nexpert", fontsize=8)
    axes[-1].set_xlabel("step")
    axes[0].set_title(title or "Expert load (share of assignments) over training")
    if image is not None:
        fig.colorbar(image, ax=list(axes), label="share")
    if path is not None:
        save_figure(fig, path)
    return fig


__all__ = ["LOAD_KEY", "ExpertLoad", "expert_load", "plot_expert_load", "read_expert_load"]
