"""Image arrays in memory: the seeded train/val/test split and the train-statistics
normalisation."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from attnlab.data.images import ArrayImageDataset


def test_array_image_dataset_split_and_normalisation() -> None:
    images = np.random.default_rng(0).random((50, 8, 8)) * 16
    labels = np.arange(50) % 10
    data = ArrayImageDataset(images, labels, test_fraction=0.2, seed=0)
    x_train, _ = data.split("train")
    x_test, _ = data.split("val")
    assert x_train.shape == (40, 1, 8, 8) and x_test.shape == (10, 1, 8, 8)
    assert data.n_classes == 10 and data.image_shape == (1, 8, 8)
    assert abs(float(x_train.mean())) < 1e-5
    xb, yb = data.batch("train", 7, torch.Generator().manual_seed(0))
    assert xb.shape == (7, 1, 8, 8) and yb.shape == (7,)
    with pytest.raises(ValueError, match="need images"):
        ArrayImageDataset(images, labels[:3])


def test_image_dataset_three_way_split_is_disjoint_and_keeps_the_test_split() -> None:
    images = torch.arange(100, dtype=torch.float32).reshape(100, 1, 1, 1).expand(100, 1, 2, 2)
    labels = torch.arange(100) % 10
    plain = ArrayImageDataset(images, labels, test_fraction=0.2, seed=3, normalize=False)
    three = ArrayImageDataset(
        images, labels, test_fraction=0.2, val_fraction=0.25, seed=3, normalize=False
    )
    names = ("train", "val", "test")
    ids = {name: set(three.split(name)[0][:, 0, 0, 0].tolist()) for name in names}
    assert [len(ids[n]) for n in names] == [60, 20, 20]
    assert ids["train"] | ids["val"] | ids["test"] == set(range(100))
    assert not (ids["train"] & ids["val"] or ids["train"] & ids["test"] or ids["val"] & ids["test"])
    # the test split does not depend on whether a validation split is carved out
    assert torch.equal(plain.split("test")[0], three.split("test")[0])
    assert torch.equal(plain.split("val")[0], plain.split("test")[0])
    with pytest.raises(ValueError, match="val_fraction must be in"):
        ArrayImageDataset(images, labels, val_fraction=1.0)
