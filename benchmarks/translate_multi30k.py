"""Issue 8's benchmark: Multi30k German->English within a training budget, scored with sacreBLEU.

    python benchmarks/translate_multi30k.py                          # 90 minutes, default recipe
    python benchmarks/translate_multi30k.py --ablate-label-smoothing # + a run without it (2x time)
    python benchmarks/translate_multi30k.py --minutes 2 --name quick -- --d-model 64   # plumbing
    python benchmarks/translate_multi30k.py --resume                 # continue an interrupted run

Steps, each through the public command line so that every number comes from a recorded command:

1. ``attnlab train translate --max-minutes M`` (extra arguments after ``--`` go to it);
2. ``attnlab translate RUN --checkpoint C --eval test_2016_flickr [--beam 4 --alpha 0.6 |
   --greedy] --json ...`` for the rows: averaged/last/best checkpoint x beam/greedy;
3. with ``--ablate-label-smoothing``: the same training with ``--no-label-smoothing`` and the same
   budget, scored with the main row's settings (§6.2 Table 3 in miniature);
4. writes ``benchmarks/results/<name>.{md,json}``: machine, threads, versions, model size,
   training time, steps, tokens seen, commands, BLEU rows (cased and lowercased, signatures), the
   validation curve, example translations, and ``<name>_cross_attention.png`` (last decoder
   layer, head mean, on a test sentence) plus ``<name>_curves.png``.

The target (issue 8): lowercased sacreBLEU >= 36.1 on test_2016_flickr, the score of the
bentrevett/pytorch-seq2seq tutorial Transformer (trained on a GPU). Training runs go to
``benchmarks/results/runs/<name>[-no-ls]/`` (ignored by git). Data: ``--data``, else
``$ATTNLAB_DATA/multi30k``, else ``../shared/data/multi30k`` beside the checkout.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent
RESULTS = ROOT / "results"
TARGET_BLEU_LC = 36.1
SPLIT = "test_2016_flickr"
ROWS = [  # (checkpoint, beam); the first row is the headline
    ("averaged", 4),
    ("averaged", 1),
    ("last", 4),
    ("last", 1),
    ("best", 4),
]


def default_data() -> Path:
    env = os.environ.get("ATTNLAB_DATA")
    return Path(env) / "multi30k" if env else ROOT.parent.parent / "shared" / "data" / "multi30k"


def attnlab(args: list[str]) -> tuple[str, float]:
    """Run ``python -m attnlab ARGS`` (output streamed); return the command and its seconds."""
    start = time.monotonic()
    subprocess.run([sys.executable, "-m", "attnlab", *args], check=True)
    return "attnlab " + shlex.join(args), time.monotonic() - start


def train(run: Path, data: Path, minutes: float, extra: list[str], resume: bool) -> dict[str, Any]:
    args = [
        "train",
        "translate",
        "--src",
        "de",
        "--tgt",
        "en",
        "--data",
        str(data),
        "--out",
        str(run),
        "--max-minutes",
        str(minutes),
        *extra,
    ]
    if resume and (run / "run.json").is_file():
        args.append("--resume")
    command, seconds = attnlab(args)
    records = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines() if x]
    train_recs = [r for r in records if r.get("split") == "train"]
    info = json.loads((run / "run.json").read_text())
    last = train_recs[-1]
    return {
        "command": command,
        "sessions": [x.get("command", "") for x in info.get("sessions", [])],
        "process_seconds": round(seconds, 1),
        "train_seconds": last["elapsed_s"],
        "steps": last["step"],
        "epochs": round(last["epoch"], 2),
        "source_tokens": last["tokens"],
        "n_params": info["n_params"],
        "model": {
            k: info["model"][k]
            for k in (
                "d_model",
                "n_layers",
                "n_heads",
                "d_ff",
                "dropout",
                "vocab_size",
                "max_seq_len",
            )
        },
        "config": {"options": info["options"], "train": info["train"]},
        "train_pairs": info["data"]["train_pairs"],
        "train_dropped": info["data"]["train_dropped"],
        "val_curve": [
            {k: r[k] for k in ("step", "loss", "bleu") if k in r}
            for r in records
            if r.get("split") == "val"
        ],
        "final": [r for r in records if r.get("split") == "final"],
    }


def evaluate(run: Path, data: Path, checkpoint: str, beam: int, out: Path) -> dict[str, Any]:
    tag = f"{checkpoint}-{'beam' + str(beam) if beam > 1 else 'greedy'}"
    scores, hyps = out / f"{tag}.json", out / f"{tag}.txt"
    decoding = ["--beam", str(beam), "--alpha", "0.6"] if beam > 1 else ["--greedy"]
    command, _ = attnlab(
        [
            "translate",
            str(run),
            "--checkpoint",
            checkpoint,
            "--eval",
            SPLIT,
            "--data",
            str(data),
            *decoding,
            "--output",
            str(hyps),
            "--json",
            str(scores),
        ]
    )
    return {
        "row": tag,
        "command": command,
        "hypotheses": str(hyps),
        **json.loads(scores.read_text()),
    }


def examples(data: Path, hyps_file: str, indices: list[int]) -> list[dict[str, str]]:
    from attnlab.translation.data import load_pairs

    pairs = load_pairs(data, SPLIT, "de", "en")
    hyps = Path(hyps_file).read_text(encoding="utf-8").splitlines()
    return [
        {"index": str(i), "source": pairs[i][0], "reference": pairs[i][1], "hypothesis": hyps[i]}
        for i in indices
    ]


def attention_image(run: Path, example: dict[str, str], name: str, results: Path) -> list[str]:
    from attnlab.training.recipes.translation import load_translator
    from attnlab.viz.curves import plot_curves
    from attnlab.viz.translation import cross_attention, plot_cross_attention

    t = load_translator(run, "averaged")
    att = cross_attention(t.model, t.tokenizer, example["source"], example["hypothesis"])
    image = results / f"{name}_cross_attention.png"
    plot_cross_attention(
        att,
        title=f"test sentence {example['index']}: cross-attention, last "
        "decoder layer, mean of heads (averaged checkpoint)",
        path=image,
    )
    curves = results / f"{name}_curves.png"
    plot_curves([run], title="Multi30k de->en: training and validation loss", path=curves)
    return [image.name, curves.name]


def machine() -> dict[str, Any]:
    import sacrebleu
    import tokenizers
    import torch

    return {
        "platform": platform.platform(),
        "processor": platform.processor(),
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS"),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "tokenizers": tokenizers.__version__,
        "sacrebleu": sacrebleu.__version__,
    }


def markdown(result: dict[str, Any]) -> str:
    m, t = result["machine"], result["training"]
    head = result["rows"][0]
    reached = head["bleu_lowercase"] >= TARGET_BLEU_LC
    lines = [
        "# Multi30k German->English (issue 8)",
        "",
        f"Test set {SPLIT} (1,000 sentences), sacreBLEU on detokenised output against the raw "
        "references. Target: lowercased BLEU >= "
        f"{TARGET_BLEU_LC} (bentrevett/pytorch-seq2seq's Transformer, trained on a GPU).",
        "",
        f"**Headline ({head['row']}): lowercased BLEU {head['bleu_lowercase']:.2f}, cased "
        f"{head['bleu']:.2f} -- target {'reached' if reached else 'NOT reached'}.**",
        "",
        f"Machine: {m['platform']}, {m['cpu_count']} CPUs, torch threads {m['torch_threads']}; "
        f"torch {m['torch']}, tokenizers {m['tokenizers']}, sacrebleu {m['sacrebleu']}.",
        "",
        "## Training",
        "",
        f"- model: {t['n_params']:,} parameters ({t['model']})",
        f"- training wall time {t['train_seconds'] / 60:.1f} min (validation included), "
        f"{t['steps']:,} steps, ~{t['epochs']} epochs, {t['source_tokens']:,} source tokens seen",
        f"- training pairs {t['train_pairs']:,} (dropped as too long: {t['train_dropped']})",
        *[f"- command: `{cmd}`" for cmd in t["sessions"] or [t["command"]]],
        "",
        "## BLEU on test_2016_flickr",
        "",
        "| run | checkpoint | decoding | BLEU (lowercased) | BLEU (cased) | decode s |",
        "|---|---|---|---:|---:|---:|",
    ]
    for r in result["rows"] + result.get("ablation_rows", []):
        lines.append(
            f"| {r.get('run', 'main')} | {r['row'].split('-')[0]} | {r['decoding']} | "
            f"{r['bleu_lowercase']:.2f} | {r['bleu']:.2f} | {r['seconds']:.0f} |"
        )
    lines += [
        "",
        f"Signatures: `{head['signature']}`, `{head['signature_lowercase']}`.",
        "",
        "Commands:",
        "",
    ]
    lines += [f"- `{r['command']}`" for r in result["rows"] + result.get("ablation_rows", [])]
    if "ablation" in result:
        a = result["ablation"]
        lines += [
            "",
            f"Label-smoothing ablation run: `{a['command']}` ({a['steps']:,} steps, "
            f"{a['train_seconds'] / 60:.1f} min).",
        ]
    lines += [
        "",
        "## Validation curve (greedy BLEU on the first 200 val pairs)",
        "",
        "| step | val loss | val BLEU |",
        "|---:|---:|---:|",
    ]
    lines += [
        f"| {v['step']} | {v['loss']:.3f} | {v.get('bleu', float('nan')):.2f} |"
        for v in t["val_curve"]
    ]
    lines += ["", "## Examples (averaged checkpoint, beam 4)", ""]
    for e in result["examples"]:
        lines += [
            f"- **src** {e['source']}",
            f"  **ref** {e['reference']}",
            f"  **hyp** {e['hypothesis']}",
        ]
    lines += ["", *[f"![{img}]({img})" for img in result["images"]], ""]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--data", type=Path, default=None)
    parser.add_argument("--minutes", type=float, default=90.0, help="training budget per run")
    parser.add_argument("--name", default="translate_multi30k", help="results file name")
    parser.add_argument("--ablate-label-smoothing", action="store_true")
    parser.add_argument("--resume", action="store_true", help="continue existing runs")
    parser.add_argument("--examples", default="0,1,2,3,4", help="test indices to show")
    parser.add_argument("--results-dir", type=Path, default=RESULTS, help="where results go")
    args, extra = parser.parse_known_args(argv)
    extra = [x for x in extra if x != "--"]
    data = args.data or default_data()
    results_dir: Path = args.results_dir
    runs = results_dir / "runs"
    run = runs / args.name
    evals = run / "eval"
    evals.mkdir(parents=True, exist_ok=True)
    result: dict[str, Any] = {"machine": machine(), "target_bleu_lowercase": TARGET_BLEU_LC}
    result["training"] = train(run, data, args.minutes, extra, args.resume)
    result["rows"] = [{"run": "main", **evaluate(run, data, c, b, evals)} for c, b in ROWS]
    if args.ablate_label_smoothing:
        ab = runs / f"{args.name}-no-ls"
        result["ablation"] = train(
            ab, data, args.minutes, [*extra, "--no-label-smoothing"], args.resume
        )
        (ab / "eval").mkdir(exist_ok=True)
        result["ablation_rows"] = [
            {"run": "no label smoothing", **evaluate(ab, data, c, 4, ab / "eval")}
            for c in ("averaged", "last")
        ]
    indices = [int(i) for i in args.examples.split(",")]
    result["examples"] = examples(data, result["rows"][0]["hypotheses"], indices)
    result["images"] = attention_image(run, result["examples"][0], args.name, results_dir)
    (results_dir / f"{args.name}.json").write_text(json.dumps(result, indent=2) + "\n")
    (results_dir / f"{args.name}.md").write_text(markdown(result))
    print(markdown(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
