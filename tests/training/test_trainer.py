"""The trainer: config validation, optimizer groups, accumulation == a larger batch, clipping,
evaluation/early stopping, metrics.jsonl."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
import torch

from attnlab.data.text import TokenStream
from attnlab.models import GPT, GPTConfig
from attnlab.training import TrainConfig as PublicTrainConfig
from attnlab.training.config import TrainConfig
from attnlab.training.objectives import CausalLMObjective
from attnlab.training.optim import classify_parameters, parameter_groups
from attnlab.training.trainer import Callback, Trainer, clip_gradients

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py

TINY = GPTConfig(vocab_size=11, d_model=16, n_heads=2, n_layers=1, d_ff=32, max_seq_len=8,
                 dropout=0.0, eos_id=None)  # fmt: skip


def _setup(seed: int = 0, **overrides: object) -> tuple[GPT, CausalLMObjective, TrainConfig]:
    torch.manual_seed(seed)
    model = GPT(TINY)
    stream = TokenStream(torch.randint(11, (2000,), generator=torch.Generator().manual_seed(1)))
    config = TrainConfig(**{  # type: ignore[arg-type]
        "steps": 6, "batch_size": 4, "schedule": "cosine", "warmup": 2, "lr": 1e-2,
        "optimizer": "adamw", "betas": (0.9, 0.99), "adam_eps": 1e-8, "label_smoothing": 0.0,
        "progress": False, "eval_batches": 2, **overrides,
    })  # fmt: skip
    return model, CausalLMObjective(stream, block_size=8), config


def test_config_rejects_unknown_keys_and_bad_values() -> None:
    with pytest.raises(ValueError, match="unknown TrainConfig keys \\['bogus'\\]"):
        TrainConfig.from_dict({"steps": 3, "bogus": 1})
    assert TrainConfig.from_dict(TrainConfig(steps=3).to_dict()) == TrainConfig(steps=3)
    for bad in ({"steps": 0}, {"schedule": "linear"}, {"optimizer": "lion"},
                {"label_smoothing": 1.0}, {"betas": (0.9, 1.0)}, {"weight_decay": -1.0},
                {"schedule": "cosine", "warmup": 10, "steps": 10}):  # fmt: skip
        with pytest.raises(ValueError):
            TrainConfig(**bad)  # type: ignore[arg-type]
    assert PublicTrainConfig is TrainConfig


def test_no_weight_decay_on_biases_norms_and_embeddings() -> None:
    model = GPT(TINY)
    kinds = classify_parameters(model)
    assert kinds["tok_embed.weight"] == "embedding"
    assert kinds["pos_encoding.weight"] == "embedding"
    assert "lm_head.weight" not in kinds  # tied to tok_embed: listed once
    assert kinds["final_norm.weight"] == "norm"
    assert any(k == "bias" for k in kinds.values()) and any(k == "weight" for k in kinds.values())
    decay, no_decay = parameter_groups(model, 0.1)
    assert decay["weight_decay"] == 0.1 and no_decay["weight_decay"] == 0.0
    assert all(p.ndim == 2 for p in decay["params"])
    assert model.tok_embed.weight in no_decay["params"]
    (everything,) = parameter_groups(model, 0.1, decay_norms_and_biases=True,
                                     decay_embeddings=True)  # fmt: skip
    assert len(everything["params"]) == len(list(model.parameters()))


@pytest.mark.parametrize("k", [2, 4])
def test_accumulating_k_micro_batches_equals_one_k_times_batch(k: int) -> None:
    grads = []
    for batch_size, accum in ((2 * k, 1), (2, k)):
        model, objective, config = _setup(batch_size=batch_size, grad_accum=accum)
        trainer = Trainer(model, objective, config)
        trainer.train_step()
        grads.append([p.grad.clone() for p in model.parameters()])
    for big, accumulated in zip(*grads, strict=True):
        torch.testing.assert_close(accumulated, big, atol=1e-6, rtol=0)


def test_clipping_bounds_the_gradient_norm() -> None:
    model = torch.nn.Linear(4, 3)
    for p in model.parameters():
        p.grad = torch.full_like(p, 10.0)
    before = clip_gradients(model, 1.0)
    assert before == pytest.approx(10.0 * (15**0.5), rel=1e-6)
    after = torch.cat([p.grad.flatten() for p in model.parameters()]).norm()  # type: ignore[union-attr]
    assert after <= 1.0 + 1e-6
    assert clip_gradients(model, None) == pytest.approx(float(after), rel=1e-6)


def test_fit_logs_metrics_and_evaluates(tmp_path: Path) -> None:
    model, objective, config = _setup(eval_every=3, log_every=2)
    result = Trainer(model, objective, config, run_dir=tmp_path).fit()
    assert result.step == 6 and len(result.losses) == 6
    assert [e["step"] for e in result.evals] == [3, 6]
    lines = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in lines if r["split"] == "train"]
    assert [r["step"] for r in train] == [2, 4, 6]
    assert {"loss", "lr", "grad_norm", "tokens", "tokens_per_s", "elapsed_s"} <= set(train[0])
    val = [r for r in lines if r["split"] == "val"]
    assert [r["step"] for r in val] == [3, 6] and {"loss", "accuracy", "eval_s"} <= set(val[0])
    # elapsed_s is the clock before the evaluation; the next records' include its seconds
    assert val[0]["eval_s"] >= 0  # rounded to the millisecond, as elapsed_s
    assert train[1]["elapsed_s"] >= val[0]["elapsed_s"] + val[0]["eval_s"] - 0.002
    assert result.stopped_by == "steps" and result.best_step in (3, 6)


def test_a_non_finite_loss_stops_the_run_before_it_is_saved(tmp_path: Path) -> None:
    from attnlab.training import NonFiniteLossError

    model, objective, config = _setup(checkpoint_every=1, lr=1e-2)
    trainer = Trainer(model, objective, config, run_dir=tmp_path)
    trainer.fit(until=2)
    with torch.no_grad():
        next(model.parameters()).fill_(float("nan"))
    with pytest.raises(NonFiniteLossError, match="training loss is nan at step 3"):
        trainer.fit()
    assert sorted(p.name for p in (tmp_path / "checkpoints").glob("step_*")) == [
        "step_00000001", "step_00000002",
    ]  # fmt: skip


def test_time_and_epoch_budgets(tmp_path: Path) -> None:
    model, objective, config = _setup(steps=None, max_minutes=1e-6, schedule="constant")
    result = Trainer(model, objective, config).fit()
    assert result.stopped_by == "minutes" and result.step == 1  # checked after each update
    with pytest.raises(ValueError, match="max_epochs needs a recipe whose data has epochs"):
        model, objective, config = _setup(max_epochs=1)
        Trainer(model, objective, config).fit()


def test_early_stopping_stops_after_patience_evaluations() -> None:
    model, objective, config = _setup(steps=50, eval_every=1, early_stopping=1, lr=5.0,
                                      schedule="constant", warmup=0)  # fmt: skip
    result = Trainer(model, objective, config).fit()
    assert result.stopped_early and result.step < 50


def test_training_is_seeded() -> None:
    runs = [Trainer(*_setup()).fit().losses for _ in range(2)]
    assert runs[0] == runs[1]


def _dropout_setup(**overrides: object) -> tuple[GPT, CausalLMObjective, TrainConfig]:
    torch.manual_seed(0)
    model = GPT(dataclasses.replace(TINY, dropout=0.3))
    _, objective, config = _setup(**overrides)
    return model, objective, config


def test_reseed_dropout_false_continues_the_rng_the_initialisation_left() -> None:
    reseeded = Trainer(*_dropout_setup(steps=3)).fit().losses
    continued = Trainer(*_dropout_setup(steps=3, reseed_dropout=False)).fit().losses
    assert reseeded != continued  # other dropout masks
    model, objective, config = _dropout_setup(steps=3)
    trainer = Trainer(model, objective, config)
    torch.manual_seed(0)
    GPT(dataclasses.replace(TINY, dropout=0.3))  # the state a fresh initialisation leaves
    assert [trainer.train_step()[0] for _ in range(3)] == continued


class _Declared(Callback):
    names = ("score",)


def test_a_best_metric_nobody_measures_is_refused_before_training() -> None:
    model, objective, config = _setup(best_metric="val_bleu")
    with pytest.raises(ValueError, match=r"best_metric='val_bleu' is not measured.*val_score"):
        Trainer(model, objective, config, callbacks=[_Declared()])
    Trainer(model, objective, _setup(best_metric="val_score")[2], callbacks=[_Declared()])
    Trainer(model, objective, config, callbacks=[Callback()])  # undeclared: checked later


def test_tensorboard_is_optional(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    model, objective, config = _setup(steps=3, tensorboard=True)
    Trainer(model, objective, config, run_dir=tmp_path).fit()
    assert (tmp_path / "metrics.jsonl").read_text()
    try:
        import tensorboard  # noqa: F401
    except ImportError:
        assert "needs the tensorboard package" in caplog.text
    else:
        assert (tmp_path / "tb").is_dir()


def test_schedule_clock_time_follows_the_further_along_clock() -> None:
    """schedule_clock='time': the cosine is at max(step, steps * elapsed / budget); with the
    step count ahead (or the default 'steps' clock) it is the plain step schedule."""
    from attnlab.training.schedules import warmup_cosine

    def lr_at(step: int) -> float:
        return 1e-2 * warmup_cosine(step, warmup=2, total_steps=100)

    model, objective, config = _setup(steps=100, max_minutes=1.0, schedule_clock="time")
    trainer = Trainer(model, objective, config)
    trainer.train_step()  # the clock at 0: the step schedule
    assert trainer.optimizer.param_groups[0]["lr"] == pytest.approx(lr_at(2))
    trainer.elapsed = 30.0  # half the budget spent after one update: the time is ahead
    trainer.train_step()
    assert trainer.optimizer.param_groups[0]["lr"] == pytest.approx(lr_at(50))
    trainer.elapsed = 90.0  # past the budget: the end of the decay
    trainer.train_step()
    assert trainer.optimizer.param_groups[0]["lr"] == pytest.approx(0.0, abs=1e-12)
    # the step clock ignores the time
    model, objective, config = _setup(steps=100, max_minutes=1.0)
    plain = Trainer(model, objective, config)
    plain.elapsed = 30.0
    plain.train_step()
    assert plain.optimizer.param_groups[0]["lr"] == pytest.approx(lr_at(2))


def test_wsd_on_the_time_clock_decays_over_the_last_fraction_of_the_time() -> None:
    from attnlab.training.schedules import warmup_stable_decay

    def lr_at(step: int) -> float:
        return 1e-2 * warmup_stable_decay(step, warmup=2, total_steps=100, decay_fraction=0.2)

    model, objective, config = _setup(steps=100, max_minutes=1.0, schedule_clock="time",
                                      schedule="wsd", decay_fraction=0.2)  # fmt: skip
    trainer = Trainer(model, objective, config)
    trainer.train_step()
    assert trainer.optimizer.param_groups[0]["lr"] == pytest.approx(1e-2)  # the plateau
    trainer.elapsed = 54.0  # 90% of the time: halfway down the decay
    trainer.train_step()
    assert trainer.optimizer.param_groups[0]["lr"] == pytest.approx(lr_at(90))
    assert lr_at(90) == pytest.approx(0.5e-2)


def test_schedule_clock_time_needs_a_cosine_and_a_time_budget() -> None:
    with pytest.raises(ValueError, match="schedule_clock='time' needs schedule='cosine' or"):
        _setup(schedule_clock="time")  # no max_minutes
    with pytest.raises(ValueError, match="got schedule='constant'"):
        _setup(schedule_clock="time", schedule="constant", max_minutes=1.0)
