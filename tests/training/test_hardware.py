"""The trainer on "real hardware" settings, checked on the CPU: mixed precision follows fp32's
loss curve, GradScaler skips an overflowing step and recovers, checkpoints resume across
precisions (fp16's scaler state included, exactly), devices that are absent are refused naming
them, evaluation runs in the run's precision, and a compiled model gives eager's losses."""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path
from typing import Any

import pytest
import torch

from attnlab.cli import main
from attnlab.data.text import TokenStream
from attnlab.layers.attention_backends import math_attention
from attnlab.models import GPT, GPTConfig
from attnlab.training import trainer as trainer_module
from attnlab.training.config import TrainConfig
from attnlab.training.hardware import Precision, resolve_device
from attnlab.training.objectives import CausalLMObjective
from attnlab.training.recipes import prepare, train_recipe
from attnlab.training.state import read_training_state
from attnlab.training.trainer import Callback, Trainer
from attnlab.transforms.precision import Float32Attention

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py

TINY = GPTConfig(vocab_size=11, d_model=32, n_heads=2, n_layers=2, d_ff=64, max_seq_len=16,
                 dropout=0.0, eos_id=None)  # fmt: skip
# a learnable stream: each token is the previous + 1 or + 2 (mod 11), so the loss falls
# from ln 11 = 2.40 towards ln 2 = 0.69
_STEPS = torch.randint(1, 3, (4000,), generator=torch.Generator().manual_seed(1))
TOKENS = torch.cumsum(_STEPS, 0) % 11
# the tolerance of the loss curves: means over windows of 20 steps within this of fp32's
CURVE_TOL = 0.02  # measured: at most 0.0009 (GPT) and 0.0077 (encoder-decoder)


def gpt_setup(**overrides: Any) -> tuple[GPT, CausalLMObjective, TrainConfig]:
    torch.manual_seed(0)
    warmup = min(10, int(overrides.get("steps", 200)) - 1)  # type: ignore[call-overload]
    config = TrainConfig(**{  # type: ignore[arg-type]
        "steps": 200, "batch_size": 8, "schedule": "cosine", "warmup": warmup, "lr": 1e-2,
        "optimizer": "adamw", "betas": (0.9, 0.99), "adam_eps": 1e-8, "label_smoothing": 0.0,
        "progress": False, "eval_batches": 2, "log_every": 1, **overrides,
    })  # fmt: skip
    return GPT(TINY), CausalLMObjective(TokenStream(TOKENS), block_size=16), config


def reverse_trainer(precision: str) -> Trainer:
    over = {"steps": 200, "d_model": 32, "n_heads": 2, "n_layers": 1, "d_ff": 64,
            "batch_size": 16, "min_len": 3, "max_len": 6, "progress": False, "precision": precision,
            "eval_batches": 1}  # fmt: skip
    p = prepare("reverse", over)
    return Trainer(p.model, p.objective, p.train, callbacks=p.callbacks,
                   d_model=p.model_config.d_model)  # fmt: skip


def windows(losses: list[float], size: int = 20) -> list[float]:
    return [sum(losses[i : i + size]) / size for i in range(0, len(losses), size)]


@pytest.mark.parametrize("precision", ["bf16-mixed", "fp16-mixed"])
@pytest.mark.parametrize("task", ["gpt", "encoder-decoder"])
def test_mixed_precision_follows_the_fp32_loss_curve(task: str, precision: str) -> None:
    curves = {}
    for p in ("fp32", precision):
        trainer = Trainer(*gpt_setup(precision=p)) if task == "gpt" else reverse_trainer(p)
        curves[p] = windows(trainer.fit().losses)
        assert trainer.precision.name == p
    fp32, mixed = curves["fp32"], curves[precision]
    assert fp32[-1] < fp32[0] - 0.5  # it learns
    gaps = [abs(a - b) for a, b in zip(fp32, mixed, strict=True)]
    assert max(gaps) < CURVE_TOL, (fp32, mixed)


