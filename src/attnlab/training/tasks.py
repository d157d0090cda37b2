"""Deprecated (issue 48): the reverse task moved to :mod:`attnlab.data.reverse`.

``ReverseTask`` is :class:`attnlab.data.reverse.ReverseTask`, this module's ``Split`` is
``attnlab.data.reverse.ReverseSplit`` and ``Seq2SeqBatch`` is
:class:`attnlab.data.batches.Seq2SeqBatch` (also :mod:`attnlab.training.objectives`'). The names
still resolve here for one release, with a ``DeprecationWarning`` naming the new path. The
recipe is :mod:`attnlab.training.recipes.reverse`.
"""

from __future__ import annotations

from typing import Any

from attnlab.data import batches as _batches
from attnlab.data import reverse as _reverse
from attnlab.training._moved import Moved, moved

_MOVED: Moved = {
    "ReverseTask": _reverse,
    "Seq2SeqBatch": _batches,
    "Split": (_reverse, "ReverseSplit"),
}


def __getattr__(name: str) -> Any:
    return moved(__name__, name, _MOVED)
