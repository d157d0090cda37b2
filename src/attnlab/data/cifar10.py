"""CIFAR-10 (Krizhevsky 2009): the arrays, their checksums, a stratified validation split.

50,000 training and 10,000 test colour images of 32x32 pixels in 10 classes (5,000 / 1,000 per
class). :func:`load_cifar10` reads ``train.npz`` and ``test.npz`` (``images`` uint8
``(N, 32, 32, 3)`` RGB, ``labels`` uint8 ``(N,)``) from the first directory that has them:

1. the ``path`` argument;
2. ``cifar10/`` in each data folder (:func:`attnlab.io.data_dirs`): ``$ATTNLAB_DATA``,
   ``../shared/data`` beside the source checkout (the project's offline copy),
   ``~/.cache/attnlab``. When none has the files and ``download`` is true,
   :func:`~attnlab.data.cifar10_download.download_cifar10` converts the official archive
   into :func:`attnlab.data.common.data_dir` ``/cifar10`` (``$ATTNLAB_DATA``, else the cache).

Checksums: every load hashes both files (sha256) and accepts either the project's copy (the
hashes of ``../shared/data/README.md``: a JPEG re-encoding of CIFAR-10, reported as
"CIFAR-10 (JPEG copy)") or the files a download wrote (their hashes are recorded in
``SHA256SUMS`` next to them, reported as "CIFAR-10"). Hashing is not cached on disk: it costs
0.25 s for the 142 MB training file on this machine's SHA extensions, against 1.4 s to inflate
the compressed arrays, so a stamp file would save little and could go stale; within one process a
file already verified (same path, size and mtime) is not hashed again.

:class:`Cifar10` holds the splits as uint8 tensors ``(N, C, H, W)`` in memory (150 MB for the
training images) and converts only the images of a batch to float, normalised with the
per-channel mean and standard deviation of the original training set (:meth:`Cifar10.normalize`).
The ``"val"`` split is carved from the training set: ``n_val`` images, the same number from every
class (stratified), chosen by a seeded permutation; ``"train"`` is the rest; ``"test"`` is the
official test set, to be scored once.

Shapes: N images, B batch, C channels (3), H = W = 32 pixels.
"""

from __future__ import annotations

import os
import zipfile
import zlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from attnlab.data.cifar10_download import FILES, MANIFEST, download_cifar10, sha256_file
from attnlab.data.common import Split, data_dir
from attnlab.io import data_dirs

CLASSES = (
    "airplane",
    "automobile",
    "bird",
    "cat",
    "deer",
    "dog",
    "frog",
    "horse",
    "ship",
    "truck",
)
# Per-channel statistics of the original training set, pixel values scaled to [0, 1]. The JPEG
# copy's are within 0.002 of them (tests/data/test_cifar10.py checks it).
MEAN = (0.4914, 0.4822, 0.4465)
STD = (0.2470, 0.2435, 0.2616)
# sha256 of the project's copy (../shared/data/README.md), decoded from a JPEG re-encoding.
JPEG_COPY_SHA256 = {
    "train.npz": "982a4911be53ca5dd3093f373b598c6ab793139c7cb240a07c2129e52f97ed16",
    "test.npz": "51b738f4f96bf38e77295b2730660cb23ba54fbcdacec0dca22eff776d379ae5",
}
JPEG_COPY = "CIFAR-10 (JPEG copy)"
ORIGINAL = "CIFAR-10"
SUBDIR = "cifar10"

_verified: dict[tuple[str, int, int], str] = {}  # (path, size, mtime_ns) -> sha256


def candidate_dirs(path: str | os.PathLike[str] | None = None) -> list[Path]:
    """The directories :func:`load_cifar10` looks in, in order (see the module docstring):
    ``path``, else ``cifar10/`` in each of :func:`attnlab.io.data_dirs`."""
    if path is not None:
        return [Path(path)]
    return [d / SUBDIR for d in data_dirs()]


def find_cifar10(path: str | os.PathLike[str] | None = None) -> Path | None:
    """The first candidate directory holding both ``train.npz`` and ``test.npz``, or ``None``."""
    for directory in candidate_dirs(path):
        if all((directory / name).is_file() for name in FILES):
            return directory
    return None


def read_manifest(directory: Path) -> dict[str, str]:
    """``{file name: sha256}`` of ``directory/SHA256SUMS`` (empty when there is none)."""
    file = directory / MANIFEST
    if not file.is_file():
        return {}
    out = {}
    for line in file.read_text(encoding="utf-8").splitlines():
        parts = line.split()
        if len(parts) == 2 and not line.startswith("#"):
            out[parts[1]] = parts[0]
    return out


