"""Deprecated (issue 48): the training data moved to :mod:`attnlab.data`.

Tiny Shakespeare and :class:`~attnlab.data.text.TokenStream` are in :mod:`attnlab.data.text`,
:class:`~attnlab.data.images.ArrayImageDataset` and ``load_digits`` in
:mod:`attnlab.data.images`, ``Split`` and ``data_dir`` in :mod:`attnlab.data.common`,
``shard_batch`` in :mod:`attnlab.data.batches`; ``data_dirs`` and ``find_data_file`` are
:mod:`attnlab.io`'s. The names still resolve here for one release, with a ``DeprecationWarning``
naming the new path.
"""

from __future__ import annotations

from typing import Any

import attnlab.io as _io
from attnlab.data import batches as _batches
from attnlab.data import common as _common
from attnlab.data import images as _images
from attnlab.data import text as _text
from attnlab.training._moved import Moved, moved

_MOVED: Moved = {
    "ArrayImageDataset": _images,
    "data_dir": _common,
    "data_dirs": _io,
    "find_data_file": _io,
    "load_digits": _images,
    "load_text": _text,
    "shard_batch": _batches,
    "Split": _common,
    "TINY_SHAKESPEARE": _text,
    "TINY_SHAKESPEARE_SHA256": _text,
    "TINY_SHAKESPEARE_URL": _text,
    "TokenStream": _text,
}


def __getattr__(name: str) -> Any:
    return moved(__name__, name, _MOVED)
