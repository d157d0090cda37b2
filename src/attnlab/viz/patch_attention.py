"""Where an image classifier looks: per-patch weights drawn over the images.

:func:`plot_patch_attention` shows a few images in the first row and, in each following row, one
map of per-patch weights laid over them: a ViT's [CLS] attention over the patches (one row of an
attention matrix from :func:`attnlab.viz.capture.collect_attention`, or of its
:func:`~attnlab.viz.capture.attention_rollout`), or CCT's sequence-pooling weights. A map of
``g x g`` patches is stretched over the image by repetition (each patch one block of pixels).

Shapes: N images, H x W pixels, g x g patch grid.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from attnlab.viz._mpl import new_figure, save_figure

if TYPE_CHECKING:
    from matplotlib.figure import Figure


def _grid(weights: Any) -> np.ndarray:
    w = np.asarray(weights, dtype=np.float64)
    if w.ndim == 2:  # (N, P): a square grid of patches
        side = round(w.shape[1] ** 0.5)
        if side * side != w.shape[1]:
            raise ValueError(f"{w.shape[1]} patches do not form a square grid")
        w = w.reshape(len(w), side, side)
    if w.ndim != 3:
        raise ValueError(f"patch weights must be (N, P) or (N, g, g), got shape {w.shape}")
    return w


def plot_patch_attention(
    images: Any,
    maps: Sequence[tuple[str, Any]],
    *,
    titles: Sequence[str] | None = None,
    title: str = "",
    path: str | os.PathLike[str] | None = None,
) -> Figure:
    """Images (first row) and, per named map, its weights over each image.

    Args:
        images: uint8 ``(N, H, W, 3)`` (or ``(N, H, W)``) pixels.
        maps: ``(row name, weights (N, P) or (N, g, g))`` pairs; each image's map is scaled to
            its own maximum.
        titles: one caption per image (e.g. "true / predicted").

    Raises:
        ValueError: for maps whose image count or grid does not fit the images.
    """
    pixels = np.asarray(images)
    n, H, W = pixels.shape[:3]
    grids = [(name, _grid(w)) for name, w in maps]
    for name, g in grids:
        if len(g) != n or H % g.shape[1] or W % g.shape[2]:
            raise ValueError(f"map {name!r} of shape {g.shape} does not fit {n} images of {H}x{W}")
    rows = 1 + len(grids)
    fig = new_figure(1.6 * n + 0.8, 1.7 * rows + 0.3)
    axes = np.asarray(fig.subplots(rows, n, squeeze=False))
    for j in range(n):
        axes[0, j].imshow(pixels[j], cmap=None if pixels.ndim == 4 else "gray")
        if titles is not None:
            axes[0, j].set_title(titles[j], fontsize=7)
        for i, (name, g) in enumerate(grids, start=1):
            up = np.kron(g[j], np.ones((H // g.shape[1], W // g.shape[2])))  # (H, W)
            axes[i, j].imshow(pixels[j], cmap=None if pixels.ndim == 4 else "gray")
            axes[i, j].imshow(
                up / max(up.max(), 1e-12),
                cmap="inferno",
                alpha=0.6,
                vmin=0,
                vmax=1,
                interpolation="nearest",
            )
            if j == 0:
                axes[i, j].set_ylabel(name, fontsize=7)
    for ax in axes.flat:
        ax.set_xticks([])
        ax.set_yticks([])
    if title:
        fig.suptitle(title, fontsize=9)
    if path is not None:
        save_figure(fig, path)
    return fig


__all__ = ["plot_patch_attention"]