def test_mixed_precision_keeps_float32_weights_and_optimizer_state() -> None:
    trainer = Trainer(*gpt_setup(precision="bf16-mixed", steps=2))
    trainer.fit()
    assert all(p.dtype == torch.float32 for p in trainer.module.parameters())
    moments = [v for s in trainer.optimizer.state.values() for k, v in s.items() if k != "step"]
    assert moments and all(m.dtype == torch.float32 for m in moments)
    # on the CPU the mixed modes compute attention in float32
    assert isinstance(trainer.module.layers[0].self_attn.backend, Float32Attention)


def test_mixed_precision_leaves_the_math_backend_under_autocast() -> None:
    """Its products autocast like any matmul; its scores and softmax are float32 already."""
    _, objective, train = gpt_setup(precision="bf16-mixed", steps=2)
    trainer = Trainer(GPT(dataclasses.replace(TINY, attn_backend="math")), objective, train)
    assert trainer.module.layers[0].self_attn.backend is math_attention
    assert all(math.isfinite(x) for x in trainer.fit().losses)


def test_pure_bf16_trains_bfloat16_weights_and_state() -> None:
    trainer = Trainer(*gpt_setup(precision="bf16", steps=40, lr=3e-2))
    losses = trainer.fit().losses
    assert all(p.dtype == torch.bfloat16 for p in trainer.module.parameters())
    moments = [v for s in trainer.optimizer.state.values() for k, v in s.items() if k != "step"]
    assert all(m.dtype == torch.bfloat16 for m in moments)
    assert all(math.isfinite(x) for x in losses) and losses[-1] < losses[0] - 0.3


def test_grad_scaler_skips_a_step_with_an_inf_gradient_and_recovers(tmp_path: Path) -> None:
    model, objective, config = gpt_setup(precision="fp16-mixed", steps=6)
    trainer = Trainer(model, objective, config, run_dir=tmp_path / "run")
    inject = {"on": False}
    weight = model.layers[0].ffn.up_proj.weight
    weight.register_hook(lambda g: torch.full_like(g, math.inf) if inject["on"] else g)
    trainer.fit(until=2)
    scale = trainer.precision.loss_scale
    assert scale is not None and trainer.precision.skipped == 0
    before = [p.detach().clone() for p in model.parameters()]
    inject["on"] = True
    trainer.train_step()  # step 3: overflow -> skipped, scale halved
    inject["on"] = False
    assert trainer.precision.skipped == 1 and trainer.precision.loss_scale == scale / 2
    for p, b in zip(model.parameters(), before, strict=True):
        assert torch.equal(p, b)  # nothing applied
    loss, _, _ = trainer.train_step()  # step 4: applied again
    assert math.isfinite(loss)
    assert any(not torch.equal(p, b) for p, b in zip(model.parameters(), before, strict=True))
    trainer.fit()
    lines = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in lines if r["split"] == "train"]
    assert train[-1]["skipped_steps"] == 1 and train[-1]["loss_scale"] == scale / 2
    state = read_training_state(tmp_path / "run" / "checkpoints" / "step_00000006")
    assert state["precision"]["skipped"] == 1
    assert state["precision"]["scaler"]["scale"] == scale / 2


def _overflow_at(model: GPT, step: int) -> None:
    """Make the gradient of one weight infinite in the backward of training step ``step``."""
    calls = {"n": 0}

    def hook(g: torch.Tensor) -> torch.Tensor:
        calls["n"] += 1
        return torch.full_like(g, math.inf) if calls["n"] == step else g

    model.layers[0].ffn.up_proj.weight.register_hook(hook)


