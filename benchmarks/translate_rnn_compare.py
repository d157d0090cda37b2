"""Issue 50 (§1.2): the recurrent encoder-decoder without and with attention against the
Transformer, on Multi30k German->English, each trained alone for the same budget.

    python benchmarks/translate_rnn_compare.py                        # 30 minutes per model
    python benchmarks/translate_rnn_compare.py --minutes 0 --steps 2000   # a step budget only
    python benchmarks/translate_rnn_compare.py --minutes 0.5 --limit 50 --results-dir /tmp/x
    python benchmarks/translate_rnn_compare.py --archs rnn-attention -- --attention luong

For each ``--archs`` entry (default ``rnn``, ``rnn-attention``, ``transformer``), one after the
other, through the public command line so that every number comes from a recorded command:

1. ``attnlab train translate --arch A --max-minutes M [--steps N]`` (the same joint BPE, token
   batches, schedule, label smoothing and validation for all; arguments after ``--`` go to
   every run);
2. ``attnlab translate RUN --checkpoint averaged --eval test_2016_flickr --beam 4 --alpha 0.6``
   (sacreBLEU, cased and lowercased);
3. at equal steps (the last step every run was validated at): the validation records, and with
   ``--equal-steps-test`` (after the runs) each run's checkpoint of that step scored on the test
   split like step 2;
4. writes ``<results-dir>/<name>.{json,md}`` (machine, threads, versions, per model: steps,
   parameters, training and decoding time, BLEU, commands), ``<results-dir>/course/<name>.json``
   (what the course page ``01b-seq2seq-attention`` reads) and ``translate_rnn_alignment.png``: for
   the first ``--examples`` test sentences, teacher-forced on the reference, the RNN's attention
   ``α`` (B, T, S) beside the Transformer's cross-attention (last decoder layer, mean of heads).

Runs go to ``<results-dir>/runs/<name>-<arch>/`` (ignored by git). Data: ``--data``, else
``$ATTNLAB_DATA/multi30k``, else ``../shared/data/multi30k`` beside the checkout.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent
RESULTS = ROOT / "results"
SPLIT = "test_2016_flickr"
ARCHS = ("rnn", "rnn-attention", "transformer")


def default_data() -> Path:
    env = os.environ.get("ATTNLAB_DATA")
    return Path(env) / "multi30k" if env else ROOT.parent.parent / "shared" / "data" / "multi30k"


def attnlab(args: list[str]) -> tuple[str, float]:
    """Run ``python -m attnlab ARGS`` (output streamed); return the command and its seconds."""
    start = time.monotonic()
    subprocess.run([sys.executable, "-m", "attnlab", *args], check=True)
    return "attnlab " + shlex.join(args), time.monotonic() - start


def train(arch: str, run: Path, data: Path, args: argparse.Namespace, extra: list[str]) -> dict:
    budget = ["--max-minutes", str(args.minutes) if args.minutes > 0 else "none"]
    if args.steps is not None:
        budget += ["--steps", str(args.steps)]
    command, seconds = attnlab(["train", "translate", "--arch", arch, "--src", "de", "--tgt",
                                "en", "--data", str(data), "--out", str(run), "--overwrite",
                                *budget, *extra])  # fmt: skip
    records = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines() if x]
    last = [r for r in records if r.get("split") == "train"][-1]
    info = json.loads((run / "run.json").read_text())
    return {
        "command": command,
        "process_seconds": round(seconds, 1),
        "train_seconds": last["elapsed_s"],
        "steps": last["step"],
        "epochs": round(last["epoch"], 3),
        "n_params": info["n_params"],
        "model": info["model"],
        "val_curve": [
            {k: r[k] for k in ("step", "loss", "bleu") if k in r}
            for r in records
            if r.get("split") == "val"
        ],
    }


def evaluate(
    run: Path, data: Path, beam: int, limit: int | None, *, model: Path | None = None
) -> dict[str, Any]:
    """BLEU on the test split of the run's averaged checkpoint, or of the model directory
    ``model`` (its outputs go beside it)."""
    where = model.parent / model.name if model is not None else run / "eval" / "test"
    scores, hyps = where.with_suffix(".json"), where.with_suffix(".txt")
    scores.parent.mkdir(exist_ok=True)
    decoding = ["--beam", str(beam), "--alpha", "0.6"] if beam > 1 else ["--greedy"]
    limited = ["--limit", str(limit)] if limit else []
    which = [str(model)] if model is not None else [str(run), "--checkpoint", "averaged"]
    command, _ = attnlab(["translate", *which, "--eval", SPLIT, "--data", str(data), *decoding,
                          *limited, "--no-progress", "--output", str(hyps),
                          "--json", str(scores)])  # fmt: skip
    s = json.loads(scores.read_text())
    keep = ("bleu", "bleu_lowercase", "signature", "signature_lowercase", "seconds",
            "n_sentences", "decoding", "step")  # fmt: skip
    return {"command": command, "hypotheses": str(hyps), **{k: s[k] for k in keep if k in s}}


def alignment(runs: dict[str, Path], data: Path, indices: list[int], path: Path) -> list[dict]:
    """The picture: a row per test sentence, a column per model with attention (teacher-forced
    on the reference, so that every panel has the same rows and columns)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import torch

    from attnlab.training.recipes.translation import load_translator
    from attnlab.translation.data import load_pairs
    from attnlab.viz.attention import clean_token
    from attnlab.viz.translation import cross_attention

    pairs = load_pairs(data, SPLIT, "de", "en")
    shown = [a for a in ("rnn-attention", "transformer") if a in runs]
    if not shown:
        return []
    models = {a: load_translator(runs[a], "averaged") for a in shown}
    fig, axes = plt.subplots(len(indices), len(shown), squeeze=False,
                             figsize=(5.2 * len(shown), 4.2 * len(indices)))  # fmt: skip
    out = []
    for row, i in enumerate(indices):
        source, reference = pairs[i]
        for col, arch in enumerate(shown):
            t = models[arch]
            tok = t.tokenizer
            src_ids, tgt_ids = [*tok.encode(source), tok.eos_id], tok.encode(reference)
            if arch == "transformer":
                w = cross_attention(t.model, tok, source, reference).weights[-1].mean(0)
                what = "Transformer cross-attention (last layer, mean of heads)"
            else:
                src = torch.tensor([src_ids])
                tgt = torch.tensor([[tok.bos_id, *tgt_ids]])
                w = t.model.attention_weights(src, tgt)[0]  # (T, S)
                what = f"RNN attention ({t.model.config.attention})"
            ax = axes[row][col]
            ax.imshow(w.float().numpy(), cmap="viridis", vmin=0.0, aspect="auto")
            ax.set_xticks(range(len(src_ids)))
            ax.set_xticklabels([clean_token(x) for x in tok.tokens(src_ids)], rotation=90,
                               fontsize=7)  # fmt: skip
            ax.set_yticks(range(len(tgt_ids) + 1))
            ax.set_yticklabels([clean_token(x) for x in tok.tokens([*tgt_ids, tok.eos_id])],
                               fontsize=7)  # fmt: skip
            ax.set_title(f"test {i}: {what}", fontsize=8)
        out.append({"index": i, "source": source, "reference": reference})
    fig.suptitle("Which source subword each output subword attends to (rows: output, "
                 "teacher-forced on the reference)", fontsize=9)  # fmt: skip
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return out


