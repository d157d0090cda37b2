"""Post-norm vs pre-norm, with and without warmup, at the same learning rate (course Q3, lab 3).

A deeper baby GPT (``shakespeare-char`` with 6 layers; d_model 128, 4 heads, context 64, batch
12) trained for the same steps at the same peak learning rate, AdamW, a constant schedule after
the warmup, no gradient clipping, seed 0. Rows: ``{post, pre}-norm × {no warmup, warmup}`` and
post-norm without warmup but with the gradient clipped at 1.0. What is recorded per row: the
training loss (mean of the last 50 steps, and every 25 steps), the validation loss at the end,
the gradient norm of the first steps, and the step where the loss became NaN (if it did).
A char LM that has learned nothing but the letter frequencies sits at about 3.3 nats.

    OMP_NUM_THREADS=1 python benchmarks/course_warmup.py
    python benchmarks/course_warmup.py --smoke    # 4 steps per row, to a temporary directory

Writes ``benchmarks/results/course/course_warmup.{json,md}``.
"""

from __future__ import annotations

import sys
from typing import Any

import course_common as cc

LR = 1e-3
WARMUP = 100
BASE = {"n_layers": 6, "lr": LR, "schedule": "constant", "clip_grad_norm": None,
        "weight_decay": 0.0, "eval_every": 0, "eval_batches": 20, "seed": 0}  # fmt: skip
ROWS: dict[str, dict[str, Any]] = {
    "post-norm, no warmup": {"norm_position": "post", "warmup": 0},
    "post-norm, warmup": {"norm_position": "post", "warmup": WARMUP},
    "pre-norm, no warmup": {"norm_position": "pre", "warmup": 0},
    "pre-norm, warmup": {"norm_position": "pre", "warmup": WARMUP},
    "post-norm, no warmup, clip 1.0": {"norm_position": "post", "warmup": 0,
                                       "clip_grad_norm": 1.0},
}  # fmt: skip


def run_row(name: str, steps: int, smoke: bool) -> dict[str, Any]:
    over = {**BASE, **ROWS[name], "steps": steps}
    if smoke:
        over.update(warmup=min(over["warmup"], 2), eval_batches=1, n_layers=2)
    r = cc.train_lm(over)
    losses = r["losses"]
    tail = losses[-50:]
    return {
        "row": name,
        "overrides": over,
        "steps": len(r["grad_norms"]),
        "diverged_at": r["diverged_at"],
        "final_train_loss": sum(tail) / len(tail) if tail else None,
        "train_loss_every_25": cc.smooth(losses, 25),
        "first_grad_norms": [cc.finite(g) for g in r["grad_norms"][:20]],
        "max_grad_norm_first_100": max((g for g in r["grad_norms"][:100]), default=None),
        "val_loss": r["val_loss"],
        "wall_s": r["wall_s"],
    }


def markdown(data: dict[str, Any], smoke: bool) -> str:
    m = data["meta"]
    lines = [
        "# Post-norm vs pre-norm, warmup or not (benchmarks/course_warmup.py)",
        "",
        *(["**SMOKE RUN: the numbers mean nothing.**", ""] if smoke else []),
        f"{m['machine']}, {m['date_utc']}. 6-layer baby GPT on Tiny Shakespeare, peak lr {LR}, "
        f"AdamW, constant schedule, warmup {WARMUP} linear steps where used, seed 0. Train loss: "
        "mean of the last 50 steps; val loss: 20 validation batches at the end; unigram level "
        "~3.3 nats.",
        "",
        "| row | steps | train loss | val loss | max grad norm (first 100 steps) | NaN at |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for r in data["rows"].values():
        fl = "-" if r["final_train_loss"] is None else f"{r['final_train_loss']:.3f}"
        vl = "-" if r["val_loss"] is None else f"{r['val_loss']:.3f}"
        g = r["max_grad_norm_first_100"]
        lines.append(
            f"| {r['row']} | {r['steps']} | {fl} | {vl} | "
            f"{'-' if g is None else f'{g:.2f}'} | {r['diverged_at'] or '-'} |"
        )
    lines += ["", f"Command: `{m['command']}`; wall time {data['wall_s']:.0f} s in all."]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    args, steps, command = cc.parse("benchmarks/course_warmup.py", __doc__, 300, argv)
    data: dict[str, Any] = {"meta": cc.meta(command), "rows": {}, "lr": LR,
                            "warmup": WARMUP}  # fmt: skip
    total = 0.0
    for name in ROWS:
        data["rows"][name] = run_row(name, steps, args.smoke)
        total += data["rows"][name]["wall_s"]
        data["wall_s"] = total
        out = cc.write("course_warmup", data, markdown(data, args.smoke))
        print(name, {k: data["rows"][name][k] for k in ("final_train_loss", "val_loss",
              "diverged_at", "wall_s")}, flush=True)  # fmt: skip
    print(out.with_suffix(".md").read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
