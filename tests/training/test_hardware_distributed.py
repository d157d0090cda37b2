"""Activation checkpointing under FSDP2 on 2 CPU processes (gloo): a 1-process checkpoint resumed
by 2 sharded, checkpointed processes equals the plain 1-process run (1e-6), like
test_distributed.py's FSDP test without checkpointing (one torchrun launch, ~15 s)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from safetensors.torch import load_file

from attnlab.cli import main

from .test_distributed import TOL, _checkpoint, _max_diff, _text, _torchrun, _train_args

pytestmark = [
    pytest.mark.usefixtures("one_thread"),
    pytest.mark.skipif(
        not (dist.is_available() and dist.is_gloo_available()),
        reason="this PyTorch build has no torch.distributed with the gloo backend",
    ),
]


def test_fsdp_with_activation_checkpointing_resumes_one_process_run(tmp_path: Path) -> None:
    try:
        from torch.distributed.fsdp import fully_shard  # noqa: F401
    except ImportError as e:
        pytest.skip(f"FSDP2 (torch.distributed.fsdp.fully_shard) is missing: {e}")
    (tmp_path / "text.txt").write_text(_text())
    for steps in (2, 4):
        assert main(_train_args(tmp_path, f"one{steps}", steps)) == 0
    shutil.copytree(tmp_path / "runs" / "one2", tmp_path / "runs" / "ac")
    target = ["-m", "attnlab", *_train_args(tmp_path, "ac", 4, "--resume", "--fsdp",
                                            "--activation-checkpointing=1")]  # fmt: skip
    done, _ = _torchrun(target, cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "activation checkpointing every block" in done.stdout
    weights = load_file(_checkpoint(tmp_path, "ac", 4) / "model.safetensors")
    reference = load_file(_checkpoint(tmp_path, "one4", 4) / "model.safetensors")
    assert _max_diff(weights, reference) < TOL
    assert torch.isfinite(torch.cat([w.flatten() for w in weights.values()])).all()
