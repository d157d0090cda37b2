"""The reverse task and its recipe: batch layout, seeding, disjoint splits, a tiny end-to-end
training run on the one trainer, the recipe's learning rate."""

from __future__ import annotations

import pytest
import torch

from attnlab.models import EncoderDecoderTransformer, TransformerConfig
from attnlab.training import ReverseTask, Seq2SeqBatch, Trainer, prepare
from attnlab.training.recipes.reverse import exact_match

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


def test_tiny_model_learns_to_reverse() -> None:
    overrides = {"vocab": 10, "min_len": 3, "max_len": 6, "eval_size": 300, "d_model": 32,
                 "n_layers": 1, "d_ff": 64, "steps": 300, "warmup": 50, "lr_factor": 0.3,
                 "batch_size": 64, "schedule": "noam", "progress": False}  # fmt: skip
    run = prepare("reverse", overrides)
    heldout = run.data.value["heldout"]
    before = exact_match(run.model, heldout, pad_id=0)
    result = Trainer(run.model, run.objective, run.train, callbacks=run.callbacks).fit()
    assert result.step == 300 and result.stopped_by == "steps"
    assert result.losses[-1] < result.losses[0] / 4
    assert before < 0.05
    accuracy = result.evals[-1]["val_exact_match"]
    assert accuracy == exact_match(run.model, heldout, pad_id=0)
    assert accuracy >= 0.95, f"exact match {accuracy:.3f} after 300 steps"


def test_the_recipe_derives_the_rate_from_lr_factor() -> None:
    """Cosine: eq. (3)'s warmup to its peak, lr_factor · d_model^-0.5 · warmup^-0.5, then a
    cosine to 0; noam: eq. (3) times lr_factor; an explicit lr wins."""
    from attnlab.training.optim import build_optimizer, build_scheduler

    d_model, warmup, steps = 64, 100, 1000
    common = {"steps": steps, "warmup": warmup, "lr_factor": 0.5, "eval_size": 10}
    peak = 0.5 * d_model**-0.5 * warmup**-0.5
    cos = prepare("reverse", common)
    eq3 = prepare("reverse", {**common, "schedule": "noam"})
    assert cos.train.lr == pytest.approx(peak) and eq3.train.lr == 0.5
    assert prepare("reverse", {**common, "lr": 1e-3}).train.lr == 1e-3

    def rates(run: object) -> list[float]:
        opt = build_optimizer(run.model, run.train)  # type: ignore[attr-defined]
        sched = build_scheduler(opt, run.train, d_model=d_model)  # type: ignore[attr-defined]
        out = []
        for _ in range(steps):
            out.append(opt.param_groups[0]["lr"])
            opt.step()  # no gradients: nothing changes, but the scheduler sees a step
            sched.step()
        return out

    c, n = rates(cos), rates(eq3)
    for step in (1, 50, warmup):  # same warmup and peak
        assert c[step - 1] == pytest.approx(n[step - 1])
    assert c[warmup - 1] == pytest.approx(peak)
    assert n[steps - 1] == pytest.approx(0.5 * d_model**-0.5 * steps**-0.5)
    assert c[(warmup + steps) // 2 - 1] == pytest.approx(peak / 2, rel=1e-2)
    assert c[steps - 1] == pytest.approx(0.0, abs=1e-7)


def test_an_untrained_model_scores_zero_and_batches_are_needed() -> None:
    torch.manual_seed(0)
    model = EncoderDecoderTransformer(
        TransformerConfig(vocab_size=8, d_model=8, n_heads=2, n_layers=1, d_ff=8, max_seq_len=8)
    )
    task = ReverseTask(vocab_size=8, min_len=2, max_len=3)
    assert exact_match(model, task.heldout(20, seed=1), pad_id=0) < 0.5
    with pytest.raises(ValueError, match="no batches"):
        exact_match(model, [], pad_id=0)
