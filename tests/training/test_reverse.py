"""The reverse task: batch layout, seeding, disjoint splits, and a tiny end-to-end training run."""

from __future__ import annotations

import pytest
import torch

from attnlab.models import EncoderDecoderTransformer, TransformerConfig
from attnlab.training import LoopConfig, ReverseTask, Seq2SeqBatch, evaluate_exact_match, train
from attnlab.training.loop import learning_rate_schedule

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
    assert sum(len(b) for b in task.heldout(250, batch_size=100)) == 250


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


def test_tiny_model_learns_to_reverse() -> None:
    torch.manual_seed(0)
    task = ReverseTask(vocab_size=10, min_len=3, max_len=6)
    config = TransformerConfig(
        vocab_size=10,
        d_model=32,
        n_heads=4,
        n_layers=1,
        d_ff=64,
        dropout=0.0,
        max_seq_len=task.seq_len,
    )
    model = EncoderDecoderTransformer(config)
    heldout = task.heldout(300, seed=1)
    before = evaluate_exact_match(model, heldout)
    result = train(
        model,
        task.batches(64, seed=0),
        LoopConfig(steps=300, warmup=50, lr_factor=0.3, betas=(0.9, 0.999), progress=False),
    )
    assert result.steps == 300 and not result.stopped_early
    assert result.losses[-1] < result.losses[0] / 4
    accuracy = evaluate_exact_match(model, heldout)
    assert before < 0.05
    assert accuracy >= 0.95, f"exact match {accuracy:.3f} after 300 steps"


def test_train_stops_when_batches_run_out_or_time_is_up() -> None:
    task = ReverseTask(vocab_size=8, min_len=2, max_len=3)
    model = EncoderDecoderTransformer(
        TransformerConfig(vocab_size=8, d_model=8, n_heads=2, n_layers=1, d_ff=8)
    )
    config = LoopConfig(steps=10, warmup=5, progress=False)
    result = train(model, task.batches(4, seed=0, n_batches=3), config)
    assert result.steps == 3 and result.stopped_early
    timed = LoopConfig(steps=10_000, warmup=5, progress=False, max_minutes=1e-9)
    assert train(model, task.batches(4, seed=0), timed).stopped_early


def test_train_config_validation() -> None:
    with pytest.raises(ValueError, match="steps must be positive"):
        LoopConfig(steps=0)
    with pytest.raises(ValueError, match="label_smoothing"):
        LoopConfig(label_smoothing=1.0)
    with pytest.raises(ValueError, match="beta2"):
        LoopConfig(betas=(0.9, 1.0))
    with pytest.raises(ValueError, match="schedule='linear'"):
        LoopConfig(schedule="linear")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="steps > warmup"):
        LoopConfig(steps=100, warmup=100, schedule="cosine")


def test_learning_rate_schedules_of_the_loop() -> None:
    d_model, warmup, steps = 64, 100, 1000
    noam_config = LoopConfig(steps=steps, warmup=warmup, lr_factor=0.5)
    cosine_config = LoopConfig(steps=steps, warmup=warmup, lr_factor=0.5, schedule="cosine")
    eq3 = learning_rate_schedule(noam_config, d_model=d_model)
    cos = learning_rate_schedule(cosine_config, d_model=d_model)
    peak = 0.5 * d_model**-0.5 * warmup**-0.5
    for step in (1, 50, warmup):  # same warmup and peak
        assert cos(step) == pytest.approx(eq3(step))
    assert cos(warmup) == pytest.approx(peak)
    assert eq3(steps) == pytest.approx(0.5 * d_model**-0.5 * steps**-0.5)
    assert cos((warmup + steps) // 2) == pytest.approx(peak / 2)
    assert cos(steps) == pytest.approx(0.0, abs=1e-12)
