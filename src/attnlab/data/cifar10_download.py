"""Download the official CIFAR-10 archive and convert it to attnlab's arrays, without trusting it.

The archive is ``cifar-10-python.tar.gz`` from the dataset's page
(https://www.cs.toronto.edu/~kriz/cifar.html): 170,498,071 bytes, md5
``c58f30108f718f92721af3b95e74349a`` (published on that page) and sha256
``6d958be0...5c001ce`` (the value torchvision's and Keras's loaders check). Both are checked
while it streams to disk; nothing is read from it before they match.

Its batches (``data_batch_1`` ... ``data_batch_5``, ``test_batch``) are Python pickles, and
``pickle.load`` on a file from the network runs whatever callables the file names (a pickle can
ask for ``os.system``). They are read with :class:`RestrictedUnpickler`, which resolves only the
three globals a pickled numpy array needs (``numpy.core.multiarray._reconstruct``,
``numpy.ndarray``, ``numpy.dtype``) and refuses every other, so a tampered file fails with
``pickle.UnpicklingError`` instead of running code; the result is then checked to be exactly the
documented layout (a dict with a uint8 ``data`` array ``(10000, 3072)`` and a list of 10,000
integer ``labels``). The tar members are read by name into memory (no ``extractall``, so no path
in the archive decides where a file is written).

The rows of ``data`` are channel-major (1,024 red, then green, then blue values, each row-major),
so an image is ``row.reshape(3, 32, 32).transpose(1, 2, 0)`` in the ``(32, 32, 3)`` layout of
the project's copy. The result is written as ``train.npz`` / ``test.npz`` (plain arrays, loaded
with ``allow_pickle=False``) with their sha256 in ``SHA256SUMS``, so later loads verify them.
"""

from __future__ import annotations

import hashlib
import io
import logging
import os
import pickle
import tarfile
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from attnlab.io import atomic_write, atomic_write_text

logger = logging.getLogger(__name__)

FILES = ("train.npz", "test.npz")  # what a conversion writes, and what loading reads
MANIFEST = "SHA256SUMS"  # written by a download: "<sha256>  <file>" per line
URL = "https://www.cs.toronto.edu/~kriz/cifar-10-python.tar.gz"
ARCHIVE = "cifar-10-python.tar.gz"
ARCHIVE_MD5 = "c58f30108f718f92721af3b95e74349a"
ARCHIVE_SHA256 = "6d958be074577803d12ecdefd02955f39262c83c16fe9348329d7fe0b5c001ce"
TRAIN_BATCHES = tuple(f"data_batch_{i}" for i in range(1, 6))
TEST_BATCH = "test_batch"
BATCH_SIZE = 10000


