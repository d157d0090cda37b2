"""Resumable checkpoints: N steps == N/2 + kill + resume N/2 (bitwise on CPU), and a write killed
half-way leaves the previous checkpoint loadable."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from attnlab.models import GPT, GPTConfig
from attnlab.training import state as state_module
from attnlab.training.config import TrainConfig
from attnlab.training.data import TokenStream
from attnlab.training.objectives import CausalLMObjective
from attnlab.training.state import latest_checkpoint, load_training_state
from attnlab.training.trainer import Trainer

# dropout > 0 so that the global RNG state matters too
TINY = GPTConfig(vocab_size=11, d_model=16, n_heads=2, n_layers=1, d_ff=32, max_seq_len=8,
                 dropout=0.1, eos_id=None)  # fmt: skip
CONFIG = TrainConfig(steps=8, batch_size=4, grad_accum=2, schedule="cosine", warmup=2, lr=1e-2,
                     optimizer="adamw", weight_decay=0.1, clip_grad_norm=1.0,
                     label_smoothing=0.1, eval_every=3, progress=False, log_every=1)  # fmt: skip


@pytest.fixture(autouse=True)
def _one_thread() -> Iterator[None]:
    """Tiny models run fastest single-threaded (and the test machine is shared)."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


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

    def killed(obj: object, path: str) -> None:
        Path(path).write_bytes(b"half a file")
        raise KeyboardInterrupt("killed")

    monkeypatch.setattr(state_module.torch, "save", killed)
    with pytest.raises(KeyboardInterrupt):
        trainer.save()
    monkeypatch.undo()
    found = latest_checkpoint(tmp_path)
    assert found is not None and found.name == "step_00000002"
    assert not list(found.glob("*.tmp"))
    fresh = _trainer(tmp_path)
    state = load_training_state(found, fresh.model)
    assert state["step"] == 2
    assert fresh.resume() and fresh.step == 2


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
