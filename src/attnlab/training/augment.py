"""Deprecated (issue 48): image augmentation moved to :mod:`attnlab.data.augment`.

The names still resolve here for one release, with a ``DeprecationWarning`` naming the new path.
"""

from __future__ import annotations

from typing import Any

from attnlab.data import augment as _augment
from attnlab.training._moved import Moved, moved

_MOVED: Moved = {
    "augment_batch": _augment,
    "AugmentConfig": _augment,
    "crop_flip": _augment,
    "crop_flip_params": _augment,
    "mix_batch": _augment,
    "MixedBatch": _augment,
    "PadMode": _augment,
    "rand_augment": _augment,
    "RAND_AUGMENT_OPS": _augment,
    "random_crop_flip": _augment,
}


def __getattr__(name: str) -> Any:
    return moved(__name__, name, _MOVED)
