"""Learned / sinusoidal / RoPE / ALiBi char LMs on Tiny Shakespeare: quality at the trained
length and at 2x and 4x it (course lab 2, lab 3).

Every row is the ``shakespeare-char`` baby GPT (4 layers, 4 heads, d_model 128, batch 12,
AdamW lr 1e-3, 100 warmup steps, cosine, seed 0) trained on blocks of ``T = 64`` characters for
the same steps; only ``pos_encoding`` differs. Then each model reads the same validation text
cut into blocks of 64, 128 and 256 characters, and the mean next-character loss is recorded
over the whole block and over its positions ``>= 64`` (the ones never seen in training), with
the loss at every position for the plot.

``sinusoidal-scaled`` is the paper's recipe (§3.4): the token embeddings drawn with standard
deviation ``d_model**-0.5`` and multiplied by ``sqrt(d_model)``, so that tokens and sinusoids have
the same scale; the GPT default (embeddings at std 0.02, not scaled) leaves the tokens 50 times
smaller than the sinusoids they are added to.

``learned`` has a table of exactly 64 positions: it cannot read a longer block (attnlab raises
the error recorded in the JSON). ``learned-256`` gives the table 256 rows but trains only the
first 64 (only they are ever used), to show what the untrained rows do.

    OMP_NUM_THREADS=1 python benchmarks/course_positional.py
    python benchmarks/course_positional.py --smoke    # 4 steps per row, to a temporary directory

Writes ``benchmarks/results/course/course_positional.{json,md}``.
"""

from __future__ import annotations

import json
import math
import sys
from typing import Any

import course_common as cc
import torch

T = 64
LENGTHS = (T, 2 * T, 4 * T)
ROWS: dict[str, dict[str, Any]] = {
    "learned": {"pos_encoding": "learned", "max_seq_len": T},
    "learned-256": {"pos_encoding": "learned", "max_seq_len": 4 * T, "block_size": T},
    "sinusoidal": {"pos_encoding": "sinusoidal", "max_seq_len": T},
    "sinusoidal-scaled": {"pos_encoding": "sinusoidal", "max_seq_len": T},
    "rope": {"pos_encoding": "rope", "max_seq_len": T},
    "alibi": {"pos_encoding": "alibi", "max_seq_len": T},
}
BASE = {"eval_every": 0, "eval_batches": 20, "seed": 0}


def paper_embeddings(model: Any) -> None:
    """§3.4: token embeddings ~ N(0, 1/d) times sqrt(d) (the LM head, tied, sees the table)."""
    d = model.config.d_model
    model.tok_embed.scale = math.sqrt(d)
    torch.nn.init.normal_(model.tok_embed.weight, std=d**-0.5)


SETUP = {"sinusoidal-scaled": paper_embeddings}


def run_row(name: str, steps: int, smoke: bool) -> dict[str, Any]:
    over = {**BASE, **ROWS[name], "steps": steps}
    if smoke:
        over.update(warmup=1, eval_batches=1, n_layers=1)
    r = cc.train_lm(over, SETUP.get(name))
    stream = r["prepared"].data.value
    n_tokens = 1024 if smoke else 16384
    by_length: dict[str, Any] = {}
    for L in LENGTHS:
        try:
            pos = cc.val_loss_by_position(r["model"], stream, L, n_tokens=n_tokens)
        except ValueError as e:  # the learned table is too short
            by_length[str(L)] = {"error": str(e)}
            continue
        beyond = pos[T:]
        by_length[str(L)] = {
            "loss": sum(pos) / len(pos),
            "loss_beyond_trained": sum(beyond) / len(beyond) if beyond else None,
            "loss_by_position_every_8": cc.smooth(pos, 8),
        }
    return {
        "row": name, "overrides": over, "steps": len(r["losses"]), "val_loss": r["val_loss"],
        "final_train_loss": sum(r["losses"][-50:]) / len(r["losses"][-50:]),
        "by_length": by_length, "wall_s": r["wall_s"],
    }  # fmt: skip


def cell(x: dict[str, Any], key: str) -> str:
    return "cannot run" if "error" in x else f"{x[key]:.3f}"


def markdown(data: dict[str, Any], smoke: bool) -> str:
    m = data["meta"]
    lines = [
        "# Positional encodings: trained length and 2x / 4x it (benchmarks/course_positional.py)",
        "",
        *(["**SMOKE RUN: the numbers mean nothing.**", ""] if smoke else []),
        f"{m['machine']}, {m['date_utc']}. Baby GPT (4 layers, d_model 128) on Tiny Shakespeare, "
        f"trained on {T}-character blocks for {data['steps']} steps, seed 0. Loss: mean "
        "next-character cross-entropy (nats) over the same 16,384 validation characters cut "
        "into blocks of each length; 'beyond': positions >= 64 only.",
        "",
        "| PE | loss @64 | loss @128 | beyond 64 @128 | loss @256 | beyond 64 @256 |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for r in data["rows"].values():
        b = r["by_length"]
        lines.append(
            f"| {r['row']} | {cell(b['64'], 'loss')} | {cell(b['128'], 'loss')} | "
            f"{cell(b['128'], 'loss_beyond_trained')} | {cell(b['256'], 'loss')} | "
            f"{cell(b['256'], 'loss_beyond_trained')} |"
        )
    errors = {r["row"]: r["by_length"]["128"]["error"] for r in data["rows"].values()
              if "error" in r["by_length"]["128"]}  # fmt: skip
    for row, err in errors.items():
        lines += ["", f"`{row}` at 128: `{err}`"]
    commands = "; ".join(f"`{c}`" for c in data["commands"])
    lines += ["", f"Commands: {commands}; wall time {data['wall_s']:.0f} s in all."]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    args, steps, command = cc.parse(
        "benchmarks/course_positional.py",
        __doc__,
        400,
        argv,
        lambda p: p.add_argument(
            "rows", nargs="*", choices=[*ROWS, []], help="default: all; others are kept"
        ),
    )
    old = cc.RESULTS / "course_positional.json"
    data: dict[str, Any] = {"rows": {}, "wall_s": 0.0}
    if args.rows and old.is_file():  # add or redo these rows, keep the others
        data = json.loads(old.read_text())
    commands = [*data.get("commands", []), command]
    data.update(meta=cc.meta(command), commands=commands, trained_length=T,
                lengths=list(LENGTHS), steps=steps)  # fmt: skip
    total = data["wall_s"]
    for name in args.rows or ROWS:
        data["rows"][name] = row = run_row(name, steps, args.smoke)
        data["rows"] = {k: data["rows"][k] for k in ROWS if k in data["rows"]}  # table order
        total += row["wall_s"]
        data["wall_s"] = total
        out = cc.write("course_positional", data, markdown(data, args.smoke))
        print(name, row["val_loss"], {L: v.get("loss") for L, v in row["by_length"].items()},
              f"{row['wall_s']:.0f}s", flush=True)  # fmt: skip
    print(out.with_suffix(".md").read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
