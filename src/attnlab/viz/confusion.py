"""A classifier's confusion matrix as a picture: rows the true class, columns the prediction.

:func:`plot_confusion` draws counts or row-normalised rates (each row sums to 1: the diagonal is
each class's recall) with the value written in every cell, the class names on both axes and the
overall accuracy in the title. The matrix itself comes from
:func:`attnlab.training.image_objective.confusion_matrix` (or any ``(K, K)`` array).

Shapes: K classes.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from attnlab.viz._mpl import heatmap, new_figure, save_figure

if TYPE_CHECKING:
    from matplotlib.figure import Figure


def confusion_rates(matrix: Any) -> np.ndarray:
    """Row-normalised ``(K, K)`` rates (a row without examples stays 0)."""
    m = np.asarray(matrix, dtype=np.float64)
    if m.ndim != 2 or m.shape[0] != m.shape[1]:
        raise ValueError(f"a confusion matrix must be square (K, K), got shape {m.shape}")
    totals = m.sum(axis=1, keepdims=True)
    return np.divide(m, totals, out=np.zeros_like(m), where=totals > 0)


def plot_confusion(
    matrix: Any,
    classes: Sequence[str],
    *,
    normalize: bool = True,
    title: str = "",
    path: str | os.PathLike[str] | None = None,
) -> Figure:
    """Heatmap of a ``(K, K)`` confusion matrix (rows true, columns predicted).

    Args:
        matrix: counts, e.g. a tensor from ``confusion_matrix``.
        classes: the K class names, in label order.
        normalize: show row rates (recall on the diagonal) instead of counts.
        title: prefixed to the accuracy in the title.
        path: where to save the figure (PNG by default).

    Raises:
        ValueError: for a matrix that is not square or names that do not match it.
    """
    counts = np.asarray(matrix, dtype=np.float64)
    values = confusion_rates(counts) if normalize else counts
    if len(classes) != len(values):
        raise ValueError(f"{len(classes)} class names for a {len(values)}-class matrix")
    accuracy = np.trace(counts) / max(counts.sum(), 1.0)
    fig = new_figure(6.5, 5.8)
    ax = fig.subplots()
    image = heatmap(
        ax,
        values,
        x_labels=list(classes),
        y_labels=list(classes),
        cmap="Blues",
        vmin=0.0,
        vmax=1.0 if normalize else None,
        aspect="equal",
    )
    top = values.max() if values.size else 0.0
    for (i, j), v in np.ndenumerate(values):
        text = f"{v:.2f}" if normalize else f"{int(v)}"
        ax.text(
            j,
            i,
            text,
            ha="center",
            va="center",
            fontsize=7,
            color="white" if v > 0.6 * top else "black",
        )
    ax.set(xlabel="predicted", ylabel="true")
    ax.set_title(f"{title + ': ' if title else ''}accuracy {accuracy:.2%}", fontsize=10)
    fig.colorbar(
        image, ax=ax, shrink=0.8, label="fraction of the true class" if normalize else "images"
    )
    if path is not None:
        save_figure(fig, path)
    return fig


__all__ = ["confusion_rates", "plot_confusion"]