def verify_cifar10(directory: str | os.PathLike[str]) -> str:
    """Check both files' sha256; returns the copy's name (:data:`JPEG_COPY` or :data:`ORIGINAL`).

    Raises:
        ValueError: if a file matches neither the project's copy nor the download's manifest.
    """
    directory = Path(directory)
    manifest = read_manifest(directory)
    sources = set()
    for name in FILES:
        file = directory / name
        stat = file.stat()
        key = (str(file.resolve()), stat.st_size, stat.st_mtime_ns)
        digest = _verified.get(key) or sha256_file(file)
        if digest == JPEG_COPY_SHA256[name]:
            sources.add(JPEG_COPY)
        elif manifest.get(name) == digest:
            sources.add(ORIGINAL)
        else:
            expected = [JPEG_COPY_SHA256[name]] + ([manifest[name]] if name in manifest else [])
            raise ValueError(
                f"{file}: sha256 {digest} matches none of the known CIFAR-10 files {expected} "
                "(a damaged or different file; delete it to download the original again)"
            )
        _verified[key] = digest
    if len(sources) != 1:
        raise ValueError(f"{directory}: train.npz and test.npz come from different copies")
    return sources.pop()


@dataclass(frozen=True)
class Cifar10Arrays:
    """The raw arrays: images uint8 ``(N, 32, 32, 3)``, labels uint8 ``(N,)``; and their copy."""

    train_images: np.ndarray
    train_labels: np.ndarray
    test_images: np.ndarray
    test_labels: np.ndarray
    source: str  # JPEG_COPY or ORIGINAL: say it next to every accuracy


def _read_npz(file: Path) -> tuple[np.ndarray, np.ndarray]:
    """``images`` and ``labels`` of an ``.npz`` file, read member by member with
    ``allow_pickle=False`` (a file holding object arrays is refused, never unpickled)."""
    arrays = {}
    try:
        with zipfile.ZipFile(file) as z:
            for name in ("images", "labels"):
                with z.open(f"{name}.npy") as f:
                    arrays[name] = np.lib.format.read_array(f, allow_pickle=False)
    except (zipfile.BadZipFile, EOFError, KeyError, ValueError, zlib.error) as e:
        raise ValueError(
            f"{file} is not a readable CIFAR-10 .npz (arrays 'images' and 'labels'): {e}"
        ) from None
    images, labels = arrays["images"], arrays["labels"]
    if images.dtype != np.uint8 or images.ndim != 4 or images.shape[1:] != (32, 32, 3):
        raise ValueError(
            f"{file}: images must be uint8 (N, 32, 32, 3), got {images.dtype} {images.shape}"
        )
    if len(images) == 0:
        raise ValueError(f"{file} holds no images (N = 0); expected (N, 32, 32, 3) with N >= 1")
    return images, _check_labels(file, labels, len(images))


def _check_labels(file: Path, labels: np.ndarray, n: int) -> np.ndarray:
    """``labels`` as uint8 once they are ``n`` integers in ``[0, 10)``; otherwise a
    ``ValueError`` naming ``file`` and the first bad label (a float label, or -1 stored as
    int8, would otherwise be cast to another class without a word)."""
    K = len(CLASSES)
    if labels.shape != (n,):
        raise ValueError(
            f"{file}: labels must have shape ({n},), one per image, got {labels.shape}"
        )
    if not np.issubdtype(labels.dtype, np.integer):  # bool, float, strings...
        raise ValueError(f"{file}: labels must be integers in [0, {K}), got dtype {labels.dtype}")
    bad = np.flatnonzero((labels < 0) | (labels >= K))
    if len(bad):
        i = int(bad[0])
        raise ValueError(
            f"{file}: {len(bad)} label(s) outside [0, {K}) (the {K} classes), the first "
            f"{int(labels[i])} (image {i})"
        )
    return labels.astype(np.uint8)


def load_cifar10(
    path: str | os.PathLike[str] | None = None, *, download: bool = True, verify: bool = True
) -> Cifar10Arrays:
    """The CIFAR-10 arrays from ``path`` or the first candidate directory (module docstring).

    Args:
        path: a directory with ``train.npz`` and ``test.npz``.
        download: fetch and convert the official archive into ``data_dir()/cifar10`` when no
            directory has the files (never when ``path`` is given).
        verify: check the sha256 of both files (:func:`verify_cifar10`).

    Raises:
        FileNotFoundError: if no directory has the files and none may be downloaded.
        ValueError: for a checksum that matches no known copy, or malformed arrays.
    """
    directory = find_cifar10(path)
    if directory is None:
        looked = ", ".join(str(d) for d in candidate_dirs(path))
        if path is not None or not download:
            raise FileNotFoundError(
                f"no CIFAR-10 train.npz/test.npz in {looked} (set ATTNLAB_DATA or pass a path)"
            )
        directory = download_cifar10(data_dir() / SUBDIR)
    source = verify_cifar10(directory) if verify else _guess_source(directory)
    train_x, train_y = _read_npz(directory / "train.npz")
    test_x, test_y = _read_npz(directory / "test.npz")
    return Cifar10Arrays(train_x, train_y, test_x, test_y, source)


def _guess_source(directory: Path) -> str:
    return ORIGINAL if read_manifest(directory) else JPEG_COPY


