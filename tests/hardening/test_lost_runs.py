"""Runs that lose pieces between sessions (issue 19, class 1): a broken ``latest`` pointer, a
deleted or truncated step directory. A resume continues from the newest checkpoint that loads
(saying which it skipped) and ends bitwise as the uninterrupted run; the metrics history up to
that checkpoint is kept line for line; where nothing loads, nothing is changed."""

from __future__ import annotations

import dataclasses
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from attnlab.data.text import TokenStream
from attnlab.models import GPT, GPTConfig
from attnlab.training.config import TrainConfig
from attnlab.training.metrics import TIMING_KEYS
from attnlab.training.objectives import CausalLMObjective
from attnlab.training.rundir import RunDirError
from attnlab.training.trainer import Trainer

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py

TINY = GPTConfig(vocab_size=11, d_model=16, n_heads=2, n_layers=1, d_ff=32, max_seq_len=8,
                 dropout=0.1, eos_id=None)  # fmt: skip
CONFIG = TrainConfig(steps=8, batch_size=4, schedule="cosine", warmup=2, lr=1e-2, eval_every=2,
                     progress=False, log_every=1, checkpoint_every=2,
                     keep_checkpoints=4)  # fmt: skip


def _trainer(run: Path, config: TrainConfig = CONFIG) -> Trainer:
    torch.manual_seed(0)
    model = GPT(TINY)
    stream = TokenStream(torch.randint(11, (2000,), generator=torch.Generator().manual_seed(1)))
    return Trainer(model, CausalLMObjective(stream, block_size=8), config, run_dir=run)


def _lines_to(run: Path, step: int) -> list[str]:
    """metrics.jsonl's lines of steps up to ``step`` (wall-clock figures dropped)."""
    import json

    out = []
    for line in (run / "metrics.jsonl").read_text().splitlines():
        r = json.loads(line)
        if r["step"] <= step:
            out.append(json.dumps({k: v for k, v in r.items() if k not in TIMING_KEYS}))
    return out


def _step(run: Path, n: int) -> Path:
    return run / "checkpoints" / f"step_{n:08d}"


def _put(rel: str, data: bytes, *steps: int) -> Callable[[Path], None]:
    """Write ``data`` over ``rel`` (in each of ``steps``' directories, or in the run)."""

    def damage(run: Path) -> None:
        for where in [_step(run, n) for n in steps] or [run]:
            (where / rel).write_bytes(data)

    return damage


DAMAGE: dict[str, tuple[Callable[[Path], None], int]] = {
    # name: (what happens to the run after step 6, the step the resume must continue from)
    "pointer to a missing step": (_put("checkpoints/latest", b"step_00000099"), 6),
    "pointer outside the run": (_put("checkpoints/latest", b"../../x"), 6),
    "pointer is garbage": (_put("checkpoints/latest", b"\xff\x00"), 6),
    "newest step deleted": (lambda run: shutil.rmtree(_step(run, 6)), 4),
    "newest weights truncated": (_put("model.safetensors", b"x" * 10, 6), 4),
    "newest state truncated": (_put("trainer_state.json", b"{", 6), 4),
    "two newest truncated": (_put("model.safetensors", b"", 4, 6), 2),
}


@pytest.fixture(scope="module")
def reference(
    tmp_path_factory: pytest.TempPathFactory,
) -> tuple[list[float], dict[str, torch.Tensor]]:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as the tests (one_thread): the same kernels, bitwise
    try:
        trainer = _trainer(tmp_path_factory.mktemp("full"))
        losses = trainer.fit().losses
    finally:
        torch.set_num_threads(threads)
    return losses, {k: v.clone() for k, v in trainer.model.state_dict().items()}


@pytest.mark.parametrize("damage", sorted(DAMAGE))
def test_a_damaged_run_resumes_from_the_newest_valid_checkpoint(
    damage: str, reference: tuple[list[float], dict[str, torch.Tensor]], tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:  # fmt: skip
    full_losses, full_weights = reference
    run = tmp_path / "run"
    _trainer(run).fit(until=6)
    breaks, expected = DAMAGE[damage]
    kept = _lines_to(run, expected)
    breaks(run)
    torch.manual_seed(99)  # another process's RNG state: the resume must restore its own
    resumed = _trainer(run)
    with caplog.at_level("WARNING"):
        losses = resumed.fit(resume=True).losses
    assert full_losses[expected:] == losses, f"{damage}: did not continue from step {expected}"
    for name, value in resumed.model.state_dict().items():
        assert torch.equal(value, full_weights[name]), f"{damage}: {name} differs"
    assert _lines_to(run, expected) == kept, f"{damage}: the history up to {expected} changed"
    if "truncated" in damage:
        assert "trying an older one" in caplog.text or "skipped" in caplog.text


def test_a_run_where_nothing_loads_is_left_as_it_was(tmp_path: Path) -> None:
    run = tmp_path / "run"
    _trainer(run).fit(until=6)
    for n in (2, 4, 6):
        (_step(run, n) / "model.safetensors").write_bytes(b"")
    before = {p: p.read_bytes() for p in run.rglob("*") if p.is_file()}
    with pytest.raises(RunDirError, match=r"no checkpoint of .* loads"):
        _trainer(run).fit(resume=True)
    assert {p: p.read_bytes() for p in run.rglob("*") if p.is_file()} == before


def test_a_run_dir_pointer_is_never_followed_outside(tmp_path: Path) -> None:
    """A pointer naming a checkpoint of another run (a path) is not loaded from there."""
    other = tmp_path / "other"
    _trainer(other, dataclasses.replace(CONFIG, steps=8)).fit()
    run = tmp_path / "run"
    _trainer(run).fit(until=2)
    (run / "checkpoints" / "latest").write_text(str(_step(other, 8)))
    resumed = _trainer(run)
    resumed.fit(resume=True, until=3)
    assert resumed.step == 3  # continued from its own step 2, not the other run's step 8
