"""Shared by the course benchmarks (benchmarks/course_*.py): train a Tiny Shakespeare char LM.

Every course run is the ``shakespeare-char`` recipe (nanoGPT's baby GPT: 4 layers, 4 heads,
d_model 128, context 64, batch 12, AdamW) with a few fields changed, trained by attnlab's
:class:`~attnlab.training.Trainer` with a fixed seed, and evaluated on fixed validation blocks
(the same text for every row). Results go to ``benchmarks/results/course/<name>.{json,md}``.
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import os
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from attnlab.analysis.attention_bench import describe_machine, machine_info
from attnlab.training import NonFiniteLossError, Trainer
from attnlab.training.recipes import prepare

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results" / "course"
QUIET = {"progress": False, "checkpoint_every": 0, "log_every": 10**9}


def data_env() -> None:
    """Point ``ATTNLAB_DATA`` at the shared data beside the checkout (unless it is set)."""
    os.environ.setdefault("ATTNLAB_DATA", str(HERE.parent.parent / "shared" / "data"))


def train_lm(
    overrides: dict[str, Any], setup: Callable[[torch.nn.Module], None] | None = None
) -> dict[str, Any]:
    """Train ``shakespeare-char`` with ``overrides`` (``setup(model)`` runs before training);
    the model, the per-step losses and gradient norms, and how it ended (``diverged_at``: the
    step whose loss was NaN/inf)."""
    data_env()
    prepared = prepare("shakespeare-char", {**QUIET, **overrides})
    if setup is not None:
        setup(prepared.model)
    trainer = Trainer(prepared.model, prepared.objective, prepared.train)
    grad_norms: list[float] = []
    losses: list[float] = []
    step_fn = trainer.train_step

    def recording_step() -> Any:  # each step's loss and gradient norm (before clipping)
        loss, tokens, grad_norm = step_fn()
        losses.append(float(loss))
        grad_norms.append(float(grad_norm))
        return loss, tokens, grad_norm

    trainer.train_step = recording_step  # type: ignore[method-assign]
    t0 = time.perf_counter()
    diverged_at = None
    val_loss = None
    try:
        result = trainer.fit()
        val_loss = result.evals[-1]["val_loss"] if result.evals else None
    except NonFiniteLossError:
        diverged_at = len(grad_norms) + 1
    return {
        "prepared": prepared,
        "model": prepared.model,
        "losses": losses,
        "grad_norms": grad_norms,
        "diverged_at": diverged_at,
        "val_loss": val_loss,
        "wall_s": time.perf_counter() - t0,
    }


@torch.no_grad()
def val_loss_by_position(
    model: torch.nn.Module, stream: Any, length: int, *, n_tokens: int = 16384
) -> list[float]:
    """Mean next-token loss at each position ``0..length-1`` over the first ``n_tokens`` of the
    validation split cut into consecutive blocks of ``length`` (the same text at every length)."""
    val = stream.split("val")
    n_blocks = min(n_tokens, len(val) - 1) // length
    ids = val[: n_blocks * length + 1]
    x = ids[:-1].reshape(n_blocks, length)
    y = ids[1:].reshape(n_blocks, length)
    model.eval()
    total = torch.zeros(length)
    for i in range(0, n_blocks, 16):
        logits, _ = model(x[i : i + 16])
        nll = torch.nn.functional.cross_entropy(
            logits.float().transpose(1, 2), y[i : i + 16], reduction="none"
        )  # (b, length)
        total += nll.sum(0)
    return (total / n_blocks).tolist()


@torch.no_grad()
def val_loss(
    model: torch.nn.Module,
    stream: Any,
    length: int,
    *,
    batch: int,
    train_mode: bool = False,
    n_tokens: int = 16384,
) -> float:
    """Mean next-token loss over the first ``n_tokens`` of the validation split, in blocks of
    ``length`` read ``batch`` at a time; ``train_mode``: with the model in training mode (a
    BatchNorm then normalises with the statistics of each batch; on a copy, so that its
    running statistics are not changed)."""
    val = stream.split("val")
    n_blocks = (min(n_tokens, len(val) - 1) // length) // batch * batch
    ids = val[: n_blocks * length + 1]
    x, y = ids[:-1].reshape(n_blocks, length), ids[1:].reshape(n_blocks, length)
    if train_mode:
        model = copy.deepcopy(model).train()
    else:
        model.eval()
    total = 0.0
    for i in range(0, n_blocks, batch):
        logits, _ = model(x[i : i + batch])
        total += float(
            torch.nn.functional.cross_entropy(
                logits.float().flatten(0, 1), y[i : i + batch].flatten(), reduction="sum"
            )
        )
    return total / (n_blocks * length)


def smooth(values: list[float], every: int) -> list[float]:
    """Means of consecutive groups of ``every`` values (loss curves for the tables)."""
    return [sum(values[i : i + every]) / len(values[i : i + every])
            for i in range(0, len(values), every)]  # fmt: skip


def finite(x: float | None) -> float | None:
    return None if x is None or not math.isfinite(x) else x


def parse(
    script: str, doc: str, steps: int, argv: list[str] | None,
    extra: Callable[[argparse.ArgumentParser], None] | None = None,
) -> tuple[argparse.Namespace, int, str]:  # fmt: skip
    """The command line every course benchmark shares (``--steps``, ``--smoke``, plus ``extra``'s
    arguments): ``(args, steps to train, the command as it ran)``. ``--smoke`` trains 4 steps
    and sends the results to a temporary folder instead of ``RESULTS``."""
    global RESULTS
    p = argparse.ArgumentParser(description=doc.split("\n")[0])
    p.add_argument("--steps", type=int, default=steps)
    p.add_argument("--smoke", action="store_true")
    if extra is not None:
        extra(p)
    args = p.parse_args(argv)
    if args.smoke:
        RESULTS = Path(tempfile.mkdtemp(prefix="course_smoke_"))
    given = " ".join(argv if argv is not None else sys.argv[1:])
    command = f"OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS', '')} python {script} {given}"
    return args, 4 if args.smoke else args.steps, command.strip()


def meta(command: str) -> dict[str, Any]:
    info = machine_info()
    return {**info, "threads": torch.get_num_threads(), "command": command,
            "machine": describe_machine(info, torch.get_num_threads())}  # fmt: skip


def write(name: str, data: dict[str, Any], markdown: str) -> Path:
    """Write ``RESULTS/<name>.json`` and ``.md``; return the JSON's path."""
    RESULTS.mkdir(parents=True, exist_ok=True)
    out = RESULTS / f"{name}.json"
    out.write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")
    (RESULTS / f"{name}.md").write_text(markdown, encoding="utf-8")
    return out
