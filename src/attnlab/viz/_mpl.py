"""Matplotlib plumbing shared by the plots: lazy import, figures, heatmaps, saving.

matplotlib is an optional extra (``pip install attnlab[viz]``). It is imported only when a plot is
drawn, and never through ``pyplot``: figures are plain :class:`matplotlib.figure.Figure` objects,
rendered by the headless Agg canvas when saved, so plotting works on a server without a display,
never changes the user's backend, and leaves no figures open in ``pyplot``'s global registry.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure
    from matplotlib.image import AxesImage

DPI = 110


def require_matplotlib() -> Any:
    """The ``matplotlib`` module, or an ``ImportError`` that says how to install it."""
    try:
        import matplotlib
    except ImportError as e:  # pragma: no cover - depends on the environment
        raise ImportError(
            "attnlab.viz needs matplotlib: pip install 'attnlab[viz]' (or pip install matplotlib)"
        ) from e
    return matplotlib


def new_figure(width: float, height: float) -> Figure:
    """A figure of ``width x height`` inches with the constrained layout (no pyplot)."""
    require_matplotlib()
    from matplotlib.figure import Figure

    return Figure(figsize=(width, height), layout="constrained")


def save_figure(fig: Figure, path: str | os.PathLike[str], *, dpi: int = DPI) -> Path:
    """Write ``fig`` to ``path`` (format from the suffix, PNG by default), creating parents.

    Returns:
        The path written.
    """
    out = Path(path)
    if out.suffix == "":
        out = out.with_suffix(".png")
    out.parent.mkdir(parents=True, exist_ok=True)
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    FigureCanvasAgg(fig)  # the headless raster canvas, whatever pyplot's backend is
    fig.savefig(out, dpi=dpi)
    return out


def label_fontsize(n: int, *, panel_inches: float = 3.0) -> float:
    """A tick-label font size that fits ``n`` labels along ``panel_inches``."""
    return float(max(4.0, min(10.0, panel_inches * 72 / max(n, 1) * 0.8)))


def heatmap(
    ax: Axes,
    data: Any,
    *,
    x_labels: Sequence[str] | None = None,
    y_labels: Sequence[str] | None = None,
    cmap: str = "viridis",
    vmin: float | None = None,
    vmax: float | None = None,
    fontsize: float | None = None,
    show_x: bool = True,
    show_y: bool = True,
    aspect: Literal["equal", "auto"] | float = "auto",
) -> AxesImage:
    """Draw a 2-D array as an image (row 0 at the top) with optional text tick labels.

    The array is drawn as given (no resampling: ``interpolation="nearest"``), so the image data
    of the returned ``AxesImage`` equals ``data``.
    """
    image = ax.imshow(data, cmap=cmap, vmin=vmin, vmax=vmax, interpolation="nearest", aspect=aspect)
    rows, cols = image.get_array().shape[:2]  # type: ignore[union-attr]
    for labels, n, axis, show in (
        (x_labels, cols, "x", show_x),
        (y_labels, rows, "y", show_y),
    ):
        if labels is None:
            continue
        if len(labels) != n:
            raise ValueError(f"{len(labels)} {axis} labels for {n} {axis} cells")
        size = fontsize if fontsize is not None else label_fontsize(n)
        if axis == "x":
            ax.set_xticks(range(n), labels if show else [""] * n, rotation=90, fontsize=size)
        else:
            ax.set_yticks(range(n), labels if show else [""] * n, fontsize=size)
    return image
