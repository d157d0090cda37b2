"""Small image data sets held in memory: arrays with a seeded split, and scikit-learn's digits.

- :class:`ArrayImageDataset`: images ``(N, C, H, W)`` and labels ``(N,)`` with a seeded
  train/val/test split, normalised with the train split's statistics; batches are drawn with an
  explicit ``torch.Generator`` (its state is the data position).
- :func:`load_digits`: scikit-learn's bundled 8x8 digits.

CIFAR-10, kept as uint8 and normalised per batch, is :mod:`attnlab.data.cifar10`.

Shapes: B batch, N examples, C channels, H x W pixels.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor

from attnlab.data.common import Split


class ArrayImageDataset:
    """Images and integer labels held in memory, split once by a seeded shuffle.

    The first ``test_fraction`` of a seeded permutation is the held-out ``"test"`` split; with
    ``val_fraction > 0`` the next ``val_fraction`` of what remains is the ``"val"`` split
    (evaluated during training, used to choose hyperparameters) and the rest is ``"train"``. With
    ``val_fraction == 0`` there is no separate validation split: ``"val"`` and ``"test"`` are the
    same held-out images (the behaviour before the split was added).

    Args:
        images: ``(N, C, H, W)`` (or ``(N, H, W)``, given one channel), any real dtype.
        labels: ``(N,)`` class ids in ``[0, n_classes)``.
        test_fraction: fraction of all images held out as the ``"test"`` split, in (0, 1).
        val_fraction: fraction of the remaining images held out as ``"val"``, in [0, 1).
        seed: seeds the split.
        normalize: scale each image channel to zero mean, unit variance using train statistics.

    Attributes:
        mean, std: ``(1, C, 1, 1)`` the train statistics the images were normalised with (0 and
            1 without ``normalize``).

    Raises:
        ValueError: for mismatched lengths, a bad rank, or a fraction out of range.
    """

    def __init__(
        self,
        images: Tensor | np.ndarray,
        labels: Tensor | np.ndarray,
        *,
        test_fraction: float = 0.2,
        val_fraction: float = 0.0,
        seed: int = 0,
        normalize: bool = True,
    ) -> None:
        x = torch.as_tensor(np.asarray(images), dtype=torch.float32)
        y = torch.as_tensor(np.asarray(labels), dtype=torch.int64)
        if x.ndim == 3:
            x = x[:, None]  # (N, 1, H, W)
        if x.ndim != 4 or y.ndim != 1 or len(x) != len(y):
            raise ValueError(
                f"need images (N, C, H, W) and labels (N,), got {tuple(x.shape)}, {tuple(y.shape)}"
            )
        if not 0.0 < test_fraction < 1.0:
            raise ValueError(f"test_fraction must be in (0, 1), got {test_fraction}")
        if not 0.0 <= val_fraction < 1.0:
            raise ValueError(f"val_fraction must be in [0, 1), got {val_fraction}")
        order = torch.randperm(len(x), generator=torch.Generator().manual_seed(seed))
        n_test = max(1, round(len(x) * test_fraction))
        test, rest = order[:n_test], order[n_test:]
        n_val = round(len(rest) * val_fraction) if val_fraction > 0 else 0
        if val_fraction > 0 and not 0 < n_val < len(rest):
            raise ValueError(
                f"val_fraction={val_fraction} leaves no validation or no training images "
                f"out of {len(rest)}"
            )
        val, train = (rest[:n_val], rest[n_val:]) if n_val else (test, rest)
        # (1, C, 1, 1): the train split's statistics (0 and 1 without normalize), so a caller
        # can prepare a new image the way the split's images were (attnlab explore does)
        self.mean = torch.zeros(1, x.shape[1], 1, 1)
        self.std = torch.ones(1, x.shape[1], 1, 1)
        if normalize:
            self.mean = x[train].mean(dim=(0, 2, 3), keepdim=True)
            self.std = x[train].std(dim=(0, 2, 3), keepdim=True).clamp_min(1e-6)
            x = (x - self.mean) / self.std
        self.n_classes = int(y.max()) + 1
        self.splits: dict[str, tuple[Tensor, Tensor]] = {
            "train": (x[train], y[train]),
            "val": (x[val], y[val]),
            "test": (x[test], y[test]),
        }

    @property
    def image_shape(self) -> tuple[int, int, int]:
        """``(C, H, W)``."""
        c, h, w = self.splits["train"][0].shape[1:]
        return int(c), int(h), int(w)

    def split(self, split: Split) -> tuple[Tensor, Tensor]:
        """``(images, labels)`` of ``split`` (``"train"``, ``"val"`` or ``"test"``)."""
        if split not in self.splits:
            raise ValueError(f"split={split!r} is not valid; choose one of {list(self.splits)}")
        return self.splits[split]

    def batch(
        self, split: Split, batch_size: int, generator: torch.Generator
    ) -> tuple[Tensor, Tensor]:
        """``batch_size`` random examples (with replacement): ``(B, C, H, W)``, ``(B,)``."""
        x, y = self.split(split)
        index = torch.randint(len(x), (batch_size,), generator=generator)
        return x[index], y[index]


def load_digits() -> tuple[np.ndarray, np.ndarray]:
    """scikit-learn's bundled 8x8 digits (1,797 images, values 0-16): ``(N, 8, 8)``, ``(N,)``.

    Raises:
        ImportError: without scikit-learn (``pip install scikit-learn``).
    """
    from sklearn.datasets import load_digits as sk_load_digits

    bunch = sk_load_digits()
    return np.asarray(bunch.images), np.asarray(bunch.target)


__all__ = ["ArrayImageDataset", "load_digits"]
