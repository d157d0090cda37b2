"""Deprecated (issue 48): the CIFAR-10 download moved to :mod:`attnlab.data.cifar10_download`.

The names still resolve here for one release, with a ``DeprecationWarning`` naming the new path.
"""

from __future__ import annotations

from typing import Any

from attnlab.data import cifar10_download as _cifar10_download
from attnlab.training._moved import Moved, moved

_MOVED: Moved = {
    "ARCHIVE": _cifar10_download,
    "ARCHIVE_MD5": _cifar10_download,
    "ARCHIVE_SHA256": _cifar10_download,
    "BATCH_SIZE": _cifar10_download,
    "convert_archive": _cifar10_download,
    "download_cifar10": _cifar10_download,
    "fetch": _cifar10_download,
    "FILES": _cifar10_download,
    "MANIFEST": _cifar10_download,
    "read_batch": _cifar10_download,
    "RestrictedUnpickler": _cifar10_download,
    "sha256_file": _cifar10_download,
    "TEST_BATCH": _cifar10_download,
    "TRAIN_BATCHES": _cifar10_download,
    "URL": _cifar10_download,
}


def __getattr__(name: str) -> Any:
    return moved(__name__, name, _MOVED)
