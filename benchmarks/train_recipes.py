"""Train the issue-7 recipes at their full budgets and record val metrics and wall times.

    OMP_NUM_THREADS=1 python benchmarks/train_recipes.py shakespeare-char
    OMP_NUM_THREADS=1 python benchmarks/train_recipes.py shakespeare-mlm digits digits-cnn
    python benchmarks/train_recipes.py shakespeare-char --set steps=200    # quick check

Rows:

- ``shakespeare-char``: nanoGPT's baby-GPT CPU setting (4 layers, 4 heads, d_model 128, context
  64, batch 12, dropout 0, 2000 iterations, AdamW lr 1e-3, 100 warmup, cosine to 1e-4) ->
  val loss (20 val batches of 12, like nanoGPT's ``eval_iters=20`` estimate);
- ``shakespeare-char-modern``: the same budget and parameter count with RoPE, SwiGLU, RMSNorm
  (pre-norm);
- ``shakespeare-char-sliding32`` / ``shakespeare-char-linear``: the baby GPT with
  sliding-window attention (32 keys per query, half the context) or linear attention, for issue
  9's quality/speed table;
- ``shakespeare-mlm``: masked-token accuracy on the validation split, with a filled-in sample;
- ``digits`` / ``digits-cnn``: ViT and the CNN baseline; val accuracy (the split used for tuning)
  and test accuracy on the held-out 20%.

Each row writes ``benchmarks/results/runs/<row>/`` (metrics.jsonl, checkpoints) and appends to
``benchmarks/results/train_recipes.json``; a Markdown table and a loss-curve plot of the
Shakespeare rows are regenerated from the JSON. Data: ``$ATTNLAB_DATA`` or ``../shared/data``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parent
RESULTS = ROOT / "results"
RUNS = RESULTS / "runs"
ROWS: dict[str, tuple[str, dict[str, Any]]] = {
    "shakespeare-char": ("shakespeare-char", {}),
    "shakespeare-char-modern": ("shakespeare-char", {"arch": "modern"}),
    # issue 9's quality/speed trade-off: the baby GPT with efficient attention backends
    "shakespeare-char-sliding32": (
        "shakespeare-char",
        {"attn_backend": "sliding_window", "attn_window": 32},
    ),
    "shakespeare-char-linear": ("shakespeare-char", {"attn_backend": "linear"}),
    "shakespeare-mlm": ("shakespeare-mlm", {}),
    "digits": ("digits", {"model": "vit"}),
    "digits-cnn": ("digits", {"model": "cnn"}),
}


def run_row(row: str, extra: dict[str, Any]) -> dict[str, Any]:
    from attnlab.cli.evaluate import mlm_fill_sample
    from attnlab.training.objectives import classification_accuracy
    from attnlab.training.recipes import train_recipe

    recipe, overrides = ROWS[row]
    overrides = {**overrides, "progress": False, **extra}
    run_dir = RUNS / row
    start = time.perf_counter()
    prepared, result = train_recipe(recipe, run_dir, overrides, overwrite=True)
    wall = time.perf_counter() - start
    final = result.evals[-1]
    record: dict[str, Any] = {
        "row": row,
        "recipe": recipe,
        "overrides": overrides,
        "seed": prepared.train.seed,
        "steps": result.step,
        "parameters": sum(p.numel() for p in prepared.model.parameters()),
        "wall_s": round(wall, 1),
        "val_loss": round(final["val_loss"], 4),
        "val_accuracy": round(final["val_accuracy"], 4),
        "command": " ".join(
            [f"OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS', '')}", "python", *sys.argv]
        ),
        "threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "machine": f"{platform.machine()} {os.cpu_count()} cpus, {platform.platform()}",
        "date": time.strftime("%Y-%m-%d %H:%M:%S"),
    }
    if recipe == "digits":
        record["test_accuracy"] = round(
            classification_accuracy(prepared.model, prepared.data.value, "test"), 4
        )
    if recipe == "shakespeare-mlm":
        prepared.model.eval()
        record["sample"] = mlm_fill_sample(prepared)
    return record


def write_report(records: list[dict[str, Any]]) -> None:
    lines = [
        "# Training recipes (issue 7)",
        "",
        "Written by `benchmarks/train_recipes.py`. Wall time is the whole `Trainer.fit` "
        "(training, periodic evaluation, checkpoints) on a shared 2-core machine; noisy.",
        "",
        "| row | params | steps | val loss | val acc | test acc | wall s | threads | command |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in records:
        test = f"{r['test_accuracy']:.2%}" if "test_accuracy" in r else "-"
        lines.append(
            f"| {r['row']} | {r['parameters']:,} | {r['steps']} | {r['val_loss']:.4f} | "
            f"{r['val_accuracy']:.2%} | {test} | "
            f"{r['wall_s']} | {r['threads']} | `{r['command']}` |"
        )
    for r in records:
        if "sample" in r:
            lines += ["", f"Masked-LM sample ({r['row']}):", "", "```", r["sample"], "```"]
    (RESULTS / "train_recipes.md").write_text("\n".join(lines) + "\n")
    shakespeare = [RUNS / r["row"] for r in records if r["recipe"] == "shakespeare-char"]
    if shakespeare:
        try:
            from attnlab.viz.curves import plot_curves

            plot_curves(shakespeare, title="Tiny Shakespeare, char GPT",
                        path=RESULTS / "train_shakespeare_curves.png")  # fmt: skip
        except ImportError:
            pass


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("rows", nargs="+", choices=list(ROWS))
    parser.add_argument("--set", action="append", default=[], help="override KEY=VALUE")
    args = parser.parse_args()
    os.environ.setdefault("ATTNLAB_DATA", str(ROOT.parent.parent / "shared" / "data"))
    from attnlab.cli.overrides import parse_overrides
    from attnlab.cli.train import recipe_types
    from attnlab.training.recipes import get_recipe

    out = RESULTS / "train_recipes.json"
    for row in args.rows:
        types = recipe_types(get_recipe(ROWS[row][0]))
        extra = parse_overrides([f"--{s}" for s in args.set], types)
        record = run_row(row, extra)
        print(json.dumps({k: v for k, v in record.items() if k != "sample"}), flush=True)
        records = json.loads(out.read_text()) if out.is_file() else []  # other processes' rows
        records = [r for r in records if r["row"] != row] + [record]
        out.write_text(json.dumps(records, indent=2) + "\n")
        write_report(records)


if __name__ == "__main__":
    main()
