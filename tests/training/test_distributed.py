"""Data-parallel training under torchrun (issue 11): 2 CPU processes (gloo, loopback) train the
same tiny GPT as 1 process with the same global batch and seed, to 1e-6.

- DDP: ``torchrun --nproc_per_node=2 -m attnlab train shakespeare-char ...`` for 2 steps equals
  the single-process run (weights, and the logged loss / gradient norm / validation loss, which
  are reduced over the processes; rank 0 alone logs).
- Resume across world sizes: that 2-process checkpoint resumed by 1 process for 2 more steps
  equals a 4-step single-process run; and a 1-process checkpoint resumed by 2 FSDP2 processes
  (weights and optimizer state broadcast and re-sharded, then gathered again to save) also
  equals it, optimizer state included.
- A rank that raises makes the job exit non-zero promptly, with its error in the log.

The equality runs use SGD with momentum: its update is linear in the gradient, so the only
difference between 1 and 2 processes (the order of float sums) stays at rounding level. Adam
divides by sqrt(v) and turns rounding noise in near-zero gradients (attention's q/k at init)
into ~lr-sized updates, so it is not comparable to 1e-6 (resume with Adam is bitwise, see
test_resume.py). Dropout is 0. Each torchrun launch costs ~10 s here (three Python processes
import torch on 2 cores).
"""

from __future__ import annotations

import json
import os
import random
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
from safetensors.torch import load_file

from attnlab.cli import main
from attnlab.data.text import TokenStream
from attnlab.models import GPT, GPTConfig
from attnlab.training.config import TrainConfig
from attnlab.training.distributed import DistributedContext, rank_seed
from attnlab.training.objectives import CausalLMObjective
from attnlab.training.trainer import Trainer

pytestmark = [
    pytest.mark.usefixtures("one_thread"),
    pytest.mark.skipif(
        not (dist.is_available() and dist.is_gloo_available()),
        reason="this PyTorch build has no torch.distributed with the gloo backend",
    ),
]

TOL = 1e-6
ARGS = [
    "--d_model=16", "--n_heads=2", "--n_layers=2", "--d_ff=32", "--max_seq_len=16",
    "--dropout=0", "--batch_size=4", "--grad_accum=2", "--schedule=constant", "--warmup=0",
    "--optimizer=sgd", "--lr=0.3", "--weight_decay=0.1", "--clip_grad_norm=1.0",
    "--eval_batches=2", "--log_every=1", "--no-progress",
]  # fmt: skip
LAUNCH_TIMEOUT_S = 180  # a hung collective would wait 30 min (gloo's default timeout)


# -- helpers -------------------------------------------------------------------------------------


