"""LayerNorm vs BatchNorm in a small Transformer: batch-size sensitivity and the train/eval
discrepancy (course lab 1).

A 2-layer pre-norm baby GPT (``shakespeare-char`` with ``n_layers=2``: d_model 128, 4 heads,
context 64, AdamW lr 1e-3, 50 warmup steps, cosine, seed 0) with ``norm="layernorm"`` or
``norm="batchnorm"`` (attnlab's BatchNorm: each feature normalised over the batch and the tokens,
running statistics in eval mode), trained for the same steps at batch sizes 2, 8 and 32. Each
model is then evaluated on the same 16,384 validation characters (blocks of 64) three ways:

- ``eval``: eval mode, batches of 32 (BatchNorm uses its running statistics);
- ``train-mode``: training mode, batches of the training batch size (BatchNorm uses each batch's
  own statistics, as it did in training);
- ``train-mode, batch 1``: training mode, one sequence at a time.

LayerNorm has no state and no batch dependence (and dropout is 0), so its three numbers agree.

    OMP_NUM_THREADS=1 python benchmarks/course_norms.py
    python benchmarks/course_norms.py --smoke    # 4 steps per row, to a temporary directory

Writes ``benchmarks/results/course/course_norms.{json,md}``.
"""

from __future__ import annotations

import sys
from typing import Any

import course_common as cc

BATCHES = (2, 8, 32)
NORMS = ("layernorm", "batchnorm")
BASE = {"n_layers": 2, "warmup": 50, "eval_every": 0, "eval_batches": 20, "seed": 0}


def run_row(norm: str, batch: int, steps: int, smoke: bool) -> dict[str, Any]:
    over = {**BASE, "norm": norm, "batch_size": batch, "steps": steps}
    if smoke:
        over.update(warmup=1, eval_batches=1, n_layers=1)
    r = cc.train_lm(over)
    stream, model = r["prepared"].data.value, r["model"]
    n = 2048 if smoke else 16384
    return {
        "norm": norm, "batch_size": batch, "overrides": over, "steps": len(r["losses"]),
        "final_train_loss": sum(r["losses"][-50:]) / len(r["losses"][-50:]),
        "val_eval": cc.val_loss(model, stream, 64, batch=32, n_tokens=n),
        "val_train_mode": cc.val_loss(model, stream, 64, batch=batch, train_mode=True,
                                      n_tokens=n),
        "val_train_mode_batch1": cc.val_loss(model, stream, 64, batch=1, train_mode=True,
                                             n_tokens=n),
        "wall_s": r["wall_s"],
    }  # fmt: skip


def markdown(data: dict[str, Any], smoke: bool) -> str:
    m = data["meta"]
    lines = [
        "# LayerNorm vs BatchNorm in a baby GPT (benchmarks/course_norms.py)",
        "",
        *(["**SMOKE RUN: the numbers mean nothing.**", ""] if smoke else []),
        f"{m['machine']}, {m['date_utc']}. 2-layer pre-norm baby GPT on Tiny Shakespeare, "
        f"{data['steps']} steps at each batch size, seed 0. Validation loss (nats per character) "
        "on the same 16,384 characters: eval mode (running statistics), training mode at the "
        "training batch size (each batch's statistics), training mode one sequence at a time.",
        "",
        "| norm | batch | train loss | val, eval mode | val, train mode | "
        "val, train mode, batch 1 |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for r in data["rows"]:
        lines.append(
            f"| {r['norm']} | {r['batch_size']} | {r['final_train_loss']:.3f} | "
            f"{r['val_eval']:.3f} | {r['val_train_mode']:.3f} | {r['val_train_mode_batch1']:.3f} |"
        )
    lines += ["", f"Command: `{m['command']}`; wall time {data['wall_s']:.0f} s in all."]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    args, steps, command = cc.parse("benchmarks/course_norms.py", __doc__, 300, argv)
    data: dict[str, Any] = {"meta": cc.meta(command), "rows": [], "steps": steps,
                            "batch_sizes": list(BATCHES)}  # fmt: skip
    total = 0.0
    for batch in BATCHES:
        for norm in NORMS:
            row = run_row(norm, batch, steps, args.smoke)
            data["rows"].append(row)
            total += row["wall_s"]
            data["wall_s"] = total
            out = cc.write("course_norms", data, markdown(data, args.smoke))
            print({k: v for k, v in row.items() if k != "overrides"}, flush=True)
    print(out.with_suffix(".md").read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
