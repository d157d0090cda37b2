"""Batches: one process's share of a batch in data-parallel training (disjoint, contiguous
slices that make up the batch), and the encoder-decoder batch container."""

from __future__ import annotations

import pytest
import torch

from attnlab.data.batches import Seq2SeqBatch, shard_batch


def test_shard_batch_gives_disjoint_slices_that_make_up_the_batch() -> None:
    x, y = torch.arange(24).view(6, 4), torch.arange(6)
    parts = [shard_batch((x, y), rank, 3) for rank in range(3)]
    assert all(p[0].shape == (2, 4) and p[1].shape == (2,) for p in parts)
    assert torch.equal(torch.cat([p[0] for p in parts]), x)
    assert torch.equal(torch.cat([p[1] for p in parts]), y)
    assert shard_batch({"x": x}, 1, 2)["x"].tolist() == x[3:].tolist()
    assert shard_batch(x, 0, 1) is x
    with pytest.raises(ValueError, match="6 rows cannot be split evenly over 4"):
        shard_batch((x, y), 0, 4)
    with pytest.raises(ValueError, match="rank must be in"):
        shard_batch(x, 2, 2)
    with pytest.raises(TypeError, match="type str"):
        shard_batch(("text",), 0, 2)


def test_seq2seq_batches_shard_and_move_as_one() -> None:
    src = torch.arange(8).view(4, 2)
    batch = Seq2SeqBatch(src, src + 1, src + 2, src > 0)
    half = shard_batch(batch, 1, 2)
    assert isinstance(half, Seq2SeqBatch) and half.batch_size == 2
    assert torch.equal(half.src, src[2:]) and torch.equal(half.src_mask, (src > 0)[2:])
    assert torch.equal(batch.to("cpu").targets, batch.targets)
