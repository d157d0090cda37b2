"""Text corpora: Tiny Shakespeare, and token streams cut into random contiguous blocks.

Every stream samples with an explicit ``torch.Generator``: the generator's state *is* the data
position, so a checkpoint that stores it resumes the exact same batch sequence.

- :func:`load_text` reads a text file from a path, or looks Tiny Shakespeare up offline first
  (:func:`attnlab.io.find_data_file`: in ``$ATTNLAB_DATA``, then in ``../shared/data`` beside a
  source checkout of attnlab, then in ``~/.cache/attnlab``) and only then downloads it (into
  :func:`~attnlab.data.common.data_dir`), saying where to put the file when it cannot.
- :class:`TokenStream`: a 1-D id tensor split into train (first ``1 - val_fraction``) and val
  (the rest); :meth:`TokenStream.blocks` draws random contiguous blocks ``(B, T + 1)``, from
  which a language model reads ``x = block[:, :-1]`` and ``y = block[:, 1:]``.

Shapes: B batch, T block length, N tokens.
"""

from __future__ import annotations

import hashlib
import logging
import os
import urllib.request
from pathlib import Path

import torch
from torch import Tensor

from attnlab.data.common import Split, data_dir
from attnlab.io import atomic_write_bytes, data_dirs, find_data_file, read_text

logger = logging.getLogger(__name__)

TINY_SHAKESPEARE_URL = (
    "https://raw.githubusercontent.com/karpathy/char-rnn/master/data/tinyshakespeare/input.txt"
)
TINY_SHAKESPEARE_SHA256 = "86c4e6aa9db7c042ec79f339dcb96d42b0075e16b8fc2e86bf0ca57e2dc565ed"
TINY_SHAKESPEARE = "tinyshakespeare.txt"


def load_text(
    path: str | os.PathLike[str] | None = None, *, download: bool = True
) -> tuple[str, Path]:
    """``(text, file)``: the text of ``path``, or of Tiny Shakespeare when ``path`` is ``None``.

    Without a path the file ``tinyshakespeare.txt`` is looked up in :func:`attnlab.io.data_dirs`;
    if it is in none of them and ``download`` is true it is fetched from its public URL, checked
    against its sha256 and cached in :func:`~attnlab.data.common.data_dir`.

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


__all__ = [
    "TINY_SHAKESPEARE",
    "TINY_SHAKESPEARE_SHA256",
    "TINY_SHAKESPEARE_URL",
    "TokenStream",
    "load_text",
]
