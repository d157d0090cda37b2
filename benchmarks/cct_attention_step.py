"""The CCT's training step under bf16 autocast with each attention path (issue 25).

Rows, each the ``cifar10`` recipe's ``Trainer.train_step`` (augmented batch of 128, forward,
backward, clipping, AdamW) in this process, ``--precision bf16 --channels-last``:

- ``sdpa``: PyTorch's fused attention, which the CPU mixed modes run in float32
  (:func:`attnlab.transforms.float32_attention`: its 16-bit backward is slow on the CPU);
- ``math``: the readable path, left under autocast: its two products in bfloat16, its scores,
  masking and softmax in float32.

For ``cct-cifar`` and ``cct-cifar-small``: the median seconds per step over ``--rounds`` rounds
of ``--repeats`` steps, the rows' order rotated each round, and the ratio sdpa / math.

    python benchmarks/cct_attention_step.py            # ~2 minutes, alone on the machine
    python benchmarks/cct_attention_step.py --smoke    # tiny, to /tmp (the numbers mean nothing)

Results: ``benchmarks/results/cct_attention_step.{md,json}``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path
from typing import Any

import torch

from attnlab.analysis.attention_bench import describe_machine, machine_info
from attnlab.training.recipes import prepare
from attnlab.training.trainer import Trainer

RESULTS = Path(__file__).resolve().parent / "results"
PRESETS = ("cct-cifar", "cct-cifar-small")
BACKENDS = ("sdpa", "math")


def trainer(preset: str, backend: str, smoke: bool) -> Trainer:
    over: dict[str, Any] = {
        "model": preset, "attn_backend": backend, "precision": "bf16", "channels_last": True,
        "batch_size": 16 if smoke else 128, "steps": 1000, "progress": False,
        "train_per_class": 20 if smoke else 200, "val_per_class": 5, "test_per_class": 5,
    }  # fmt: skip
    if smoke:
        over.update({"d_model": 32, "d_ff": 64, "n_layers": 1})
    p = prepare("cifar10", over)
    return Trainer(p.model, p.objective, p.train)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--smoke", action="store_true")
    args = ap.parse_args()
    if args.smoke:
        args.rounds, args.repeats = 2, 1
    torch.set_num_threads(args.threads)
    out = Path("/tmp/attnlab_cct_attention_step") if args.smoke else RESULTS
    out.mkdir(parents=True, exist_ok=True)
    rows = [(preset, backend) for preset in PRESETS for backend in BACKENDS]
    trainers = {row: trainer(*row, args.smoke) for row in rows}
    for t in trainers.values():  # warm-up: first-call allocations, oneDNN primitives
        t.train_step()
        t.train_step()
    times: dict[tuple[str, str], list[float]] = {row: [] for row in rows}
    for r in range(args.rounds):
        for row in rows[r % len(rows) :] + rows[: r % len(rows)]:
            start = time.perf_counter()
            for _ in range(args.repeats):
                trainers[row].train_step()
            times[row].append((time.perf_counter() - start) / args.repeats)
    median = {row: statistics.median(v) for row, v in times.items()}
    result = {
        "meta": {**machine_info(), "threads": args.threads},
        "rows": [
            {"preset": p, "backend": b, "s_per_step": round(median[(p, b)], 4)} for p, b in rows
        ],
        "sdpa_over_math": {p: round(median[(p, "sdpa")] / median[(p, "math")], 3) for p in PRESETS},
    }
    (out / "cct_attention_step.json").write_text(json.dumps(result, indent=1) + "\n")
    lines = [
        "# The CCT's bf16 train step by attention path (benchmarks/cct_attention_step.py)",
        "",
        f"{describe_machine(result['meta'], args.threads)}, {result['meta']['date_utc']}. "
        "Batch 128, `--precision bf16 --channels-last`, "
        f"median of {args.rounds} rounds x {args.repeats} steps, rows interleaved.",
        "",
        "| preset | sdpa (float32) s/step | math (bf16 products) s/step | sdpa / math |",
        "|---|---|---|---|",
    ]
    for p in PRESETS:
        lines.append(
            f"| `{p}` | {median[(p, 'sdpa')]:.4f} | {median[(p, 'math')]:.4f} | "
            f"{result['sdpa_over_math'][p]:.3f} |"
        )
    (out / "cct_attention_step.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