def test_fp16_resume_continues_exactly_with_the_scaler_state(tmp_path: Path) -> None:
    model, objective, config = gpt_setup(precision="fp16-mixed", steps=8)
    _overflow_at(model, 3)
    whole = Trainer(model, objective, config)
    expected = whole.fit().losses
    assert whole.precision.skipped == 1
    model, objective, config = gpt_setup(precision="fp16-mixed", steps=8)
    _overflow_at(model, 3)
    first = Trainer(model, objective, config, run_dir=tmp_path / "run")
    first.fit(until=4)
    again = Trainer(*gpt_setup(precision="fp16-mixed", steps=8), run_dir=tmp_path / "run")
    assert again.resume()
    assert again.precision.loss_scale == 2.0**15 and again.precision.skipped == 1
    assert again.fit().losses == expected[4:]
    assert again.precision.loss_scale == whole.precision.loss_scale


@pytest.mark.parametrize(
    ("before", "after"),
    [("fp32", "bf16-mixed"), ("bf16-mixed", "fp32"), ("fp32", "fp16-mixed"), ("fp32", "bf16"),
     ("bf16", "fp32")],
)  # fmt: skip
def test_a_checkpoint_resumes_under_another_precision(
    tmp_path: Path, before: str, after: str
) -> None:
    reference = Trainer(*gpt_setup(precision=after, steps=30)).fit().losses
    first = Trainer(*gpt_setup(precision=before, steps=30), run_dir=tmp_path / "run")
    first.fit(until=15)
    model, objective, config = gpt_setup(precision=after, steps=30)
    second = Trainer(model, objective, config, run_dir=tmp_path / "run")
    result = second.fit(resume=True)
    assert result.step == 30 and len(result.losses) == 15
    assert all(p.dtype == Precision(after, torch.device("cpu")).param_dtype
               for p in model.parameters())  # fmt: skip
    # a resumed run goes on where the other precision left it: near the run in `after` alone
    tail = sum(result.losses[-10:]) / 10
    assert abs(tail - sum(reference[-10:]) / 10) < 0.15


def test_a_resumed_recipe_may_change_precision_device_and_checkpointing(tmp_path: Path) -> None:
    over = {"steps": 2, "d_model": 16, "n_heads": 2, "n_layers": 1, "d_ff": 32,
            "batch_size": 4, "min_len": 2, "max_len": 5, "progress": False, "eval_batches": 1,
            "warmup": 1}  # fmt: skip
    train_recipe("reverse", tmp_path / "run", over)
    more = {"steps": 4, "precision": "bf16-mixed", "device": "cpu",
            "activation_checkpointing": 1}  # fmt: skip
    prepared, result = train_recipe("reverse", tmp_path / "run", more, resume=True)
    assert result.step == 4 and prepared.train.precision == "bf16-mixed"
    record = json.loads((tmp_path / "run" / "run.json").read_text())
    session = record["sessions"][-1]
    assert session["precision"] == "bf16-mixed" and session["device"] == "cpu"
    assert session["checkpointed_blocks"] == 2  # the encoder's and the decoder's block
    assert session["optimizer"].startswith("Adam")


def test_evaluation_runs_in_the_runs_precision() -> None:
    seen: list[bool] = []

    class Probe(Callback):
        def metrics(self, trainer: Trainer, model: Any, base: dict[str, float]) -> dict[str, float]:
            seen.append(torch.is_autocast_enabled("cpu"))
            return {}

    model, objective, config = gpt_setup(precision="bf16-mixed", steps=1)
    mixed = Trainer(model, objective, config, callbacks=[Probe()]).evaluate()
    fp32 = Trainer(*gpt_setup(steps=1), callbacks=[Probe()]).evaluate()
    assert seen == [True, False]
    assert mixed["val_loss"] != fp32["val_loss"]
    assert abs(mixed["val_loss"] - fp32["val_loss"]) < 0.05


