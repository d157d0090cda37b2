"""The trainer on a GPU: every recipe, each precision, with and without compile and checkpointing.

For each recipe (``attnlab train NAME``) and each setting — precision ``fp32``, ``bf16-mixed``,
``fp16-mixed``, ``bf16``, each eager, compiled (``compile=True``), activation-checkpointed
(every block) and both — the script trains the recipe's model for a few steps from the same
seed on the same batches and records the loss of every step, tokens/s over the steps after the
first (the compile warm-up is reported apart, as ``compile_s``), and the peak memory
(``torch.cuda.max_memory_allocated``; on the CPU none is measured). Each row's mean loss over its
steps is checked against the fp32 eager row of its recipe: within ``TOLERANCE`` (relative) for
the mixed modes, ``BF16_TOLERANCE`` for pure bf16 (its updates are coarser). Rows that cannot run
here are listed as skipped with the reason (no CUDA device; no data for the recipe).

    python benchmarks/gpu_check.py                 # on a CUDA machine: every recipe, ~10 min
    python benchmarks/gpu_check.py --steps 50      # longer curves
    python benchmarks/gpu_check.py --smoke         # seconds: tiny models, CPU rows, no compile

Results: ``benchmarks/results/gpu_check.{md,json}`` (``--smoke`` writes to /tmp unless ``--out``).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
import traceback
from pathlib import Path
from typing import Any

import torch

from attnlab.analysis.attention_bench import describe_machine, machine_info
from attnlab.training import Trainer
from attnlab.training.recipes import RECIPES, prepare

RESULTS = Path(__file__).resolve().parent / "results"
PRECISIONS = ("fp32", "bf16-mixed", "fp16-mixed", "bf16")
VARIANTS = {"eager": {}, "compile": {"compile": True},
            "checkpointing": {"activation_checkpointing": 1},
            "compile+checkpointing": {"compile": True, "activation_checkpointing": 1}}  # fmt: skip
TOLERANCE = 0.02  # mean loss of a mixed-precision row vs fp32, relative
BF16_TOLERANCE = 0.10
# per recipe: small data for the check (a few steps; the model is the recipe's own)
BASE: dict[str, dict[str, Any]] = {
    "cifar10": {"train_per_class": 100, "val_per_class": 10, "test_per_class": 10,
                "n_val": 100, "model": "vit-cifar"},
    "translate": {"max_tokens": 2000},
}  # fmt: skip
SMOKE: dict[str, dict[str, Any]] = {
    "reverse": {"d_model": 32, "n_heads": 2, "n_layers": 1, "d_ff": 64, "batch_size": 8,
                "min_len": 3, "max_len": 6},
    "shakespeare-char": {"d_model": 32, "n_heads": 2, "n_layers": 2, "d_ff": 64,
                         "batch_size": 4, "block_size": 32, "max_seq_len": 32},
}  # fmt: skip


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--recipes", default="", help="comma-separated (default: every recipe)")
    p.add_argument("--precisions", default=",".join(PRECISIONS))
    p.add_argument("--variants", default=",".join(VARIANTS))
    p.add_argument("--steps", type=int, default=None, help="steps per row (20; --smoke: 4)")
    p.add_argument("--device", default="cuda", help="cuda, cuda:N (CPU rows: --smoke)")
    p.add_argument("--smoke", action="store_true", help="tiny models on the CPU, no compile")
    p.add_argument("--out", type=Path, default=None, help=f"results directory ({RESULTS})")
    return p.parse_args()


def cuda_reason(device: str) -> str | None:
    """Why CUDA rows cannot run here (``None``: they can)."""
    if not torch.cuda.is_available():
        build = f"CUDA {torch.version.cuda}" if torch.version.cuda else "a CPU-only build"
        return f"no CUDA device (torch {torch.__version__}, {build})"
    index = torch.device(device).index or 0
    if index >= torch.cuda.device_count():
        return f"{device}: only {torch.cuda.device_count()} CUDA device(s)"
    return None


def run_row(recipe: str, overrides: dict[str, Any], device: torch.device) -> dict[str, Any]:
    """Train one row; its losses, throughput, compile time and peak memory."""
    prepared = prepare(recipe, {**overrides, "progress": False, "eval_every": 0})
    trainer = Trainer(prepared.model, prepared.objective, prepared.train,
                      callbacks=prepared.callbacks,
                      d_model=getattr(prepared.model_config, "d_model", None))  # fmt: skip
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    steps, losses, tokens, times = prepared.train.steps or 1, [], 0, []
    if trainer.config.compile:
        trainer.compile_s = trainer._compile_warm_up()
    trainer.model.train()
    for i in range(steps):
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        start = time.perf_counter()
        loss, n, _ = trainer.train_step()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        if i > 0:  # the first step allocates and (eager) warms up
            times.append(time.perf_counter() - start)
            tokens += n
        losses.append(loss)
    peak = torch.cuda.max_memory_allocated(device) if device.type == "cuda" else None
    return {
        "losses": losses,
        "mean_loss": statistics.fmean(losses),
        "tokens_per_s": tokens / sum(times) if times else None,
        "compile_s": trainer.compile_s,
        "peak_bytes": peak,
        "skipped_steps": trainer.precision.skipped,
        "setup": trainer.setup_info(),
    }


def check(row: dict[str, Any], reference: dict[str, Any] | None) -> str:
    """``ok`` / ``FAIL (...)`` of a row's mean loss against its recipe's fp32 eager row."""
    if reference is None or "mean_loss" not in reference:
        return "no fp32 reference"
    tol = BF16_TOLERANCE if row["precision"] == "bf16" else TOLERANCE
    gap = abs(row["mean_loss"] - reference["mean_loss"]) / abs(reference["mean_loss"])
    row["relative_gap"] = gap
    return "ok" if gap <= tol else f"FAIL (gap {gap:.3f} > {tol})"


def rows_for(args: argparse.Namespace) -> list[dict[str, Any]]:
    """Every (recipe, precision, variant) row to run, with its overrides or the skip reason."""
    names = args.recipes.split(",") if args.recipes else list(SMOKE if args.smoke else RECIPES)
    device = "cpu" if args.smoke else args.device
    reason = None if args.smoke else cuda_reason(device)
    rows = []
    for name in names:
        for precision in args.precisions.split(","):
            for variant in args.variants.split(","):
                row: dict[str, Any] = {"recipe": name, "precision": precision,
                                       "variant": variant, "device": device}  # fmt: skip
                over = {**(SMOKE if args.smoke else BASE).get(name, {}), **VARIANTS[variant],
                        "precision": precision, "device": device, "steps": args.steps,
                        "warmup": 1, "checkpoint_every": 0}  # fmt: skip
                if reason is not None:
                    row["skipped"] = reason
                elif args.smoke and "compile" in variant:
                    row["skipped"] = "--smoke: no compile on the CPU (about a minute per model)"
                row["overrides"] = over
                rows.append(row)
    return rows


def run_all(rows: list[dict[str, Any]]) -> None:
    """Run the rows in place (a failure is recorded as the row's error, the rest go on)."""
    reference: dict[str, dict[str, Any]] = {}
    for row in rows:
        if "skipped" in row:
            continue
        try:
            row.update(run_row(row["recipe"], row["overrides"], torch.device(row["device"])))
        except FileNotFoundError as e:  # the recipe's data is not on this machine
            row["skipped"] = f"no data: {str(e).splitlines()[0][:200]}"
            continue
        except (ValueError, RuntimeError, TypeError) as e:
            row["error"] = f"{type(e).__name__}: {str(e).splitlines()[0][:200]}"
            traceback.print_exc(file=sys.stderr)
            continue
        if row["precision"] == "fp32" and row["variant"] == "eager":
            reference[row["recipe"]] = row
        row["check"] = check(row, reference.get(row["recipe"]))
        print(f"{row['recipe']:<18} {row['precision']:<11} {row['variant']:<22} "
              f"loss {row['mean_loss']:.4f} {row['check']}", flush=True)  # fmt: skip


def _cell(value: Any, fmt: str) -> str:
    return "-" if value is None else format(value, fmt)


def markdown(rows: list[dict[str, Any]], meta: dict[str, Any], steps: int) -> str:
    lines = [
        "# The trainer on a GPU (benchmarks/gpu_check.py)", "",
        f"{describe_machine(meta)}; {steps} steps per row from the same seed and batches; "
        f"mean loss checked against the recipe's fp32 eager row (relative tolerance "
        f"{TOLERANCE}, pure bf16 {BF16_TOLERANCE}).", "",
        "| recipe | precision | variant | mean loss | check | tokens/s | compile s | peak MiB "
        "| skipped steps |", "|---|---|---|---|---|---|---|---|---|",
    ]  # fmt: skip
    for r in rows:
        if "skipped" in r or "error" in r:
            why = r.get("skipped") or r.get("error")
            lines.append(f"| {r['recipe']} | {r['precision']} | {r['variant']} | - | "
                         f"skipped: {why} | - | - | - | - |")  # fmt: skip
            continue
        peak = None if r["peak_bytes"] is None else r["peak_bytes"] / 2**20
        lines.append(
            f"| {r['recipe']} | {r['precision']} | {r['variant']} | {r['mean_loss']:.4f} | "
            f"{r['check']} | {_cell(r['tokens_per_s'], ',.0f')} | {_cell(r['compile_s'], '.1f')}"
            f" | {_cell(peak, ',.0f')} | {r['skipped_steps']} |"
        )
    return "\n".join(lines) + "\n"


def main() -> int:
    args = parse_args()
    if args.steps is None:
        args.steps = 4 if args.smoke else 20
    out = args.out or (Path("/tmp/attnlab_gpu_check") if args.smoke else RESULTS)
    out.mkdir(parents=True, exist_ok=True)
    meta = machine_info()
    meta["command"] = "python benchmarks/gpu_check.py " + " ".join(sys.argv[1:])
    if torch.cuda.is_available():
        meta["gpu"] = torch.cuda.get_device_name(0)
    rows = rows_for(args)
    run_all(rows)
    for r in rows:
        r.pop("overrides", None)
    (out / "gpu_check.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1) + "\n")
    (out / "gpu_check.md").write_text(markdown(rows, meta, args.steps))
    print(f"wrote {out / 'gpu_check.md'} and .json")
    failed = [r for r in rows if str(r.get("check", "")).startswith("FAIL") or "error" in r]
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
