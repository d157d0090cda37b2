"""Resumable checkpoints: N steps == N/2 + kill + resume N/2 (bitwise on CPU), and a write killed
half-way leaves the previous checkpoint loadable."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from attnlab.data.text import TokenStream
from attnlab.models import GPT, GPTConfig
from attnlab.training import state as state_module
from attnlab.training.config import TrainConfig
from attnlab.training.objectives import CausalLMObjective
from attnlab.training.rundir import RunDirError, latest_checkpoint
from attnlab.training.state import load_training_state
from attnlab.training.trainer import Trainer

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py

# dropout > 0 so that the global RNG state matters too
TINY = GPTConfig(vocab_size=11, d_model=16, n_heads=2, n_layers=1, d_ff=32, max_seq_len=8,
                 dropout=0.1, eos_id=None)  # fmt: skip
CONFIG = TrainConfig(steps=8, batch_size=4, grad_accum=2, schedule="cosine", warmup=2, lr=1e-2,
                     optimizer="adamw", weight_decay=0.1, clip_grad_norm=1.0,
                     label_smoothing=0.1, eval_every=3, progress=False, log_every=1)  # fmt: skip


def _trainer(run_dir: Path) -> Trainer:
    torch.manual_seed(0)
    model = GPT(TINY)
    stream = TokenStream(torch.randint(11, (2000,), generator=torch.Generator().manual_seed(1)))
    return Trainer(model, CausalLMObjective(stream, block_size=8), CONFIG, run_dir=run_dir)


def test_resume_reproduces_the_uninterrupted_run_bitwise(tmp_path: Path) -> None:
    full = _trainer(tmp_path / "full")
    full_result = full.fit()
    first = _trainer(tmp_path / "split").fit(until=4)
    assert first.step == 4
    torch.manual_seed(123)  # a fresh process would have other RNG state: resume must restore it
    second_trainer = _trainer(tmp_path / "split")
    second = second_trainer.fit(resume=True)
    assert second.step == 8
    assert first.losses + second.losses == full_result.losses  # bitwise
    for a, b in zip(full.model.state_dict().values(), second_trainer.model.state_dict().values(),
                    strict=True):  # fmt: skip
        assert torch.equal(a, b)
    assert (tmp_path / "split" / "metrics.jsonl").read_text() != ""


def test_resume_without_a_checkpoint_starts_fresh(tmp_path: Path) -> None:
    assert _trainer(tmp_path).fit(resume=True, until=2).step == 2


def test_killed_write_leaves_the_previous_checkpoint_loadable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    trainer = _trainer(tmp_path)
    trainer.fit(until=2)
    assert latest_checkpoint(tmp_path).name == "step_00000002"  # type: ignore[union-attr]
    trainer.train_step()  # one more step, then die while writing its checkpoint

    def killed(tensors: object, path: str, metadata: object = None) -> None:
        Path(path).write_bytes(b"half a file")
        raise KeyboardInterrupt("killed")

    monkeypatch.setattr(state_module, "save_file", killed)
    with pytest.raises(KeyboardInterrupt):
        trainer.save()
    monkeypatch.undo()
    found = latest_checkpoint(tmp_path)
    assert found is not None and found.name == "step_00000002"
    assert not list(found.glob("*.tmp"))
    fresh = _trainer(tmp_path)
    state = load_training_state(found, fresh.model)
    assert state["step"] == 2
    assert fresh.checkpoints.resume() and fresh.step == 2


def test_old_checkpoints_are_pruned(tmp_path: Path) -> None:
    trainer = _trainer(tmp_path)
    for step in (1, 2, 3, 4):
        trainer.fit(until=step)
    kept = sorted(p.name for p in (tmp_path / "checkpoints").glob("step_*"))
    assert kept == ["step_00000003", "step_00000004"]


def test_continuing_fit_in_process_equals_one_call(tmp_path: Path) -> None:
    full = _trainer(tmp_path / "full").fit().losses
    trainer = _trainer(tmp_path / "parts")
    assert trainer.fit(until=3).losses + trainer.fit().losses == full


def test_checkpoint_holds_only_safetensors_and_json(tmp_path: Path) -> None:
    """The trainer state is a safetensors file (every tensor: optimizer moments, RNG states as
    uint8) and strict JSON (no NaN/Infinity literals), never a pickle; it reads back equal."""
    trainer = _trainer(tmp_path)
    trainer.fit(until=2)
    found = latest_checkpoint(tmp_path)
    assert found is not None
    assert sorted(p.name for p in found.iterdir()) == [
        "config.json", "model.safetensors", "trainer_state.json", "trainer_state.safetensors",
    ]  # fmt: skip
    for file in found.iterdir():
        assert not file.read_bytes().startswith((b"\x80", b"PK")), f"{file.name} is a pickle"

    def no_constants(name: str) -> None:
        raise AssertionError(f"non-standard JSON constant {name}")

    data = json.loads((found / "trainer_state.json").read_text(), parse_constant=no_constants)
    assert data["format"] == "attnlab-trainer-state" and data["state"]["step"] == 2
    assert data["state"]["best_value"] is None  # no evaluation yet
    tensors = load_file(found / "trainer_state.safetensors")
    assert tensors["/rng/torch"].dtype == torch.uint8
    assert torch.equal(tensors["/data/generator"], trainer.stream.generator.get_state())
    state = state_module.read_training_state(found)
    expected = trainer.checkpoints.state_dict()
    assert state["optimizer"]["param_groups"] == expected["optimizer"]["param_groups"]
    for name, moments in expected["optimizer"]["state"].items():  # keyed by parameter name
        for key, value in moments.items():
            assert torch.equal(state["optimizer"]["state"][name][key], value), (name, key)
    assert state["scheduler"] == expected["scheduler"]
    assert state["rng"]["python"] == expected["rng"]["python"]


def test_flatten_state_round_trips_what_json_lacks() -> None:
    state = {
        "ids": {0: {"step": torch.tensor(3.0), "m": torch.ones(2, 3)}, 7: {}},
        "pair": (0.9, 0.99), "inf": math.inf, "ninf": -math.inf, "none": None, "flag": True,
        "tagged": {"__tensor__": "not a tensor"}, "nested": [[1, "a"], (torch.arange(3),)],
    }  # fmt: skip
    data, tensors = state_module.flatten_state(state)
    text = json.dumps(data, allow_nan=False)  # strict JSON
    back = state_module.unflatten_state(json.loads(text), tensors)
    assert back["ids"][0]["step"].ndim == 0 and torch.equal(back["ids"][0]["m"], torch.ones(2, 3))
    assert list(back["ids"]) == [0, 7] and back["ids"][7] == {}
    assert back["pair"] == (0.9, 0.99) and isinstance(back["pair"], tuple)
    assert back["inf"] == math.inf and back["ninf"] == -math.inf
    assert back["none"] is None and back["flag"] is True
    assert back["tagged"] == {"__tensor__": "not a tensor"}
    assert back["nested"][0] == [1, "a"] and torch.equal(back["nested"][1][0], torch.arange(3))
    nan = state_module.unflatten_state(*state_module.flatten_state({"x": math.nan}))
    assert math.isnan(nan["x"])
    with pytest.raises(TypeError, match="'/bad' has type object"):
        state_module.flatten_state({"bad": object()})


def test_an_old_pickled_state_is_refused(tmp_path: Path) -> None:
    trainer = _trainer(tmp_path)
    trainer.fit(until=1)
    found = latest_checkpoint(tmp_path)
    assert found is not None
    (found / "trainer_state.json").unlink()
    (found / "trainer_state.pt").write_bytes(b"\x80\x04pickle")
    assert latest_checkpoint(tmp_path) is None  # incomplete: not offered for resuming
    with pytest.raises(FileNotFoundError, match=r"trainer_state\.pt is not supported"):
        state_module.read_training_state(found)
    with pytest.raises(RunDirError, match=r"no checkpoint of .* loads"):
        _trainer(tmp_path).fit(resume=True)  # never starts over where checkpoints exist


def test_resume_falls_back_to_the_newest_checkpoint_that_loads(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Truncated weights, a pointer to a missing step or outside the run: the newest valid
    checkpoint is used, saying which were skipped; the run ends as the uninterrupted one."""
    full = _trainer(tmp_path / "full")
    full_losses = full.fit().losses
    run = tmp_path / "run"
    trainer = _trainer(run)
    for step in (2, 3, 4):
        trainer.fit(until=step)
    (run / "checkpoints" / "step_00000004" / "model.safetensors").write_bytes(b"trunc")
    (run / "checkpoints" / "latest").write_text("../../elsewhere\n")  # a path, not a name
    torch.manual_seed(5)
    resumed = _trainer(run)
    with caplog.at_level("WARNING"):
        losses = resumed.fit(resume=True).losses
    assert resumed.step == 8 and "step_00000004" in caplog.text
    assert full_losses[3:] == losses  # continued from step 3, bitwise
    for a, b in zip(full.model.state_dict().values(), resumed.model.state_dict().values(),
                    strict=True):  # fmt: skip
        assert torch.equal(a, b)


def test_a_run_whose_checkpoints_are_all_gone_is_never_started_over(tmp_path: Path) -> None:
    """Its metrics prove a checkpoint had completed: starting from step 0 would rewrite them."""
    import dataclasses
    import shutil

    config = dataclasses.replace(CONFIG, checkpoint_every=2)
    torch.manual_seed(0)
    stream = TokenStream(torch.randint(11, (2000,), generator=torch.Generator().manual_seed(1)))
    first = Trainer(GPT(TINY), CausalLMObjective(stream, block_size=8), config, run_dir=tmp_path)
    first.fit(until=5)
    shutil.rmtree(tmp_path / "checkpoints")
    before = (tmp_path / "metrics.jsonl").read_bytes()
    again = Trainer(GPT(TINY), CausalLMObjective(stream, block_size=8), config, run_dir=tmp_path)
    with pytest.raises(RunDirError, match=r"none is left, but metrics.jsonl records .* step 5"):
        again.fit(resume=True)
    assert (tmp_path / "metrics.jsonl").read_bytes() == before