def checkpoint_model(run: Path, step: int) -> Path:
    """A model directory (``<run>/eval/step_N``) made from the run's checkpoint at ``step``:
    its weights and config, the run's tokenizer and the export record ``translate`` reads."""
    checkpoint = run / "checkpoints" / f"step_{step:08d}"
    if not (checkpoint / "model.safetensors").is_file():
        have = sorted(p.name for p in (run / "checkpoints").glob("step_*"))
        raise SystemExit(f"{run}: no checkpoint at step {step} (have: {have})")
    model = run / "eval" / f"step_{step:08d}"
    model.mkdir(parents=True, exist_ok=True)
    for name in ("config.json", "model.safetensors"):
        shutil.copy2(checkpoint / name, model / name)
    shutil.copy2(run / "tokenizer.json", model / "tokenizer.json")
    last = json.loads((run / "last" / "export.json").read_text())
    info = {k: last[k] for k in ("recipe", "src", "tgt", "data") if k in last}
    (model / "export.json").write_text(json.dumps({**info, "kind": "checkpoint", "step": step}))
    return model


def equal_steps(rows: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The comparison at equal steps, from the runs' own validation records: the last step at
    which every model was evaluated, with each one's validation loss and greedy BLEU on the
    recipe's first validation sentences (``eval_bleu_sentences``) at that step."""
    common = set.intersection(*({c["step"] for c in r["training"]["val_curve"]} for r in rows))
    if not rows or not common:
        return None
    step = max(common)
    at = {r["arch"]: next(c for c in r["training"]["val_curve"] if c["step"] == step) for r in rows}
    test = {r["arch"]: r["test_equal_steps"] for r in rows
            if r.get("test_equal_steps", {}).get("step") == step}  # fmt: skip
    return {"step": step, "rows": [{"arch": a, "val_loss": c["loss"], "val_bleu_greedy":
                                    c.get("bleu"), **({"test_bleu": test[a]["bleu"],
                                    "test_bleu_lowercase": test[a]["bleu_lowercase"]}
                                    if a in test else {})}
                                   for a, c in at.items()]}  # fmt: skip


def machine() -> dict[str, Any]:
    import sacrebleu
    import tokenizers
    import torch

    return {
        "platform": platform.platform(),
        "processor": platform.processor(),
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "cuda": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
        "python": platform.python_version(),
        "torch": torch.__version__,
        "tokenizers": tokenizers.__version__,
        "sacrebleu": sacrebleu.__version__,
    }


def markdown(result: dict[str, Any]) -> str:
    m, b = result["machine"], result["budget"]
    lines = [
        "# Multi30k de->en: RNN, RNN + attention, Transformer (issue 50, §1.2)",
        "",
        f"Each model trained alone, one after the other, for {b['minutes']} min"
        + (f" / {b['steps']} steps" if b["steps"] else "")
        + f"; BLEU on {SPLIT} ({result['rows'][0]['test']['n_sentences']} sentences), averaged "
        "checkpoint, sacreBLEU on detokenised output.",
        "",
        f"Machine: {m['platform']}, {m['cpu_count']} CPUs, torch threads {m['torch_threads']}, "
        f"GPU {m['cuda']}; torch {m['torch']}, sacrebleu {m['sacrebleu']}.",
        "",
        "| arch | attention | parameters | steps | train min | BLEU (lowercased) | BLEU (cased) |",
        "|---|---|---:|---:|---:|---:|---:|",
    ]
    for r in result["rows"]:
        t, e = r["training"], r["test"]
        lines.append(
            f"| {r['arch']} | {t['model'].get('attention', 'multi-head')} | {t['n_params']:,} | "
            f"{t['steps']:,} | {t['train_seconds'] / 60:.1f} | {e['bleu_lowercase']:.2f} | "
            f"{e['bleu']:.2f} |"
        )
    same = result.get("equal_steps")
    if same:
        lines += ["", f"At equal steps ({same['step']:,}, the last step every model was "
                  "evaluated at): validation loss over all validation pairs and greedy BLEU on "
                  "the first 200 validation sentences, from the runs' own records; test BLEU: "
                  f"the checkpoint of that step (not averaged) on {SPLIT}, beam 4, like the "
                  "table above (`--equal-steps-test`).", "",
                  "| arch | val loss | val BLEU (greedy, cased) | test BLEU cased (lowercased) |",
                  "|---|---:|---:|---:|"]  # fmt: skip
        for r in same["rows"]:
            bleu = "-" if r["val_bleu_greedy"] is None else f"{r['val_bleu_greedy']:.2f}"
            test = (f"{r['test_bleu']:.2f} ({r['test_bleu_lowercase']:.2f})"
                    if "test_bleu" in r else "-")  # fmt: skip
            lines.append(f"| {r['arch']} | {r['val_loss']:.3f} | {bleu} | {test} |")
    lines += ["", "Commands:", ""]
    for r in result["rows"]:
        lines += [f"- `{r['training']['command']}`", f"- `{r['test']['command']}`"]
        if "test_equal_steps" in r:
            lines += [f"- `{r['test_equal_steps']['command']}`"]
    if result.get("image"):
        lines += ["", f"![alignment]({result['image']})"]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--data", type=Path, default=None)
    parser.add_argument("--minutes", type=float, default=30.0, help="per model; 0: no limit")
    parser.add_argument("--steps", type=int, default=None, help="per model (also a budget)")
    parser.add_argument("--archs", default=",".join(ARCHS), help="comma-separated, in order")
    parser.add_argument("--beam", type=int, default=4)
    parser.add_argument("--limit", type=int, default=None, help="test sentences (default all)")
    parser.add_argument("--examples", default="0,1,2", help="test indices of the picture")
    parser.add_argument("--name", default="translate_rnn_compare")
    parser.add_argument("--results-dir", type=Path, default=RESULTS)
    parser.add_argument("--image", default="translate_rnn_alignment.png", help="picture's name")
    parser.add_argument("--report-only", action="store_true",
                        help="rewrite the .md and course JSON from the recorded .json")  # fmt: skip
    parser.add_argument("--equal-steps-test", action="store_true",
                        help="score each recorded run's checkpoint at the equal-steps step on "
                             "the test split, then rewrite the reports")  # fmt: skip
    args, extra = parser.parse_known_args(argv)
    extra = [x for x in extra if x != "--"]
    results: Path = args.results_dir
    if args.report_only or args.equal_steps_test:
        result = json.loads((results / f"{args.name}.json").read_text())
        if args.equal_steps_test:  # the test split at the equal-steps checkpoint of each run
            same = equal_steps(result["rows"])
            if same is None:
                parser.error("the recorded runs have no step in common")
            data = args.data or default_data()
            for r in result["rows"]:
                run = results / "runs" / f"{args.name}-{r['arch']}"
                model = checkpoint_model(run, same["step"])
                r["test_equal_steps"] = {**evaluate(run, data, args.beam, args.limit,
                                                    model=model), "step": same["step"]}  # fmt: skip
        return write(result, results, args.name)
    if args.minutes <= 0 and args.steps is None:
        parser.error("give a budget: --minutes > 0 and/or --steps")
    archs = [a for a in args.archs.split(",") if a]
    unknown = sorted(set(archs) - set(ARCHS))
    if unknown:
        parser.error(f"unknown --archs {unknown}; valid: {list(ARCHS)}")
    data = args.data or default_data()
    runs = {a: results / "runs" / f"{args.name}-{a}" for a in archs}
    rows = []
    for arch in archs:  # sequentially: each model has the machine to itself
        training = train(arch, runs[arch], data, args, extra)
        rows.append({"arch": arch, "training": training,
                     "test": evaluate(runs[arch], data, args.beam, args.limit)})  # fmt: skip
    result: dict[str, Any] = {
        "machine": machine(),
        "budget": {"minutes": args.minutes, "steps": args.steps, "extra": extra},
        "command": "python benchmarks/translate_rnn_compare.py " + shlex.join(argv or sys.argv[1:]),
        "smoke": args.minutes < 5 and (args.steps or 0) < 500,
        "rows": rows,
    }
    image = results / args.image
    indices = [int(i) for i in args.examples.split(",") if i]
    result["examples"] = alignment(runs, data, indices, image)
    result["image"] = image.name if result["examples"] else None
    return write(result, results, args.name)


def write(result: dict[str, Any], results: Path, name: str) -> int:
    """``<name>.{json,md}`` and the course page's ``course/<name>.json``; prints the table."""
    rows = result["rows"]
    result["equal_steps"] = equal_steps(rows)
    results.mkdir(parents=True, exist_ok=True)
    (results / f"{name}.json").write_text(json.dumps(result, indent=2) + "\n")
    (results / f"{name}.md").write_text(markdown(result))
    keys = ("machine", "budget", "command", "smoke", "examples", "equal_steps")
    course = {k: result[k] for k in keys}
    course["rows"] = [
        {"arch": r["arch"], "attention": r["training"]["model"].get("attention"),
         "n_params": r["training"]["n_params"], "steps": r["training"]["steps"],
         "train_seconds": r["training"]["train_seconds"], "bleu": r["test"]["bleu"],
         "bleu_lowercase": r["test"]["bleu_lowercase"], "n_sentences": r["test"]["n_sentences"]}
        for r in rows
    ]  # fmt: skip
    (results / "course").mkdir(exist_ok=True)
    (results / "course" / f"{name}.json").write_text(json.dumps(course, indent=2) + "\n")
    print(markdown(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
