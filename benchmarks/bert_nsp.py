"""A short BERT pre-training run (masked LM + next-sentence prediction) on Tiny Shakespeare.

    OMP_NUM_THREADS=2 python benchmarks/bert_nsp.py                 # the recorded run
    python benchmarks/bert_nsp.py --set steps=20 --set eval_every=10  # quick check

Trains the ``shakespeare-bert`` recipe (4 layers, d_model 128, pairs of consecutive lines vs a
random other line, 50/50; BERT's 15% / 80-10-10 masking) for a short CPU budget (at most 3.75
minutes of training) and records each evaluation: the masked-LM loss and accuracy and the NSP
accuracy and loss on the validation lines (the last 10%; chance NSP accuracy is 50%). The
equivalent command is::

    attnlab train shakespeare-bert --steps 80 --batch_size 16 --eval_every 40 --eval_batches 16 \
        --warmup 8 --max_minutes 3.75

Writes ``benchmarks/results/bert_nsp_shakespeare.json`` and ``.md`` (the run directory goes to
a temporary folder). Data: ``$ATTNLAB_DATA`` or ``../shared/data``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parent
RESULTS = ROOT / "results"
NAME = "bert_nsp_shakespeare"
# sized for a shared 2-core CPU (about 2 s a step); max_minutes stops it (and evaluates) early
DEFAULTS: dict[str, Any] = {"steps": 80, "batch_size": 16, "eval_every": 40, "eval_batches": 16,
                            "warmup": 8, "max_minutes": 3.75}  # fmt: skip


def run(overrides: dict[str, Any]) -> dict[str, Any]:
    from attnlab.training.recipes import train_recipe

    with tempfile.TemporaryDirectory() as tmp:
        start = time.perf_counter()
        prepared, result = train_recipe(
            "shakespeare-bert", Path(tmp) / "run", {**overrides, "progress": False}
        )
        wall = time.perf_counter() - start
    flags = " ".join(f"--{k} {v}" for k, v in overrides.items())
    evals = [{k: round(v, 4) if isinstance(v, float) else v for k, v in e.items()}
             for e in result.evals]  # fmt: skip
    return {
        "recipe": "shakespeare-bert",
        "overrides": overrides,
        "equivalent_command": f"attnlab train shakespeare-bert {flags}",
        "seed": prepared.train.seed,
        "steps": result.step,
        "stopped_by": result.stopped_by,
        "batch_size": prepared.train.batch_size,
        "parameters": prepared.n_params,
        "data": prepared.data.info,
        "evals": evals,
        "final": evals[-1],
        "wall_s": round(wall, 1),
        "command": f"OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS', '')} python "
        + " ".join(sys.argv),
        "threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "machine": f"{platform.machine()} {os.cpu_count()} cpus, {platform.platform()}",
        "date": time.strftime("%Y-%m-%d %H:%M:%S"),
    }


def write_report(r: dict[str, Any]) -> None:
    lines = [
        "# BERT pre-training (MLM + NSP) on Tiny Shakespeare",
        "",
        f"Written by `benchmarks/bert_nsp.py` (`{r['command']}`; equivalent: "
        f"`{r['equivalent_command']}`). {r['parameters']:,} parameters, batch "
        f"{r['batch_size']} pairs, seed {r['seed']}, {r['steps']} steps in {r['wall_s']} s on "
        f"{r['machine']} ({r['threads']} threads, torch {r['torch']}), {r['date']}. "
        "Validation: the last 10% of the lines, "
        f"{r['data']['lines'] - r['data']['train_lines']:,} of {r['data']['lines']:,}. "
        "Chance NSP accuracy is 50%.",
        "",
        "| step | MLM val loss | MLM val accuracy | NSP val accuracy | NSP val loss |",
        "|---|---|---|---|---|",
    ]
    for e in r["evals"]:
        lines.append(
            f"| {e['step']} | {e['val_loss']:.4f} | {e['val_accuracy']:.2%} | "
            f"{e['val_nsp_accuracy']:.2%} | {e['val_nsp_loss']:.4f} |"
        )
    (RESULTS / f"{NAME}.md").write_text("\n".join(lines) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--set", action="append", default=[], help="override KEY=VALUE")
    args = parser.parse_args()
    os.environ.setdefault("ATTNLAB_DATA", str(ROOT.parent.parent / "shared" / "data"))
    overrides = dict(DEFAULTS)
    for item in args.set:
        key, _, value = item.partition("=")
        overrides[key] = json.loads(value) if value[:1].isdigit() or value[:1] == "-" else value
    record = run(overrides)
    (RESULTS / f"{NAME}.json").write_text(json.dumps(record, indent=2) + "\n")
    write_report(record)
    final = record["final"]
    print(
        f"step {record['steps']}: MLM val loss {final['val_loss']:.4f}, accuracy "
        f"{final['val_accuracy']:.2%}; NSP val accuracy {final['val_nsp_accuracy']:.2%} "
        f"({record['wall_s']} s)"
    )


if __name__ == "__main__":
    main()
