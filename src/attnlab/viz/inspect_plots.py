"""Pictures of :mod:`attnlab.inspect` results: activation patching and the logit lens.

- :func:`plot_patching`: a heatmap of a :class:`~attnlab.inspect.PatchingResult`, rows the
  patched activations (one per layer when they differ only by layer: layer x position, layer x
  head), columns the slices; the colour is the metric's change (or the normalised effect,
  0 = corrupted, 1 = clean), on a diverging scale centred at 0.
- :func:`plot_logit_lens`: per layer (rows) and position (columns), the probability the lens
  gives to the token the model finally predicts there, each cell labelled with the lens's top
  token.

Every function returns a matplotlib ``Figure`` (and writes it when ``path`` is given).
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import torch

from attnlab.inspect.lens import LogitLens
from attnlab.inspect.patching import PatchingResult
from attnlab.viz._mpl import heatmap, new_figure, save_figure

if TYPE_CHECKING:
    from matplotlib.figure import Figure

_LAYER = re.compile(r"^(?P<head>.*?)layers\.(?P<index>\d+)\.(?P<tail>.+)$")


def row_labels(names: Sequence[str]) -> tuple[list[str], str]:
    """Short row labels and the axis title: ``["0", "1", ...], "layer (attn.z)"`` when the names
    differ only by their layer index, else the names themselves and ``"activation"``."""
    parts = [_LAYER.match(n) for n in names]
    if parts and all(parts):
        shapes = {(m["head"], m["tail"]) for m in parts if m}
        if len(shapes) == 1:
            head, tail = shapes.pop()
            return [m["index"] for m in parts if m], f"{head}layer ({tail})"
    return list(names), "activation"


def plot_patching(
    result: PatchingResult,
    *,
    normalize: bool = False,
    x_labels: Sequence[str] | None = None,
    title: str | None = None,
    path: str | os.PathLike[str] | None = None,
) -> Figure:
    """Heatmap of activation patching: rows the patched activations, columns the slices.

    Args:
        result: from :func:`~attnlab.inspect.activation_patching`.
        normalize: draw ``result.normalized()`` (0 = corrupted, 1 = clean) instead of
            ``result.effect`` (metric change).
        x_labels: column labels (e.g. ``labels_for(tokens, result)``); default positions/heads.
        title: the figure title (default names the metric's baselines).
        path: also save the figure here.

    Raises:
        ValueError: for labels that do not match the columns, or ``normalize`` when the clean
            and corrupted metrics are equal.
    """
    data = result.normalized() if normalize else result.effect  # (N, K)
    rows, y_title = row_labels(result.names)
    columns = list(x_labels) if x_labels is not None else result.column_labels()
    finite = data[torch.isfinite(data)]
    bound = float(finite.abs().max()) if finite.numel() else 1.0
    fig = new_figure(max(4.0, 0.3 * len(columns) + 2.0), max(2.0, 0.3 * len(rows) + 1.4))
    ax = fig.add_subplot(1, 1, 1)
    image = heatmap(
        ax, data.float().numpy(), x_labels=columns, y_labels=rows, cmap="RdBu",
        vmin=-(bound or 1.0), vmax=bound or 1.0, fontsize=8,
    )  # fmt: skip
    ax.set_xlabel({"position": "position patched", "head": "head patched"}.get(result.per, ""))
    ax.set_ylabel(y_title)
    label = "normalised effect (1 = clean)" if normalize else "metric - corrupted"
    fig.colorbar(image, ax=ax, label=label, shrink=0.9)
    ax.set_title(
        title
        if title is not None
        else f"activation patching (clean {result.clean:.3g}, corrupted {result.corrupted:.3g})",
        fontsize=9,
    )
    if path is not None:
        save_figure(fig, path)
    return fig


def plot_logit_lens(
    lens: LogitLens,
    *,
    decode: Callable[[int], str] = str,
    tokens: Sequence[str] | None = None,
    batch: int = 0,
    title: str = "logit lens",
    path: str | os.PathLike[str] | None = None,
) -> Figure:
    """The lens's probability of the model's final prediction, per layer and position.

    Args:
        lens: from :func:`~attnlab.inspect.logit_lens`.
        decode: token id -> text, for the cell labels (the lens's top token).
        tokens: column labels (the input tokens at the read positions); default positions.
        batch: which sequence of the batch.
        title, path: the figure title; also save the figure here.

    Raises:
        ValueError: for labels that do not match the positions.
    """
    probs = lens.probs()[:, batch]  # (L + 1, P, V)
    final = probs[-1].argmax(dim=-1)  # (P,): the model's own prediction
    data = probs.gather(-1, final.expand(probs.shape[0], -1).unsqueeze(-1)).squeeze(-1)
    top = probs.argmax(dim=-1)  # (L + 1, P)
    columns = list(tokens) if tokens is not None else [str(p) for p in lens.positions]
    fig = new_figure(max(4.0, 0.3 * len(columns) + 2.0), max(2.0, 0.35 * len(lens.labels) + 1.2))
    ax = fig.add_subplot(1, 1, 1)
    image = heatmap(
        ax, data.numpy(), x_labels=columns, y_labels=list(lens.labels), vmin=0.0, vmax=1.0,
        fontsize=8,
    )  # fmt: skip
    for r in range(data.shape[0]):
        for c in range(data.shape[1]):
            text = decode(int(top[r, c])).replace("\n", "\\n")
            colour = "black" if data[r, c] > 0.6 else "white"
            ax.text(c, r, text, ha="center", va="center", fontsize=6.5, color=colour)
    ax.set_xlabel("position (input token)")
    fig.colorbar(image, ax=ax, label="p(final prediction)", shrink=0.9)
    ax.set_title(title, fontsize=9)
    if path is not None:
        save_figure(fig, path)
    return fig


__all__ = ["plot_logit_lens", "plot_patching", "row_labels"]