def test_devices_are_resolved_and_absent_ones_refused() -> None:
    model = GPT(TINY)
    assert resolve_device(None, model) == torch.device("cpu")
    assert resolve_device("cpu") == torch.device("cpu")
    auto = resolve_device("auto")
    assert auto.type == ("cuda" if torch.cuda.is_available() else auto.type)
    with pytest.raises(ValueError, match="device='gpu' is not valid; choose cpu, cuda"):
        TrainConfig(device="gpu")
    if not torch.cuda.is_available():
        for name in ("cuda", "cuda:1"):
            with pytest.raises(ValueError, match=f"device='{name}' is not available.*cpu"):
                Trainer(*gpt_setup(device=name))
    if not torch.backends.mps.is_available():
        with pytest.raises(ValueError, match="device='mps' is not available"):
            resolve_device("mps")
    with pytest.raises(ValueError, match="under torchrun each process trains on its own"):
        resolve_device("cpu", process_device=torch.device("cuda", 1))


@pytest.mark.skipif(torch.cuda.is_available(), reason="the machine has CUDA")
def test_cli_refuses_an_absent_device_with_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = main(["train", "reverse", "--steps", "2", "--warmup", "1", "--device", "cuda",
                 "--no-progress", "--out", str(tmp_path / "run")])  # fmt: skip
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1
    assert "device='cuda' is not available" in err[0] and not (tmp_path / "run").exists()
    assert main(["train", "reverse", "--precision", "fp8"]) == 2
    assert "--precision: expected one of fp32, bf16-mixed, fp16-mixed, bf16" in (
        capsys.readouterr().err
    )


def test_config_rejects_negative_checkpointing() -> None:
    with pytest.raises(ValueError, match="activation_checkpointing must be >= 0, got -1"):
        TrainConfig(activation_checkpointing=-1)
    assert dataclasses.replace(TrainConfig(), compile=True).compile


def test_evaluate_and_generate_take_the_precision(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    over = {"steps": 2, "d_model": 16, "n_heads": 2, "n_layers": 1, "d_ff": 32, "warmup": 1,
            "batch_size": 4, "min_len": 2, "max_len": 5, "progress": False, "eval_batches": 1,
            "precision": "bf16-mixed"}  # fmt: skip
    run = str(tmp_path / "run")
    train_recipe("reverse", run, over)
    capsys.readouterr()
    values = {}
    for precision in ("bf16-mixed", "fp32", "bf16"):
        assert main(["evaluate", run, "--json", "--precision", precision]) == 0
        values[precision] = json.loads(capsys.readouterr().out)["metrics"]["val_loss"]
    assert main(["evaluate", run, "--json"]) == 0  # the run's own: bf16-mixed
    assert json.loads(capsys.readouterr().out)["metrics"]["val_loss"] == values["bf16-mixed"]
    assert values["fp32"] != values["bf16-mixed"]
    assert abs(values["fp32"] - values["bf16"]) < 0.1
    for precision in ("bf16-mixed", "bf16"):
        code = main(["generate", run, "--ids", "3,4,5", "--max-new-tokens", "3", "--greedy",
                     "--precision", precision])  # fmt: skip
        assert code == 0 and capsys.readouterr().out.strip()


@pytest.mark.parametrize("retain", [True, False])
def test_fit_keeps_freed_cpu_memory_and_gives_it_back_unless_told_not_to(
    monkeypatch: pytest.MonkeyPatch, retain: bool
) -> None:
    """``retain_cpu_memory``: fit sets :func:`attnlab.allocator.retain_freed_memory` on the CPU
    and releases the free memory when it returns; off, neither."""
    calls: list[str] = []
    monkeypatch.setattr(
        trainer_module, "retain_freed_memory", lambda: calls.append("retain") or True
    )
    monkeypatch.setattr(
        trainer_module, "release_freed_memory", lambda: calls.append("release") or True
    )
    trainer = Trainer(*gpt_setup(steps=2, device="cpu", retain_cpu_memory=retain))
    assert calls == []
    trainer.fit()
    assert calls == (["retain", "release"] if retain else [])
