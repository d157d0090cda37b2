"""Dense vs Mixture-of-Experts baby GPT on Tiny Shakespeare (issue 23): equal steps, equal time.

The ``shakespeare-char`` recipe (nanoGPT's baby GPT: 4 layers, 4 heads, d_model 128, context 64,
batch 12, 2000 AdamW steps, cosine) trained as is (``dense``, FFN width 512) and with every FFN a
mixture of 8 experts of width 256, top-2: the same FFN matmul FLOPs per token (2 x 256 = 512
hidden units per token; the router adds 2·128·8) and 4x the FFN parameters. Rows:

- ``dense``: the recipe;
- ``moe``: 8 experts x 256, top-2, Switch balancing loss weight 0.01 (per layer, summed);
- ``moe-noaux``: the same without any balancing (weight 0), to show what the loss does;
- ``moe-biasfree``: no loss, DeepSeek-V3's aux-loss-free bias balancing (rate 1e-3 per step);
- ``moe-equal-time``: ``moe`` with its step count scaled so that its training time equals the
  ``dense`` row's, from the two rows' measured training times (run ``dense`` and ``moe`` first;
  the cosine schedule is stretched to the new step count, so it completes).

Every row is ``attnlab train shakespeare-char`` with the MoE keys (through
:func:`attnlab.training.recipes.train_recipe`): the trainer adds the aux loss, logs each step's
expert load into the run's ``metrics.jsonl`` (``log_every`` steps apart) and applies the bias
update; the load heatmaps are ``attnlab viz experts``'s (:func:`attnlab.viz.moe.plot_expert_load`).
Each row writes ``RESULTS/runs/moe_shakespeare_<row>/`` and appends to
``RESULTS/moe_shakespeare.json``; the Markdown table is regenerated from it.

    OMP_NUM_THREADS=2 python benchmarks/moe_shakespeare.py dense moe moe-noaux moe-biasfree
    OMP_NUM_THREADS=2 python benchmarks/moe_shakespeare.py moe-equal-time
    python benchmarks/moe_shakespeare.py dense moe moe-equal-time --smoke   # tiny, to check it runs

``--smoke`` trains a 2-layer d_model 32 model for 6 steps per row into a temporary directory
(never over the real results); its numbers mean nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

import torch

from attnlab.analysis import active_params, count_params, forward_flops
from attnlab.analysis.attention_bench import describe_machine, machine_info
from attnlab.training.metrics import read_metrics
from attnlab.training.recipes import train_recipe

ROOT = Path(__file__).resolve().parent
RESULTS = ROOT / "results"
MOE = {"n_experts": 8, "top_k": 2, "moe_d_ff": 256}
ROWS: dict[str, dict[str, Any]] = {
    "dense": {},
    "moe": {**MOE, "aux_loss_weight": 0.01},
    "moe-noaux": {**MOE, "aux_loss_weight": 0.0},
    "moe-biasfree": {**MOE, "aux_loss_weight": 0.0, "router_bias_balancing": True},
    "moe-equal-time": {**MOE, "aux_loss_weight": 0.01},
}
SMOKE = dict(steps=6, warmup=1, eval_every=3, eval_batches=1, log_every=1, d_model=32,
             n_heads=2, n_layers=2, max_seq_len=16, batch_size=4)  # fmt: skip
SMOKE_MOE = {"moe_d_ff": 64}  # half the smoke model's d_ff (128)


def overrides_for(row: str, smoke: bool, previous: dict[str, Any]) -> dict[str, Any]:
    """The recipe overrides of ``row`` (``moe-equal-time``: steps from the measured times)."""
    out: dict[str, Any] = {**ROWS[row], "progress": False, "checkpoint_every": 0}
    if smoke:
        out.update(SMOKE, d_ff=128, **(SMOKE_MOE if row != "dense" else {}))
    if row == "moe-equal-time":
        dense, moe = previous.get("dense"), previous.get("moe")
        if dense is None or moe is None:
            raise SystemExit("moe-equal-time needs the dense and moe rows first")
        out["steps"] = max(2, round(dense["train_s"] / moe["train_s"] * moe["steps"]))
        out["warmup"] = min(out.get("warmup", 100), out["steps"] - 1)
    return out


def load_summary(records: list[dict[str, Any]]) -> dict[str, list[float]]:
    """Per MoE layer, the max/mean load ratio at each logged step."""
    out: dict[str, list[float]] = {}
    for r in records:
        for name, counts in (r.get("moe_load") or {}).items():
            out.setdefault(name, []).append(max(counts) / max(sum(counts) / len(counts), 1e-9))
    return out


def run_row(row: str, smoke: bool, previous: dict[str, Any], out_dir: Path) -> dict[str, Any]:
    overrides = overrides_for(row, smoke, previous)
    run_dir = out_dir / "runs" / f"moe_shakespeare_{row}"
    prepared, result = train_recipe("shakespeare-char", run_dir, overrides, overwrite=True)
    cfg = prepared.model_config
    records = read_metrics(run_dir)
    train = [r for r in records if r["split"] == "train"]
    tok_s = sorted(r["tokens_per_s"] for r in train if "tokens_per_s" in r)
    picture = None
    if any("moe_load" in r for r in train):
        try:
            from attnlab.viz.moe import plot_expert_load

            picture = out_dir / f"moe_shakespeare_load_{row}.png"
            plot_expert_load(train, title=f"{row}: expert load", path=picture)
        except ImportError:  # matplotlib is optional
            picture = None
    final = result.evals[-1]
    ratios = load_summary(train)
    return {
        "row": row,
        "overrides": {k: v for k, v in overrides.items() if k != "progress"},
        "steps": result.step,
        "val_loss": final["val_loss"],
        "best_val_loss": result.best_value,
        "evals": result.evals,
        "train_s": result.elapsed_s,
        "tokens_per_s_median": tok_s[len(tok_s) // 2] if tok_s else None,
        "params_total": count_params(cfg),
        "params_active": active_params(cfg),
        "forward_flops_per_token": forward_flops(cfg, cfg.max_seq_len).forward_per_token,
        "final_max_load_ratio": {name: v[-1] for name, v in ratios.items()},
        "peak_max_load_ratio": {name: max(v) for name, v in ratios.items()},
        "final_dropped_fraction": train[-1].get("moe_dropped_fraction") if train else None,
        "load_picture": picture.name if picture else None,
        "run_dir": str(run_dir),
    }


def markdown(records: dict[str, Any], meta: dict[str, Any], smoke: bool) -> str:
    lines = [
        "# Dense vs MoE baby GPT on Tiny Shakespeare (benchmarks/moe_shakespeare.py)",
        "",
        *(["**SMOKE RUN: tiny model, 6 steps; the numbers mean nothing.**", ""] if smoke else []),
        f"{describe_machine(meta, meta['threads'])}, {meta['date_utc']}. Val loss: the recipe's "
        "20 validation batches; train s: Trainer.fit's training time (evaluations included); "
        "tokens/s: median of the trainer's log lines; load: the busiest expert's share over the "
        "mean (1.00 = balanced), per MoE layer, at the last log line and the worst over the run.",
        "",
        "| row | steps | val loss | best val | train s | tokens/s | params total | active | "
        "fwd FLOP/token | max/mean load: last (peak) |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for r in records.values():
        last, peak = r["final_max_load_ratio"], r["peak_max_load_ratio"]
        load = ", ".join(f"{last[n]:.2f} ({peak[n]:.2f})" for n in last) or "-"
        tok = r["tokens_per_s_median"]
        lines.append(
            f"| {r['row']} | {r['steps']} | {r['val_loss']:.4f} | {r['best_val_loss']:.4f} | "
            f"{r['train_s']:.0f} | {tok:,.0f} | {r['params_total']:,} | {r['params_active']:,} | "
            f"{r['forward_flops_per_token']:,.0f} | {load} |"
        )
    pictures = [r["load_picture"] for r in records.values() if r.get("load_picture")]
    if pictures:
        lines += ["", "Expert load over training: " + ", ".join(f"`{p}`" for p in pictures)]
    lines += ["", f"Command: `{meta['command']}`"]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("rows", nargs="+", choices=list(ROWS))
    p.add_argument("--smoke", action="store_true", help="a tiny model, 6 steps per row")
    args = p.parse_args(argv)
    os.environ.setdefault("ATTNLAB_DATA", str(ROOT.parent.parent / "shared" / "data"))
    # a smoke run writes to a temporary directory, never over the real results
    out_dir = Path(tempfile.mkdtemp(prefix="moe_shakespeare_smoke_")) if args.smoke else RESULTS
    out = out_dir / "moe_shakespeare.json"
    data = json.loads(out.read_text()) if out.is_file() else {"rows": {}}
    threads = os.environ.get("OMP_NUM_THREADS", "")
    command = f"OMP_NUM_THREADS={threads} python benchmarks/moe_shakespeare.py " + " ".join(
        argv if argv is not None else sys.argv[1:]
    )
    meta = {**machine_info(), "threads": torch.get_num_threads(), "command": command}
    for row in args.rows:
        data["rows"][row] = run_row(row, args.smoke, data["rows"], out_dir)
        data["meta"] = meta
        out.write_text(json.dumps(data, indent=2) + "\n")
        (out_dir / "moe_shakespeare.md").write_text(markdown(data["rows"], meta, args.smoke))
        print(json.dumps({k: v for k, v in data["rows"][row].items() if k != "evals"}), flush=True)
    print((out_dir / "moe_shakespeare.md").read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