def stratified_split(labels: Tensor, n_val: int, seed: int) -> tuple[Tensor, Tensor]:
    """Indices ``(train, val)``: ``n_val / K`` images of each of the K classes go to ``val``.

    Each class's images are ordered by one seeded permutation and the first of them held out;
    both index tensors are sorted.

    Raises:
        ValueError: if ``n_val`` is not a multiple of K or leaves a class without training images.
    """
    classes = torch.unique(labels)
    per_class, rest = divmod(n_val, len(classes))
    if rest or n_val < 0:
        raise ValueError(f"n_val={n_val} must be a non-negative multiple of {len(classes)} classes")
    order = torch.randperm(len(labels), generator=torch.Generator().manual_seed(seed))
    val = []
    for k in classes.tolist():
        members = order[labels[order] == k]  # this class, in permuted order
        if per_class >= len(members):
            raise ValueError(f"n_val={n_val} leaves class {k} with no training images")
        val.append(members[:per_class])
    val_index = torch.cat(val).sort().values
    keep = torch.ones(len(labels), dtype=torch.bool)
    keep[val_index] = False
    return keep.nonzero().squeeze(1), val_index


class Cifar10:
    """CIFAR-10 in memory as uint8 ``(N, C, H, W)``, split into train / val / test.

    Args:
        arrays: from :func:`load_cifar10` (or arrays of the same layout).
        n_val: training images held out, stratified (5,000: 500 per class); 0 for none.
        seed: seeds the held-out choice.

    Raises:
        ValueError: for an ``n_val`` that does not split evenly over the classes.
    """

    classes = CLASSES

    def __init__(self, arrays: Cifar10Arrays, *, n_val: int = 5000, seed: int = 0) -> None:
        self.source = arrays.source
        x = torch.from_numpy(arrays.train_images).permute(0, 3, 1, 2).contiguous()  # (N, C, H, W)
        y = torch.from_numpy(arrays.train_labels).long()
        test_x = torch.from_numpy(arrays.test_images).permute(0, 3, 1, 2).contiguous()
        self.splits: dict[str, tuple[Tensor, Tensor]] = {
            "test": (test_x, torch.from_numpy(arrays.test_labels).long())
        }
        if n_val:
            train, val = stratified_split(y, n_val, seed)
            self.splits["train"], self.splits["val"] = (x[train], y[train]), (x[val], y[val])
        else:
            self.splits["train"] = (x, y)
        self.n_classes = len(CLASSES)
        self._scale = 1.0 / (255.0 * torch.tensor(STD)).view(1, 3, 1, 1)  # (1, C, 1, 1)
        self._shift = (-torch.tensor(MEAN) / torch.tensor(STD)).view(1, 3, 1, 1)

    @classmethod
    def load(
        cls,
        path: str | os.PathLike[str] | None = None,
        *,
        n_val: int = 5000,
        seed: int = 0,
        download: bool = True,
    ) -> Cifar10:
        """:func:`load_cifar10` then the split (same arguments)."""
        return cls(load_cifar10(path, download=download), n_val=n_val, seed=seed)

    @property
    def image_shape(self) -> tuple[int, int, int]:
        """``(C, H, W)``."""
        c, h, w = self.splits["train"][0].shape[1:]
        return int(c), int(h), int(w)

    def split(self, split: Split) -> tuple[Tensor, Tensor]:
        """``(images uint8 (N, C, H, W), labels int64 (N,))`` of ``split``."""
        if split not in self.splits:
            raise ValueError(f"split={split!r} is not valid; choose one of {list(self.splits)}")
        return self.splits[split]

    def normalize(self, images: Tensor) -> Tensor:
        """uint8 (or float 0-255) images ``(B, C, H, W)`` -> float32, ``(x / 255 - mean) / std``
        per channel (a new tensor; the input is not modified)."""
        return torch.addcmul(self._shift, images.to(torch.float32), self._scale)

    def batch(
        self, split: Split, batch_size: int, generator: torch.Generator
    ) -> tuple[Tensor, Tensor]:
        """``batch_size`` random images of ``split`` (with replacement), normalised, no
        augmentation: ``(B, C, H, W)`` float32, ``(B,)``."""
        x, y = self.split(split)
        index = torch.randint(len(x), (batch_size,), generator=generator)
        return self.normalize(x[index]), y[index]

    def subset(self, per_class: dict[str, int]) -> Cifar10:
        """A copy keeping the first ``per_class[split]`` images of every class of each named
        split (for smoke runs); other splits are kept whole."""
        out = object.__new__(Cifar10)
        out.__dict__.update(self.__dict__)
        out.splits = dict(self.splits)
        for name, n in per_class.items():
            x, y = self.split(name)  # type: ignore[arg-type]
            keep = torch.cat([(y == k).nonzero().squeeze(1)[:n] for k in range(self.n_classes)])
            keep = keep.sort().values
            out.splits[name] = (x[keep], y[keep])
        return out


__all__ = [
    "CLASSES",
    "FILES",
    "JPEG_COPY",
    "JPEG_COPY_SHA256",
    "MANIFEST",
    "MEAN",
    "ORIGINAL",
    "STD",
    "Cifar10",
    "Cifar10Arrays",
    "candidate_dirs",
    "find_cifar10",
    "load_cifar10",
    "sha256_file",
    "stratified_split",
    "verify_cifar10",
]
