"""Pictures of attention: per-head grids, one head, rollout, and the heads that link two tokens.

Every function returns a matplotlib ``Figure`` (and writes it when ``path`` is given). The image
of each heatmap is the weight matrix itself: rows are queries, columns are keys, row ``i`` of a
self-attention head sums to 1 over the keys that query ``i`` may attend to (masked keys are 0).

Shapes: H heads, T queries, S keys, L layers.
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from typing import TYPE_CHECKING

from torch import Tensor

from attnlab.viz._mpl import heatmap, label_fontsize, new_figure, save_figure
from attnlab.viz.attention import STACK_TITLES, AttentionMaps

if TYPE_CHECKING:
    from matplotlib.figure import Figure

# Token labels on every panel up to this length; beyond it, on the grid's outer edges only.
LABEL_EVERY_PANEL = 24
# Beyond this many tokens, labels would be unreadable: positions are numbered instead.
MAX_LABELS = 100


def _grid(n: int) -> tuple[int, int]:
    """(rows, cols) for ``n`` panels, at most 4 columns, close to 4:3."""
    cols = min(n, 4 if n > 6 else max(1, math.ceil(math.sqrt(n))))
    return math.ceil(n / cols), cols


def plot_attention(
    weights: Tensor,
    query_labels: Sequence[str],
    key_labels: Sequence[str] | None = None,
    *,
    heads: Sequence[int] | None = None,
    title: str = "",
    annotate: bool | None = None,
    cmap: str = "viridis",
    colorbar_label: str = "attention weight",
    axis_labels: tuple[str, str] = ("key (attended to)", "query (attending)"),
    path: str | os.PathLike[str] | None = None,
) -> Figure:
    """Heatmaps of attention weights: a grid with one panel per head, or one head.

    Args:
        weights: ``(H, T, S)`` (a layer) or ``(T, S)`` (one head).
        query_labels: ``T`` labels (rows). key_labels: ``S`` labels (columns); default the
            query labels.
        heads: which heads of a ``(H, T, S)`` layer to draw, and their names in the titles
            (default all).
        title: the figure title. annotate: write each weight in its cell (default: one head
            with at most 16 keys). cmap: a matplotlib colour map. colorbar_label,
            axis_labels: the colour bar's label and ``(x, y)`` axis labels of a single panel.
        path: also save the figure here (PNG by default).

    Returns:
        The figure: one image per head, then one colour bar (shared scale from 0).

    Raises:
        ValueError: for weights that are not 2-D/3-D, labels that do not match, or heads out of
            range (naming the range).
    """
    key_labels = list(query_labels) if key_labels is None else list(key_labels)
    names: list[int | None]
    if weights.dim() == 2:
        weights, names = weights.unsqueeze(0), [None]
    elif weights.dim() == 3:
        H = weights.shape[0]
        chosen = list(range(H)) if heads is None else list(heads)
        bad = [h for h in chosen if not 0 <= h < H]
        if bad or not chosen:
            raise ValueError(f"heads {bad or chosen} are out of range: valid 0..{H - 1}")
        weights, names = weights[chosen], list(chosen)
    else:
        raise ValueError(f"weights must be (H, T, S) or (T, S), got {tuple(weights.shape)}")
    if len(query_labels) != weights.shape[-2] or len(key_labels) != weights.shape[-1]:
        raise ValueError(
            f"{len(query_labels)} query and {len(key_labels)} key labels for weights of shape "
            f"{tuple(weights.shape)} (..., T, S)"
        )
    data = weights.detach().float().cpu().numpy()
    n, T, S = data.shape
    rows, cols = _grid(n)
    single = n == 1
    # The longer side of a panel gets `panel` inches; cells stay square.
    long = max(T, S)
    panel = min(12.0, max(4.5, 0.32 * long)) if single else min(6.0, max(2.6, 0.17 * long))
    cell = panel / long
    fig = new_figure(max(7.0, cols * (S * cell + 0.4) + 1.0), rows * (T * cell + 0.4) + 1.1)
    axes = fig.subplots(rows, cols, squeeze=False)
    vmax = float(data.max()) if data.size and data.max() > 0 else 1.0
    every = T <= LABEL_EVERY_PANEL and S <= LABEL_EVERY_PANEL
    size = label_fontsize(max(T, S), panel_inches=panel) * (1.0 if single else 0.85)
    annotate = single and S <= 16 if annotate is None else annotate
    image = None
    for k in range(rows * cols):
        ax = axes[k // cols][k % cols]
        if k >= n:
            ax.set_axis_off()
            continue
        image = heatmap(
            ax,
            data[k],
            x_labels=key_labels if long <= MAX_LABELS else None,
            y_labels=list(query_labels) if long <= MAX_LABELS else None,
            vmin=0.0,
            vmax=vmax,
            cmap=cmap,
            fontsize=size,
            show_x=every or k // cols == rows - 1 or k + cols >= n,
            show_y=every or k % cols == 0,
        )
        if names[k] is not None:
            ax.set_title(f"head {names[k]}", fontsize=9)
        if annotate:
            for i in range(T):
                for j in range(S):
                    v = data[k, i, j]
                    colour = "black" if v > 0.6 * vmax else "white"
                    ax.text(j, i, f"{v:.2f}", ha="center", va="center", fontsize=6, color=colour)
    if single:
        axes[0][0].set_xlabel(axis_labels[0])
        axes[0][0].set_ylabel(axis_labels[1])
    if image is not None:
        bar = fig.colorbar(image, ax=axes.ravel().tolist(), shrink=0.8, aspect=30)
        bar.set_label(colorbar_label)
    fig.suptitle(title or "attention weights (rows: queries, columns: keys)", fontsize=11)
    if path is not None:
        save_figure(fig, path)
    return fig


def plot_layer(
    maps: AttentionMaps,
    layer: int,
    *,
    stack: str | None = None,
    head: int | None = None,
    path: str | os.PathLike[str] | None = None,
) -> Figure:
    """:func:`plot_attention` of one layer (or head) of :class:`AttentionMaps`, with titles.

    Args:
        stack: ``"self"`` (default for BERT/GPT), ``"encoder"`` (default for encoder-decoder),
            ``"decoder"`` or ``"cross"``.

    Raises:
        ValueError: for an unknown stack, or a layer/head out of range (naming the range).
    """
    stack = stack or next(iter(maps.stacks))
    w = maps.layer(stack, layer, head)
    queries, keys = maps.labels(stack)
    what = STACK_TITLES.get(stack, stack)
    heads = f", head {head}" if head is not None else f", all {w.shape[0]} heads"
    which = f"layer {layer}{heads}"
    title = f"{maps.model_name} {what}\n{which}; rows: queries, columns: keys; rows sum to 1"
    return plot_attention(w, queries, keys, title=title, path=path)


def plot_rollout(
    rollout: Tensor,
    labels: Sequence[str],
    *,
    title: str = "",
    path: str | os.PathLike[str] | None = None,
) -> Figure:
    """Heatmap of an attention rollout ``(T, T)`` (from :func:`attention_rollout`).

    Raises:
        ValueError: for a non-square matrix or labels that do not match.
    """
    if rollout.dim() != 2 or rollout.shape[0] != rollout.shape[1]:
        raise ValueError(f"rollout must be (T, T), got {tuple(rollout.shape)}")
    return plot_attention(
        rollout,
        labels,
        title=title or "attention rollout (Abnar & Zuidema 2020): input token -> final position",
        annotate=False,
        cmap="magma",
        colorbar_label="rollout weight (rows sum to 1)",
        axis_labels=("input token", "position after the last layer"),
        path=path,
    )


def plot_head_scores(
    scores: Tensor,
    row: Tensor,
    key_labels: Sequence[str],
    *,
    best: tuple[int, int],
    query: str,
    key: str,
    title: str = "",
    path: str | os.PathLike[str] | None = None,
) -> Figure:
    """Where one token looks at another: every (layer, head), and the best head's whole row.

    Args:
        scores: ``(L, H)`` weight from the query token to the key token(s) (:func:`head_scores`).
        row: ``(S,)`` the query's attention row in the best head.
        key_labels: ``S`` labels of ``row``. best: ``(layer, head)`` of that head.
        query, key: the two tokens, for the titles.

    Returns:
        A figure with two axes: the ``L x H`` heatmap (values written in the cells) and a bar
        chart of the best head's row, the key token's bars highlighted.
    """
    data = scores.detach().float().cpu().numpy()
    L, H = data.shape
    fig = new_figure(max(7.0, 0.55 * H + 1.5) + max(4.0, 0.35 * len(key_labels)), 5.0)
    ax_map, ax_row = fig.subplots(1, 2, width_ratios=[max(7.0, 0.55 * H), max(4.0, 0.3 * L)])
    image = heatmap(
        ax_map,
        data,
        x_labels=[str(h) for h in range(H)],
        y_labels=[str(layer) for layer in range(L)],
        vmin=0.0,
        vmax=max(float(data.max()), 1e-6),
        cmap="viridis",
        fontsize=8,
        aspect="equal",
    )
    for i in range(L):
        for j in range(H):
            colour = "black" if data[i, j] > 0.6 * data.max() else "white"
            ax_map.text(
                j, i, f"{data[i, j]:.2f}", ha="center", va="center", fontsize=7.5, color=colour
            )
    ax_map.tick_params(axis="x", labelrotation=0)
    ax_map.set(xlabel="head", ylabel="layer")
    ax_map.set_title(f"weight of {query!r} -> {key!r}, every head", fontsize=10)
    fig.colorbar(image, ax=ax_map, shrink=0.8).set_label("attention weight")
    values = row.detach().float().cpu().numpy()
    key_norm = {key.lower()}
    colours = [
        "tab:red" if label.removeprefix("##").lower() in key_norm else "tab:blue"
        for label in key_labels
    ]
    ax_row.bar(range(len(values)), values, color=colours)
    ax_row.set_xticks(
        range(len(values)),
        list(key_labels),
        rotation=90,
        fontsize=label_fontsize(len(values), panel_inches=4.0),
    )
    ax_row.set(ylim=(0, 1), ylabel="attention weight")
    ax_row.set_title(f"{query!r} attends to ... (layer {best[0]}, head {best[1]})", fontsize=10)
    ax_row.grid(axis="y", alpha=0.3)
    if title:
        fig.suptitle(title, fontsize=11)
    if path is not None:
        save_figure(fig, path)
    return fig


__all__ = ["plot_attention", "plot_head_scores", "plot_layer", "plot_rollout"]
