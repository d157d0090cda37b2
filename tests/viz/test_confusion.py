"""The confusion-matrix and patch-attention pictures: the data drawn is the data given."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from attnlab.viz.confusion import confusion_rates, plot_confusion
from attnlab.viz.patch_attention import plot_patch_attention


def test_confusion_rates_normalise_rows() -> None:
    rates = confusion_rates([[3, 1], [0, 0]])
    assert rates.tolist() == [[0.75, 0.25], [0.0, 0.0]]
    with pytest.raises(ValueError, match="square"):
        confusion_rates([[1, 2, 3]])


@pytest.mark.usefixtures("mpl")
def test_plot_confusion_draws_the_rates(tmp_path: Path, check_png: Callable[..., None]) -> None:
    counts = np.array([[8, 2, 0], [1, 9, 0], [0, 5, 5]])
    fig = plot_confusion(counts, ["a", "b", "c"], title="t", path=tmp_path / "cm.png")
    check_png(tmp_path / "cm.png", fig)
    ax = fig.axes[0]
    np.testing.assert_allclose(ax.images[0].get_array(), confusion_rates(counts))
    assert "accuracy 73.33%" in ax.get_title()
    with pytest.raises(ValueError, match="2 class names"):
        plot_confusion(counts, ["a", "b"])


@pytest.mark.usefixtures("mpl")
def test_plot_patch_attention_stretches_each_patch(tmp_path: Path) -> None:
    images = np.zeros((2, 8, 8, 3), dtype=np.uint8)
    weights = np.arange(8.0).reshape(2, 4)  # (N, P): a 2x2 grid per image
    fig = plot_patch_attention(images, [("w", weights)], titles=["x", "y"], path=tmp_path / "a")
    overlay = np.asarray(fig.axes[2].images[1].get_array())  # row 1, image 0
    assert overlay.shape == (8, 8) and overlay[0, 0] == 0.0 and overlay[7, 7] == 1.0
    assert (tmp_path / "a.png").is_file()
    with pytest.raises(ValueError, match="square grid"):
        plot_patch_attention(images, [("w", np.ones((2, 3)))])
