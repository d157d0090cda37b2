"""Training data: Tiny Shakespeare, token streams cut into random blocks, and image arrays.

Every dataset samples with an explicit ``torch.Generator``: the generator's state *is* the data
position, so a checkpoint that stores it resumes the exact same batch sequence.

- :func:`find_data_file` looks a data set up offline first: in ``$ATTNLAB_DATA``, then in
  ``../shared/data`` beside a source checkout of attnlab, then in ``~/.cache/attnlab``;
  :func:`load_text` reads a text file from a path, or finds Tiny Shakespeare that way and only
  then downloads it (into the cache), saying where to put the file when it cannot.
- :class:`TokenStream`: a 1-D id tensor split into train (first ``1 - val_fraction``) and val
  (the rest); :meth:`TokenStream.blocks` draws random contiguous blocks ``(B, T + 1)``, from
  which a language model reads ``x = block[:, :-1]`` and ``y = block[:, 1:]``.
- :class:`ArrayImageDataset`: images ``(N, C, H, W)`` and labels ``(N,)`` with a seeded
  train/test split, and :func:`load_digits` for scikit-learn's bundled 8x8 digits.
- :func:`shard_batch`: one process's rows of a batch in data-parallel training. Every process
  draws the same *global* batch from an identically seeded generator and keeps its own
  contiguous slice, so the processes see disjoint parts of each batch and together exactly the
  examples a single process would see (the data position stays one generator state).

Shapes: B batch, T block length, N examples, C channels, H x W pixels.
"""

from __future__ import annotations

import hashlib
import logging
import os
import urllib.request
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch
from torch import Tensor

from attnlab.io import atomic_write_bytes, data_dirs, find_data_file, read_text

Split = Literal["train", "val", "test"]

logger = logging.getLogger(__name__)

TINY_SHAKESPEARE_URL = (
    "https://raw.githubusercontent.com/karpathy/char-rnn/master/data/tinyshakespeare/input.txt"
)
TINY_SHAKESPEARE_SHA256 = "86c4e6aa9db7c042ec79f339dcb96d42b0075e16b8fc2e86bf0ca57e2dc565ed"
TINY_SHAKESPEARE = "tinyshakespeare.txt"


def data_dir() -> Path:
    """Where downloads are cached: ``$ATTNLAB_DATA`` if set, else ``~/.cache/attnlab``."""
    env = os.environ.get("ATTNLAB_DATA")
    return Path(env) if env else Path.home() / ".cache" / "attnlab"


def load_text(
    path: str | os.PathLike[str] | None = None, *, download: bool = True
) -> tuple[str, Path]:
    """``(text, file)``: the text of ``path``, or of Tiny Shakespeare when ``path`` is ``None``.

    Without a path the file ``tinyshakespeare.txt`` is looked up in :func:`data_dirs`; if it is
    in none of them and ``download`` is true it is fetched from its public URL, checked against
    its sha256 and cached in :func:`data_dir`.

    Raises:
        FileNotFoundError: if the file is missing and cannot be downloaded (the message names
            the folders searched and the options that point elsewhere).
        IsADirectoryError: for a directory where a text file is expected.
        ValueError: for a file that is not UTF-8 text, or a download that does not match the
            expected checksum.
    """
    if path is not None:
        return read_text(path, what="text file"), Path(path)
    file = find_data_file(TINY_SHAKESPEARE)
    if file is None:
        searched = ", ".join(str(d) for d in data_dirs())
        hint = (
            f"put {TINY_SHAKESPEARE} in one of {searched} (or set ATTNLAB_DATA=DIR), or pass "
            "--data=FILE for another text"
        )
        if not download:
            raise FileNotFoundError(f"{TINY_SHAKESPEARE} is not in the data folders: {hint}")
        file = data_dir() / TINY_SHAKESPEARE
        _download(TINY_SHAKESPEARE_URL, file, TINY_SHAKESPEARE_SHA256, hint=hint)
    return read_text(file, what="text file"), file


def _download(url: str, file: Path, sha256: str, *, hint: str = "") -> None:
    logger.info("downloading %s -> %s", url, file)
    try:
        with urllib.request.urlopen(url, timeout=60) as response:
            payload = response.read()
    except OSError as e:
        raise FileNotFoundError(
            f"{file.name} is not in the data folders and {url} could not be fetched ({e}); " + hint
        ) from None
    digest = hashlib.sha256(payload).hexdigest()
    if digest != sha256:
        raise ValueError(f"{url}: sha256 {digest} does not match the expected {sha256}")
    atomic_write_bytes(file, payload)


