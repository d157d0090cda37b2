"""What weight-only quantization costs on trained models: loss, BLEU, greedy agreement (issue 27).

For each weight variant (``fp32``, ``int8``, ``int4``, ``int8+head``, ...; the names of
``benchmarks/quantized_decoding.py``), quantized from the same trained float32 weights with
:func:`attnlab.quantize`:

- a character-level GPT run directory (``attnlab train shakespeare-char``, loaded with
  :func:`attnlab.training.load_run`): the validation loss and accuracy exactly as the trainer
  measures them (:meth:`attnlab.training.Trainer.evaluate`: the run's seed, batch size and
  ``eval_batches``), and
  the greedy-token agreement with fp32: ``--prompts`` validation blocks of ``--prompt-len``
  characters, ``--new-tokens`` greedy characters each, the fraction of positions equal to
  fp32's, and the mean number of leading characters equal (one early difference changes all
  the text after it, so both are shown);
- a translation run or model directory (``attnlab train translate``, loaded with
  :func:`attnlab.training.recipes.translation.load_translator`: a run's ``averaged/``, else
  ``best/``, else ``last/`` model, as ``attnlab translate``): sacreBLEU on a test split (beam 4,
  α 0.6 by default, as ``attnlab translate``), and the greedy agreement with fp32 over the
  first ``--agreement-sentences`` sources (tokens up to the end of sentence, and whole
  translations identical).

Targets of issue 27: int8 within 0.02 nats (validation loss) and 0.5 BLEU of fp32; int4 reported
as it is. Results: ``benchmarks/results/quantized_quality.{md,json}``.

    python benchmarks/quantized_quality.py --lm-run runs/shakespeare-char \
        --mt-model runs/de-en [--variants fp32,int8,int4,int8+head,int4+head,int8-bf16act]
    python benchmarks/quantized_quality.py --smoke   # trains two tiny runs first; /tmp results
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

import attnlab
from attnlab.analysis.attention_bench import describe_machine, machine_info

sys.path.insert(0, str(Path(__file__).resolve().parent))
from quantized_decoding import parse_variant, quantized_copy

RESULTS = Path(__file__).resolve().parent / "results"


def _agreement(ours: list[list[int]], ref: list[list[int]]) -> dict[str, float]:
    """Fraction of reference positions matched, leading tokens matched, identical outputs."""
    same = total = prefix = identical = 0
    for a, b in zip(ours, ref, strict=True):
        total += len(b)
        same += sum(x == y for x, y in zip(a, b, strict=False))
        lead = next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), None)
        prefix += min(len(a), len(b)) if lead is None else lead
        identical += a == b
    n = max(len(ref), 1)
    return {
        "token_agreement": same / max(total, 1),
        "same_prefix": prefix / n,
        "identical": identical / n,
    }


# -- language model ----------------------------------------------------------------------------


def lm_prompts(prepared: Any, n: int, length: int) -> Tensor:
    """``n`` validation blocks of ``length`` tokens (a fixed generator)."""
    generator = torch.Generator().manual_seed(12345)
    x, _ = prepared.objective.sample("val", n, generator)
    return x[:, :length]  # (n, length)


def lm_quality(args: argparse.Namespace) -> dict[str, Any]:
    from attnlab.training import Trainer, load_run

    prepared = load_run(args.lm_run)
    trainer = Trainer(prepared.model, prepared.objective, prepared.train)  # its val batches
    fp32 = prepared.model.eval()
    block = fp32.config.max_seq_len
    prompt_len = min(args.prompt_len, block // 2)  # a short context: half prompt, half new
    new = min(args.new_tokens, block - prompt_len)
    prompts = lm_prompts(prepared, args.prompts, prompt_len)
    rows: dict[str, Any] = {}
    reference: list[list[int]] = []
    for name in args.variants.split(","):
        start = time.perf_counter()
        model = quantized_copy(fp32, name, args.group_size)
        with torch.inference_mode():
            row: dict[str, Any] = trainer.evaluate(model=model)
        out = attnlab.generate(model, prompts, max_new_tokens=new, eos_id=())  # (n, new)
        tokens = out.tolist()
        if name == "fp32":
            reference = tokens
        elif reference:
            row |= _agreement(tokens, reference)
        row["seconds"] = time.perf_counter() - start
        rows[name] = row
        print(json.dumps({"lm": name, **row}), flush=True)
    _deltas(rows, "val_loss")
    info = {
        "run": str(args.lm_run),
        "checkpoint": str(prepared.checkpoint),
        "params": sum(p.numel() for p in fp32.parameters()),
        "eval_batches": prepared.train.eval_batches,
        "batch_size": prepared.train.batch_size,
        "prompts": args.prompts,
        "prompt_len": prompt_len,
        "new_tokens": new,
    }
    return {"info": info, "rows": rows}


# -- translation -------------------------------------------------------------------------------


@torch.inference_mode()
def greedy_ids(model: nn.Module, sources: list[list[int]], eos: int, batch: int) -> list[list[int]]:
    """Greedy translations as token ids, cut after the end of sentence."""
    from attnlab.translation.evaluate import EXTRA_OUTPUT_TOKENS

    out: list[list[int]] = []
    limit = model.config.max_seq_len
    for start in range(0, len(sources), batch):
        chunk = sources[start : start + batch]
        longest = max(len(s) for s in chunk)
        new = attnlab.generate(
            model, chunk, max_new_tokens=min(limit, longest + EXTRA_OUTPUT_TOKENS)
        )  # as attnlab.translation.translate
        for row in new.tolist():
            out.append(row[: row.index(eos) + 1] if eos in row else row)
    return out


def mt_quality(args: argparse.Namespace) -> dict[str, Any]:
    from attnlab.training.recipes.translation import load_translator
    from attnlab.translation.data import load_pairs
    from attnlab.translation.evaluate import score_bleu, translate

    t = load_translator(args.mt_model)
    data = args.data or t.info.get("data")
    pairs = load_pairs(data, args.split, t.info["src"], t.info["tgt"])
    if args.bleu_sentences:
        pairs = pairs[: args.bleu_sentences]
    sources = [s for s, _ in pairs]
    encoded = [[*ids, t.tokenizer.eos_id] for ids in t.tokenizer.encode_batch(sources)]
    encoded = [ids for ids in encoded[: args.agreement_sentences] if len(ids) > 1]
    rows: dict[str, Any] = {}
    reference: list[list[int]] = []
    for name in args.variants.split(","):
        start = time.perf_counter()
        model = quantized_copy(t.model, name, args.group_size)
        hyps = translate(model, t.tokenizer, sources, beam=args.beam, batch_size=args.batch_size)
        scores = score_bleu(hyps, [r for _, r in pairs])
        row: dict[str, Any] = {"bleu": scores.bleu, "bleu_lowercase": scores.bleu_lowercase}
        ids = greedy_ids(model, encoded, t.tokenizer.eos_id, args.batch_size)
        if name == "fp32":
            reference = ids
            row["signature"] = scores.signature
        elif reference:
            row |= _agreement(ids, reference)
        row["seconds"] = time.perf_counter() - start
        rows[name] = row
        print(json.dumps({"mt": name, **row}), flush=True)
    _deltas(rows, "bleu")
    info = {
        "model": str(t.path),
        "step": t.info.get("step"),
        "split": args.split,
        "sentences": len(pairs),
        "beam": args.beam,
        "agreement_sentences": len(encoded),
        "params": sum(p.numel() for p in t.model.parameters()),
    }
    return {"info": info, "rows": rows}


def _deltas(rows: dict[str, Any], key: str) -> None:
    if "fp32" in rows:
        for row in rows.values():
            row[f"delta_{key}"] = row[key] - rows["fp32"][key]


# -- report ------------------------------------------------------------------------------------


def _cell(row: dict[str, Any], key: str, fmt: str) -> str:
    return "-" if row.get(key) is None else format(row[key], fmt)


def format_markdown(results: dict[str, Any]) -> str:
    meta = results["meta"]
    lines = [
        "# Quantization quality (benchmarks/quantized_quality.py)",
        "",
        f"{describe_machine(meta, meta['threads'])}, {meta['date_utc']}. Variants quantized "
        f"from the same float32 weights (int4 group size {meta['group_size']}). Targets: int8 "
        "within 0.02 nats and 0.5 BLEU of fp32; int4 as it is.",
    ]
    if "lm" in results:
        info = results["lm"]["info"]
        lines += [
            "",
            f"## Language model: {info['run']} ({info['params']:,} parameters)",
            "",
            f"Validation: {info['eval_batches']} batches of {info['batch_size']} (the trainer's). "
            f"Agreement: {info['prompts']} prompts of {info['prompt_len']} tokens, "
            f"{info['new_tokens']} greedy tokens.",
            "",
            "| variant | val loss | Δ loss | val accuracy | token agreement | same prefix |",
            "|---|---|---|---|---|---|",
        ]
        for name, r in results["lm"]["rows"].items():
            lines.append(
                f"| {name} | {r['val_loss']:.4f} | {_cell(r, 'delta_val_loss', '+.4f')} "
                f"| {r['val_accuracy']:.4f} | {_cell(r, 'token_agreement', '.3f')} "
                f"| {_cell(r, 'same_prefix', '.1f')} |"
            )
    if "mt" in results:
        info = results["mt"]["info"]
        lines += [
            "",
            f"## Translation: {info['model']} (step {info['step']}, {info['params']:,} parameters)",
            "",
            f"BLEU: {info['split']}, {info['sentences']} sentences, beam {info['beam']}. "
            f"Agreement: greedy, the first {info['agreement_sentences']} sources.",
            "",
            "| variant | BLEU | Δ BLEU | BLEU (lowercase) | token agreement | same prefix "
            "| identical |",
            "|---|---|---|---|---|---|---|",
        ]
        for name, r in results["mt"]["rows"].items():
            lines.append(
                f"| {name} | {r['bleu']:.2f} | {_cell(r, 'delta_bleu', '+.2f')} "
                f"| {r['bleu_lowercase']:.2f} | {_cell(r, 'token_agreement', '.3f')} "
                f"| {_cell(r, 'same_prefix', '.1f')} | {_cell(r, 'identical', '.3f')} |"
            )
    return "\n".join(lines) + "\n"


SMOKE_LM = [
    "train", "shakespeare-char", "--steps", "20", "--warmup", "5", "--d-model", "64",
    "--n-layers", "2", "--d-ff", "256", "--eval-every", "20", "--eval-batches", "2",
    "--no-progress",
]  # fmt: skip
SMOKE_MT = [
    "train", "translate", "--max-steps", "10", "--train-limit", "1000", "--vocab-size", "500",
    "--eval-every", "10", "--save-every", "10", "--eval-bleu-sentences", "0", "--d-model", "64",
    "--n-layers", "1", "--n-heads", "4", "--d-ff", "128", "--no-progress",
]  # fmt: skip


def smoke(args: argparse.Namespace) -> None:
    """Tiny runs (trained here, in a temporary directory, unless given) and tiny sizes."""
    from attnlab.cli import main as attnlab_main

    tmp = Path(tempfile.mkdtemp(prefix="quantized-quality-"))
    if args.lm_run is None:
        args.lm_run = tmp / "lm"
        if attnlab_main([*SMOKE_LM, "--out", str(args.lm_run)]):
            raise SystemExit("smoke: training the tiny language model failed")
    if args.mt_model is None:
        args.mt_model = tmp / "mt"
        extra = ["--data", args.data] if args.data else []
        if attnlab_main([*SMOKE_MT, *extra, "--out", str(args.mt_model)]):
            raise SystemExit("smoke: training the tiny translation model failed")
    args.group_size, args.prompts, args.prompt_len, args.new_tokens = 32, 4, 16, 16
    args.bleu_sentences, args.agreement_sentences, args.beam = 20, 10, 2
    if args.json == str(RESULTS / "quantized_quality.json"):
        args.json = str(Path(tempfile.gettempdir()) / "quantized_quality_smoke.json")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--lm-run", type=Path, help="a shakespeare-char run directory")
    parser.add_argument("--mt-model", type=Path, help="a translation model/run directory")
    parser.add_argument("--variants", default="fp32,int8,int4,int8+head,int4+head,int8-bf16act")
    parser.add_argument("--group-size", type=int, default=128)
    parser.add_argument("--prompts", type=int, default=32)
    parser.add_argument("--prompt-len", type=int, default=64)
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--data", default=None, help="Multi30k directory (default: recorded)")
    parser.add_argument("--split", default="test_2016_flickr")
    parser.add_argument("--bleu-sentences", type=int, default=0, help="0: the whole split")
    parser.add_argument("--beam", type=int, default=4)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--agreement-sentences", type=int, default=200)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--json", default=str(RESULTS / "quantized_quality.json"))
    parser.add_argument("--markdown", default=None, help="default: the --json path, .md")
    parser.add_argument("--smoke", action="store_true", help="tiny runs and sizes; /tmp results")
    args = parser.parse_args(argv)
    if args.smoke:
        smoke(args)
    if args.lm_run is None and args.mt_model is None:
        parser.error("give --lm-run and/or --mt-model")
    for name in args.variants.split(","):
        parse_variant(name, args.group_size)  # fail before any work
    if args.threads:
        torch.set_num_threads(args.threads)
    meta = machine_info() | {"threads": torch.get_num_threads(), "group_size": args.group_size}
    results: dict[str, Any] = {"meta": meta}
    if args.lm_run is not None:
        results["lm"] = lm_quality(args)
    if args.mt_model is not None:
        results["mt"] = mt_quality(args)
    markdown = format_markdown(results)
    print(markdown)
    json_path = Path(args.json)
    md_path = Path(args.markdown) if args.markdown else json_path.with_suffix(".md")
    json_path.parent.mkdir(parents=True, exist_ok=True)
    json_path.write_text(json.dumps(results, indent=2) + "\n", encoding="utf-8")
    md_path.write_text(markdown, encoding="utf-8")
    print(f"wrote {json_path} and {md_path}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