def sha256_file(path: str | os.PathLike[str]) -> str:
    """The sha256 hex digest of a file, read in 1 MiB chunks."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _numpy_globals() -> dict[tuple[str, str], Any]:
    try:  # numpy >= 2 keeps the implementation in numpy._core
        from numpy._core.multiarray import _reconstruct
    except ImportError:  # pragma: no cover - numpy 1.x
        from numpy.core.multiarray import _reconstruct  # type: ignore[no-redef]
    allowed: dict[tuple[str, str], Any] = {
        ("numpy", "ndarray"): np.ndarray,
        ("numpy", "dtype"): np.dtype,
    }
    for module in ("numpy.core.multiarray", "numpy._core.multiarray"):
        allowed[(module, "_reconstruct")] = _reconstruct
    return allowed


class RestrictedUnpickler(pickle.Unpickler):
    """An unpickler that builds only plain containers, numbers, strings, bytes and numpy arrays.

    ``find_class`` is the only way a pickle reaches a callable; it answers the three numpy globals
    of an ``ndarray``'s pickle and raises ``pickle.UnpicklingError`` for everything else.
    """

    _ALLOWED = _numpy_globals()

    def find_class(self, module: str, name: str) -> Any:
        found = self._ALLOWED.get((module, name))
        if found is None:
            raise pickle.UnpicklingError(
                f"refusing to load global {module}.{name} from a CIFAR-10 batch (only numpy "
                "arrays are allowed)"
            )
        return found


def read_batch(payload: bytes) -> tuple[np.ndarray, np.ndarray]:
    """One pickled batch -> images uint8 ``(N, 32, 32, 3)`` and labels uint8 ``(N,)``.

    Raises:
        pickle.UnpicklingError: for a pickle naming any global but numpy's array pieces.
        ValueError: for content that is not the documented batch layout.
    """
    # the batches were written by Python 2: its str keys come back as bytes
    batch = RestrictedUnpickler(io.BytesIO(payload), encoding="bytes").load()
    if not isinstance(batch, dict) or b"data" not in batch or b"labels" not in batch:
        raise ValueError("a CIFAR-10 batch must be a dict with b'data' and b'labels'")
    data, labels = batch[b"data"], batch[b"labels"]
    if not (isinstance(data, np.ndarray) and data.dtype == np.uint8 and data.ndim == 2):
        raise ValueError(f"b'data' must be a uint8 (N, 3072) array, got {type(data).__name__}")
    if data.shape[1] != 3 * 32 * 32 or not isinstance(labels, list):
        raise ValueError(f"b'data' has shape {data.shape}; b'labels' must be a list")
    if len(labels) != len(data) or not all(type(v) is int and 0 <= v < 10 for v in labels):
        raise ValueError("b'labels' must hold one integer in [0, 10) per image")
    images = data.reshape(-1, 3, 32, 32).transpose(0, 2, 3, 1)  # (N, 32, 32, 3)
    return np.ascontiguousarray(images), np.asarray(labels, dtype=np.uint8)


def convert_archive(archive: str | os.PathLike[str]) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """``{"train": (images, labels), "test": (images, labels)}`` from the python-version archive.

    Raises:
        ValueError: for a missing batch or malformed content (see :func:`read_batch`).
    """
    members: dict[str, bytes] = {}
    with tarfile.open(archive, "r:gz") as tar:
        for member in tar.getmembers():
            base = member.name.rsplit("/", 1)[-1]
            if member.isfile() and base in (*TRAIN_BATCHES, TEST_BATCH):
                f = tar.extractfile(member)
                if f is not None:
                    members[base] = f.read()
    missing = [b for b in (*TRAIN_BATCHES, TEST_BATCH) if b not in members]
    if missing:
        raise ValueError(f"{archive} lacks the batches {missing}")
    train = [read_batch(members[b]) for b in TRAIN_BATCHES]
    return {
        "train": (np.concatenate([x for x, _ in train]), np.concatenate([y for _, y in train])),
        "test": read_batch(members[TEST_BATCH]),
    }


def fetch(url: str, file: Path, *, sha256: str, md5: str | None = None) -> Path:
    """Stream ``url`` to ``file`` (atomically, via a temporary file beside it), checking sha256
    (and md5) on the way.

    Raises:
        FileNotFoundError: if the URL cannot be fetched.
        ValueError: for a checksum mismatch (the partial file is removed).
    """
    digests = {"sha256": hashlib.sha256(), "md5": hashlib.md5(usedforsecurity=False)}
    logger.info("downloading %s -> %s", url, file)

    def write(tmp: str) -> None:  # a temporary file beside ``file``, removed if this raises
        try:
            with urllib.request.urlopen(url, timeout=60) as response, open(tmp, "wb") as out:
                for chunk in iter(lambda: response.read(1 << 20), b""):
                    for d in digests.values():
                        d.update(chunk)
                    out.write(chunk)
        except OSError as e:
            raise FileNotFoundError(f"{url} could not be fetched: {e}") from e
        for name, expected in (("sha256", sha256), ("md5", md5)):
            got = digests[name].hexdigest()
            if expected is not None and got != expected:
                raise ValueError(f"{url}: {name} {got} does not match the published {expected}")

    return atomic_write(file, write)


def _npz_writer(images: np.ndarray, labels: np.ndarray) -> Callable[[str], None]:
    def write(tmp: str) -> None:
        with open(tmp, "wb") as f:  # a file object: np.savez would append ".npz" to a name
            np.savez(f, images=images, labels=labels)

    return write


def download_cifar10(
    directory: str | os.PathLike[str],
    *,
    url: str = URL,
    sha256: str = ARCHIVE_SHA256,
    md5: str | None = ARCHIVE_MD5,
    keep_archive: bool = False,
) -> Path:
    """Fetch the official archive into ``directory``, convert it, write ``train.npz``,
    ``test.npz`` and ``SHA256SUMS``; returns ``directory``. An archive already there (checked
    again) is not downloaded twice.

    Raises:
        FileNotFoundError: if the archive cannot be fetched.
        ValueError: for a checksum mismatch or an archive that is not CIFAR-10's.
    """
    directory = Path(directory)
    archive = directory / ARCHIVE
    if not (archive.is_file() and sha256_file(archive) == sha256):
        fetch(url, archive, sha256=sha256, md5=md5)
    splits = convert_archive(archive)
    lines = []
    for name, split in zip(FILES, ("train", "test"), strict=True):
        images, labels = splits[split]
        atomic_write(directory / name, _npz_writer(images, labels))
        lines.append(f"{sha256_file(directory / name)}  {name}")
    atomic_write_text(
        directory / MANIFEST,
        f"# converted from {url} (sha256 {sha256})\n" + "\n".join(lines) + "\n",
    )
    if not keep_archive:
        archive.unlink()
    return directory


__all__ = [
    "ARCHIVE_MD5",
    "ARCHIVE_SHA256",
    "FILES",
    "MANIFEST",
    "URL",
    "RestrictedUnpickler",
    "convert_archive",
    "download_cifar10",
    "fetch",
    "read_batch",
    "sha256_file",
]