def _text() -> str:
    rng = random.Random(0)
    words = ["to", "be", "or", "not", "that", "is", "the", "question", "whether", "tis", "in"]
    lines = (" ".join(rng.choice(words) for _ in range(rng.randint(3, 9))) for _ in range(400))
    return "\n".join(lines) + "\n"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _torchrun(target: list[str], cwd: Path) -> tuple[subprocess.CompletedProcess[str], float]:
    """``torchrun --nproc_per_node=2 TARGET`` on loopback; returns the process and seconds."""
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    env.update(OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", MASTER_ADDR="127.0.0.1")
    command = [
        sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", "--nnodes=1",
        "--master_addr=127.0.0.1", f"--master_port={_free_port()}", *target,
    ]  # fmt: skip
    start = time.monotonic()
    try:
        done = subprocess.run(
            command, cwd=cwd, env=env, capture_output=True, text=True, timeout=LAUNCH_TIMEOUT_S
        )
    except subprocess.TimeoutExpired as e:
        pytest.fail(f"torchrun did not finish within {LAUNCH_TIMEOUT_S} s (a hang): {e.output}")
    return done, time.monotonic() - start


def _train_args(root: Path, name: str, steps: int, *extra: str) -> list[str]:
    return [
        "train", "shakespeare-char", f"--data={root / 'text.txt'}", *ARGS, f"--steps={steps}",
        "--runs-dir", str(root / "runs"), "--name", name, *extra,
    ]  # fmt: skip


def _checkpoint(root: Path, name: str, step: int) -> Path:
    return root / "runs" / name / "checkpoints" / f"step_{step:08d}"


def _max_diff(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    assert sorted(a) == sorted(b)
    return max(float((a[k].double() - b[k].double()).abs().max()) for k in a)


def _metrics(root: Path, name: str) -> list[dict[str, Any]]:
    text = (root / "runs" / name / "metrics.jsonl").read_text()
    return [json.loads(line) for line in text.splitlines()]


def _optimizer_tensors(checkpoint: Path) -> dict[str, torch.Tensor]:
    tensors = load_file(checkpoint / "trainer_state.safetensors")
    return {k: v for k, v in tensors.items() if k.startswith("/optimizer/")}


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A text file and the single-process reference runs (2 and 4 steps, in this process)."""
    root = tmp_path_factory.mktemp("distributed")
    (root / "text.txt").write_text(_text())
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    for steps in (2, 4):
        assert main(_train_args(root, f"one{steps}", steps)) == 0
    torch.set_num_threads(n)
    return root


@pytest.fixture(scope="module")
def ddp_run(root: Path) -> tuple[subprocess.CompletedProcess[str], float]:
    """2 processes, DDP, 2 steps, through the unchanged command line."""
    return _torchrun(["-m", "attnlab", *_train_args(root, "ddp", 2)], cwd=root)


# -- in-process pieces ---------------------------------------------------------------------------


def test_global_batch_must_divide_over_the_processes() -> None:
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=11, d_model=8, n_heads=2, n_layers=1, d_ff=16,
                          max_seq_len=4, eos_id=None))  # fmt: skip
    objective = CausalLMObjective(TokenStream(torch.arange(100) % 11), block_size=4)
    config = TrainConfig(steps=2, batch_size=4, grad_accum=3, schedule="constant", warmup=0)
    with pytest.raises(ValueError, match=r"batch_size=4 .* not divisible by the world size 3"):
        Trainer(model, objective, config, distributed=DistributedContext(rank=0, world_size=3))
    assert config.per_rank_batch_size(2) == 2 and config.examples_per_step == 12


def test_rank_zero_is_seeded_like_a_single_process() -> None:
    assert rank_seed(5, 0) == 5
    seeds = {rank_seed(5, r) for r in range(4)} | {rank_seed(5, 1, step=3)}
    assert len(seeds) == 5 and all(0 <= s < 2**63 for s in seeds)
    with pytest.raises(ValueError, match="rank=2, world_size=2"):
        DistributedContext(rank=2, world_size=2)


# -- torchrun ------------------------------------------------------------------------------------


def test_ddp_on_two_processes_equals_one_process(
    root: Path, ddp_run: tuple[subprocess.CompletedProcess[str], float]
) -> None:
    done, seconds = ddp_run
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.count("trained to step 2") == 1  # only rank 0 prints
    assert "on 2 processes (gloo)" in done.stdout
    two = load_file(_checkpoint(root, "ddp", 2) / "model.safetensors")
    one = load_file(_checkpoint(root, "one2", 2) / "model.safetensors")
    assert _max_diff(two, one) < TOL
    assert _max_diff(two, {k: torch.zeros_like(v) for k, v in one.items()}) > 0.1  # it trained
    # metrics are reduced over both processes and logged once (rank 0): equal to one process's
    logged, reference = _metrics(root, "ddp"), _metrics(root, "one2")
    assert [r["step"] for r in logged] == [1, 2, 2]
    for got, want in zip(logged, reference, strict=True):
        for key in ("train_loss", "grad_norm", "val_loss", "val_accuracy"):
            if key in want:
                assert abs(got[key] - want[key]) < TOL, (key, got, want)
    state = json.loads((_checkpoint(root, "ddp", 2) / "trainer_state.json").read_text())
    assert state["state"]["world_size"] == 2
    print(f"DDP launch: {seconds:.1f} s")


def test_resume_with_one_process_from_two(
    root: Path, ddp_run: tuple[subprocess.CompletedProcess[str], float]
) -> None:
    assert ddp_run[0].returncode == 0, ddp_run[0].stderr
    shutil.copytree(root / "runs" / "ddp", root / "runs" / "ddp_then_one")
    assert main(_train_args(root, "ddp_then_one", 4, "--resume")) == 0
    resumed = load_file(_checkpoint(root, "ddp_then_one", 4) / "model.safetensors")
    reference = load_file(_checkpoint(root, "one4", 4) / "model.safetensors")
    assert _max_diff(resumed, reference) < TOL
    optimizer = _optimizer_tensors(_checkpoint(root, "ddp_then_one", 4))
    assert _max_diff(optimizer, _optimizer_tensors(_checkpoint(root, "one4", 4))) < TOL


def test_fsdp_on_two_processes_resumes_one_process_run(root: Path) -> None:
    try:
        from torch.distributed.fsdp import fully_shard  # noqa: F401
    except ImportError as e:
        pytest.skip(f"FSDP2 (torch.distributed.fsdp.fully_shard) is missing: {e}")
    shutil.copytree(root / "runs" / "one2", root / "runs" / "one_then_fsdp")
    target = ["-m", "attnlab", *_train_args(root, "one_then_fsdp", 4, "--resume", "--fsdp")]
    done, seconds = _torchrun(target, cwd=root)
    assert done.returncode == 0, done.stdout + done.stderr
    checkpoint = _checkpoint(root, "one_then_fsdp", 4)
    reference = _checkpoint(root, "one4", 4)
    weights = load_file(checkpoint / "model.safetensors")
    assert _max_diff(weights, load_file(reference / "model.safetensors")) < TOL
    momentum = _optimizer_tensors(checkpoint)  # gathered from the shards, keyed by name
    # one buffer per parameter: the tied embedding/lm_head once, like in the weights file
    assert (
        len(momentum) == len(weights)
        and "/optimizer/state/tok_embed.weight/momentum_buffer" in momentum
    )
    assert _max_diff(momentum, _optimizer_tensors(reference)) < TOL
    logged = [r for r in _metrics(root, "one_then_fsdp") if r["step"] > 2 and "grad_norm" in r]
    wanted = [r for r in _metrics(root, "one4") if r["step"] > 2 and "grad_norm" in r]
    assert len(logged) == len(wanted) == 2
    assert all(
        abs(a["grad_norm"] - b["grad_norm"]) < TOL for a, b in zip(logged, wanted, strict=True)
    )
    print(f"FSDP launch: {seconds:.1f} s")


FAILING = """
import os, sys
from attnlab.cli import main
from attnlab.training import objectives

if os.environ["RANK"] == "1":  # rank 1 dies in the middle of step 2; rank 0 is in a collective
    real, calls = objectives.CausalLMObjective.loss, []

    def loss(self, *args, **kwargs):
        calls.append(1)
        if len(calls) == 3:
            raise RuntimeError("boom on rank 1")
        return real(self, *args, **kwargs)

    objectives.CausalLMObjective.loss = loss
sys.exit(main(sys.argv[1:]))
"""


def test_a_failing_rank_stops_the_job_promptly(root: Path) -> None:
    script = root / "failing.py"
    script.write_text(FAILING)
    done, seconds = _torchrun([str(script), *_train_args(root, "failing", 4)], cwd=root)
    assert done.returncode != 0
    log = done.stdout + done.stderr
    assert "RuntimeError: boom on rank 1" in log
    assert "rank      : 1" in log  # torchrun's report names the failing rank
    assert seconds < 120, f"the job took {seconds:.0f} s to stop"
    print(f"failing launch: {seconds:.1f} s")


def test_ddp_with_muon_and_every_option_equals_one_process(root: Path) -> None:
    """Muon (issue 51) under DDP: every process orthogonalises the same all-reduced momentum;
    with every speedrun architecture option, both warmups and the iteration's own options
    (4 steps, in bfloat16) on (each process computes its half of the cut batch)."""
    muon = (
        "--optimizer=muon", "--muon-lr=0.05", "--lr=0.01", "--bias=false", "--qk_norm",
        "--activation=relu2", "--logit_softcap=30", "--zero_init_proj", "--no-tie_output",
        "--value_embeddings=1", "--x0_skip", "--pos_encoding=rope", "--norm=rmsnorm",
        "--batch_warmup=2", "--batch_warmup_start=2", "--batch_warmup_multiple=2",
        "--seq_warmup=2", "--seq_warmup_start=8", "--muon_ns_steps=4", "--muon_ns_dtype=bfloat16",
    )  # fmt: skip
    torch.set_num_threads(1)
    assert main(_train_args(root, "muon_one", 2, *muon)) == 0
    done, _ = _torchrun(["-m", "attnlab", *_train_args(root, "muon_ddp", 2, *muon)], cwd=root)
    assert done.returncode == 0, done.stdout + done.stderr
    two = load_file(_checkpoint(root, "muon_ddp", 2) / "model.safetensors")
    one = load_file(_checkpoint(root, "muon_one", 2) / "model.safetensors")
    print(f"max |2 processes - 1 process| = {_max_diff(two, one):.2e}")
    assert _max_diff(two, one) < TOL
    assert "Muon + AdamW" in done.stdout