class TokenStream:
    """A token-id sequence with a train/val split, sampled as random contiguous blocks.

    Args:
        ids: the whole corpus as ids ``(N,)``.
        val_fraction: the last fraction of ``ids`` held out for validation (nanoGPT's 10%).

    Raises:
        ValueError: for a fraction outside (0, 1) or a corpus too short to split.
    """

    def __init__(self, ids: Tensor | list[int], *, val_fraction: float = 0.1) -> None:
        ids = torch.as_tensor(ids, dtype=torch.int64)
        if ids.ndim != 1:
            raise ValueError(f"ids must be 1-D, got shape {tuple(ids.shape)}")
        if not 0.0 < val_fraction < 1.0:
            raise ValueError(f"val_fraction must be in (0, 1), got {val_fraction}")
        n_train = int(len(ids) * (1.0 - val_fraction))
        if n_train < 2 or len(ids) - n_train < 2:
            raise ValueError(f"{len(ids)} tokens are too few to split with {val_fraction=}")
        self.splits: dict[str, Tensor] = {"train": ids[:n_train], "val": ids[n_train:]}

    def __len__(self) -> int:
        return sum(len(s) for s in self.splits.values())

    def split(self, split: Split) -> Tensor:
        """The ids of ``split`` (``"train"`` or ``"val"``)."""
        if split not in self.splits:
            raise ValueError(f"split={split!r} is not valid; choose one of {list(self.splits)}")
        return self.splits[split]

    def blocks(
        self, split: Split, batch_size: int, length: int, generator: torch.Generator
    ) -> Tensor:
        """``batch_size`` random contiguous windows of ``length`` ids, ``(B, length)``.

        Raises:
            ValueError: if ``split`` is shorter than ``length``.
        """
        data = self.split(split)
        if len(data) < length:
            raise ValueError(f"the {split} split has {len(data)} tokens, fewer than {length}")
        starts = torch.randint(len(data) - length + 1, (batch_size,), generator=generator)
        index = starts[:, None] + torch.arange(length)  # (B, length)
        return data[index]


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


def shard_batch(batch: Any, rank: int, world_size: int) -> Any:
    """Rank ``rank``'s slice of ``batch`` out of ``world_size`` equal, contiguous slices.

    ``batch`` is a tensor ``(B, ...)`` or a tuple/list/dict of them (every tensor sliced along
    its first dimension); the result has the same structure with ``B / world_size`` rows.

    Raises:
        ValueError: for a rank outside ``[0, world_size)``, or a ``B`` that ``world_size`` does
            not divide.
        TypeError: for a leaf that is not a tensor.
    """
    if world_size < 1 or not 0 <= rank < world_size:
        raise ValueError(f"rank must be in [0, world_size), got rank={rank}, {world_size=}")
    if world_size == 1:
        return batch
    if isinstance(batch, Tensor):
        rows = batch.shape[0] if batch.ndim else 0
        if rows == 0 or rows % world_size:
            raise ValueError(
                f"a batch of {rows} rows cannot be split evenly over {world_size} processes "
                f"(shape {tuple(batch.shape)})"
            )
        per = rows // world_size
        return batch[rank * per : (rank + 1) * per]
    if isinstance(batch, tuple | list):
        items = [shard_batch(b, rank, world_size) for b in batch]
        if isinstance(batch, tuple) and hasattr(batch, "_fields"):  # a NamedTuple
            return type(batch)(*items)
        return type(batch)(items)
    if isinstance(batch, Mapping):
        return {k: shard_batch(v, rank, world_size) for k, v in batch.items()}
    raise TypeError(f"cannot shard a batch leaf of type {type(batch).__name__}; expected tensors")


def load_digits() -> tuple[np.ndarray, np.ndarray]:
    """scikit-learn's bundled 8x8 digits (1,797 images, values 0-16): ``(N, 8, 8)``, ``(N,)``.

    Raises:
        ImportError: without scikit-learn (``pip install scikit-learn``).
    """
    from sklearn.datasets import load_digits as sk_load_digits

    bunch = sk_load_digits()
    return np.asarray(bunch.images), np.asarray(bunch.target)


__all__ = [
    "TINY_SHAKESPEARE_URL",
    "ArrayImageDataset",
    "Split",
    "TokenStream",
    "data_dir",
    "data_dirs",
    "find_data_file",
    "load_digits",
    "load_text",
    "shard_batch",
]
