"""Deprecated (issue 48): CIFAR-10 moved to :mod:`attnlab.data.cifar10`.

The names still resolve here for one release, with a ``DeprecationWarning`` naming the new path.
"""

from __future__ import annotations

from typing import Any

from attnlab.data import cifar10 as _cifar10
from attnlab.training._moved import Moved, moved

_MOVED: Moved = {
    "candidate_dirs": _cifar10,
    "Cifar10": _cifar10,
    "Cifar10Arrays": _cifar10,
    "CLASSES": _cifar10,
    "FILES": _cifar10,
    "find_cifar10": _cifar10,
    "JPEG_COPY": _cifar10,
    "JPEG_COPY_SHA256": _cifar10,
    "load_cifar10": _cifar10,
    "MANIFEST": _cifar10,
    "MEAN": _cifar10,
    "ORIGINAL": _cifar10,
    "read_manifest": _cifar10,
    "sha256_file": _cifar10,
    "STD": _cifar10,
    "stratified_split": _cifar10,
    "SUBDIR": _cifar10,
    "verify_cifar10": _cifar10,
}


def __getattr__(name: str) -> Any:
    return moved(__name__, name, _MOVED)
