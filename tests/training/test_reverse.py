"""The reverse task's recipe: a tiny end-to-end training run on the one trainer, the recipe's
learning rate, exact match (the task's generator: tests/data/test_reverse.py)."""

from __future__ import annotations

import pytest
import torch

from attnlab.data.reverse import ReverseTask
from attnlab.models import EncoderDecoderTransformer, TransformerConfig
from attnlab.training import Trainer, prepare
from attnlab.training.recipes.reverse import exact_match


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
