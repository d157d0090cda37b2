"""What a batch is, and one process's share of it.

- :class:`Seq2SeqBatch`: the padded batch of an encoder-decoder task (the reverse task's, a
  translation recipe's), the one :class:`~attnlab.training.objectives.Seq2SeqObjective` trains on.
- :func:`shard_batch`: one process's rows of a batch in data-parallel training. Every process
  draws the same *global* batch from an identically seeded generator and keeps its own
  contiguous slice, so the processes see disjoint parts of each batch and together exactly the
  examples a single process would see (the data position stays one generator state).

Shapes: B batch, S source length, T target length.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, NamedTuple

import torch
from torch import Tensor


class Seq2SeqBatch(NamedTuple):
    """A padded batch of an encoder-decoder task.

    Attributes:
        src: ``(B, S)`` source ids. tgt: ``(B, T)`` decoder input (BOS + target[:-1]).
        targets: ``(B, T)`` ids to predict (target + EOS), ``pad_id`` where padded.
        src_mask: ``(B, S)`` bool, True for real source tokens.
    """

    src: Tensor
    tgt: Tensor
    targets: Tensor
    src_mask: Tensor

    def to(self, device: torch.device | str) -> Seq2SeqBatch:
        """The same batch on ``device``."""
        return Seq2SeqBatch(*(t.to(device) for t in self))

    @property
    def batch_size(self) -> int:
        return int(self.src.shape[0])


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


__all__ = ["Seq2SeqBatch", "shard_batch"]
