"""The reverse task's generator: batch layout, seeding, disjoint splits, its errors (the recipe
that trains on it: tests/training/test_reverse.py)."""

from __future__ import annotations

import pytest
import torch

from attnlab.data.batches import Seq2SeqBatch
from attnlab.data.reverse import ReverseTask

PAD, BOS, EOS = 0, 1, 2


def test_batch_layout() -> None:
    task = ReverseTask(vocab_size=12, min_len=1, max_len=5)
    batch = task.encode([[3, 4, 5], [6, 7]])
    assert batch.src.tolist() == [[3, 4, 5, EOS], [6, 7, EOS, PAD]]
    assert batch.tgt.tolist() == [[BOS, 5, 4, 3], [BOS, 7, 6, PAD]]
    assert batch.targets.tolist() == [[5, 4, 3, EOS], [7, 6, EOS, PAD]]


def test_random_batches_are_consistent_and_seeded() -> None:
    task = ReverseTask(vocab_size=20, min_len=2, max_len=9)
    g = torch.Generator().manual_seed(0)
    batch = task.sample(256, g)
    lengths = (batch.src != PAD).sum(1) - 1  # minus EOS
    assert lengths.min() >= 2 and lengths.max() <= 9
    assert batch.src.shape[1] == int(lengths.max()) + 1 <= task.seq_len
    rows = zip(batch.src, batch.tgt, batch.targets, lengths.tolist(), strict=True)
    for src, tgt, targets, n in rows:
        content = src[:n]
        assert (content >= 3).all() and (content < 20).all()
        assert torch.equal(targets[:n], content.flip(0)) and targets[n] == EOS
        assert tgt[0] == BOS and torch.equal(tgt[1 : n + 1], content.flip(0))
        assert (src[n + 1 :] == PAD).all() and (targets[n + 1 :] == PAD).all()
    again = next(task.batches(256, seed=0))
    assert torch.equal(again.src, batch.src)
    other = next(task.batches(256, seed=1))
    assert not torch.equal(other.src[:, :2], batch.src[:, :2])


def test_heldout_split_is_disjoint_from_training() -> None:
    # A space small enough that two independent random streams would overlap heavily.
    task = ReverseTask(vocab_size=6, min_len=1, max_len=4, heldout_buckets=4)

    def seqs(batches: list[Seq2SeqBatch]) -> set[tuple[int, ...]]:
        return {tuple(row[row != PAD][:-1].tolist()) for b in batches for row in b.src}

    train_seqs = seqs(list(task.batches(500, seed=0, n_batches=4)))
    heldout_seqs = seqs(task.heldout(300, batch_size=100, seed=1))
    assert len(heldout_seqs) > 5 and len(train_seqs) > 50
    assert not train_seqs & heldout_seqs
    # Without the hash partition the same streams do overlap.
    plain = ReverseTask(vocab_size=6, min_len=1, max_len=4, heldout_buckets=None)
    assert seqs(list(plain.batches(500, seed=0, n_batches=4))) & seqs(plain.heldout(300, seed=1))
    assert sum(b.batch_size for b in task.heldout(250, batch_size=100)) == 250


def test_errors() -> None:
    with pytest.raises(ValueError, match="min_len <= max_len"):
        ReverseTask(min_len=5, max_len=4)
    with pytest.raises(ValueError, match="no content tokens"):
        ReverseTask(vocab_size=3)
    with pytest.raises(ValueError, match="split='test'"):
        ReverseTask().sample(2, torch.Generator(), split="test")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="content ids"):
        ReverseTask(vocab_size=8).encode([[3, 9]])
    with pytest.raises(ValueError, match="too small"):
        ReverseTask(vocab_size=4, min_len=1, max_len=1, heldout_buckets=64).heldout(5)
