"""An MoE GPT under torchrun (issue 23): 2 CPU processes (DDP, gloo) train as 1 process does.

The z-loss, the per-expert load (summed over the processes before it is logged) and the
aux-loss-free router biases (updated from the counts of every process) match the single-process
run of the same global batch; no ``find_unused_parameters`` is needed (every expert runs, on a
possibly empty group). The load-balancing loss and a capacity are computed per process (on its
slice of the batch, as Switch and GShard do per device), so they are not comparable to one
process and stay off here. SGD, as in test_distributed.py, so that the runs agree to rounding.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch.distributed as dist
from safetensors.torch import load_file

from attnlab.cli import main

pytestmark = [
    pytest.mark.usefixtures("one_thread"),
    pytest.mark.slow,  # a torchrun launch: ~20 s on 2 cores
    pytest.mark.skipif(
        not (dist.is_available() and dist.is_gloo_available()),
        reason="this PyTorch build has no torch.distributed with the gloo backend",
    ),
]

ARGS = [
    "--d-model=16", "--n-heads=2", "--n-layers=2", "--d-ff=32", "--max-seq-len=16",
    "--dropout=0", "--batch-size=4", "--grad-accum=2", "--schedule=constant", "--warmup=0",
    "--optimizer=sgd", "--lr=0.3", "--clip-grad-norm=1.0", "--eval-batches=2", "--log-every=1",
    "--no-progress", "--n-experts=4", "--top-k=2", "--moe-d-ff=16", "--aux-loss-weight=0",
    "--z-loss-weight=0.01", "--router-bias-balancing",
    "--router-bias-rate=0.01",
]  # fmt: skip


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _args(root: Path, name: str) -> list[str]:
    return ["train", "shakespeare-char", f"--data={root / 'text.txt'}", *ARGS, "--steps=2",
            "--runs-dir", str(root / "runs"), "--name", name]  # fmt: skip


def _metrics(root: Path, name: str) -> list[dict[str, object]]:
    text = (root / "runs" / name / "metrics.jsonl").read_text()
    return [json.loads(line) for line in text.splitlines()]


def test_ddp_moe_on_two_processes_equals_one_process(tmp_path: Path) -> None:
    words = [
        "to",
        "be",
        "or",
        "not",
        "that",
        "is",
        "the",
        "question",
        "whether",
        "tis",
        "nobler",
        "in",
        "the",
        "mind",
    ]
    text = "\n".join(
        " ".join(words[(i * 7 + j) % len(words)] for j in range(8)) for i in range(300)
    )
    (tmp_path / "text.txt").write_text(text + "\n")
    assert main(_args(tmp_path, "one")) == 0
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    env.update(OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", MASTER_ADDR="127.0.0.1")
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", "--nnodes=1",
               "--master_addr=127.0.0.1", f"--master_port={_free_port()}", "-m", "attnlab",
               *_args(tmp_path, "ddp")]  # fmt: skip
    done = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=180)  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    assert "on 2 processes (gloo)" in done.stdout
    ckpt = Path("checkpoints") / "step_00000002" / "model.safetensors"
    one = load_file(tmp_path / "runs" / "one" / ckpt)
    two = load_file(tmp_path / "runs" / "ddp" / ckpt)
    assert sorted(one) == sorted(two)
    for key in one:
        assert float((one[key].double() - two[key].double()).abs().max()) < 1e-6, key
    biases = [k for k in one if k.endswith("balance_bias")]
    assert len(biases) == 2 and all(one[k].abs().sum() > 0 for k in biases)  # they moved
    logged, reference = _metrics(tmp_path, "ddp"), _metrics(tmp_path, "one")
    train = [(g, w) for g, w in zip(logged, reference, strict=True) if w["split"] == "train"]
    assert len(train) == 2
    for got, want in train:
        assert got["moe_load"] == want["moe_load"]  # the global counts, summed over processes
        for key in ("loss", "aux_loss", "moe_z_loss", "moe_dropped_fraction",
                    "moe_max_load_ratio"):  # fmt: skip
            assert abs(float(got[key]) - float(want[key])) < 1e-6, key  # type: ignore[arg-type]
