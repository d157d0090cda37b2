"""Speculative decoding vs plain decoding of the same target, batch 1, greedy (issue 27).

Target: the 10.7M-parameter Shakespeare character GPT (nanoGPT's shape: 6 layers, 6 heads,
d_model 384, context 256); drafts (``--draft``, repeated: each is measured against the same
target): the baby GPT (4 layers, 4 heads, d_model 128, context 64) and smaller ones, all trained
by the ``shakespeare-char`` recipe (commands in docs/speculative.md). Same process, same
prompts (``--prompts`` windows of ``--prompt-len`` characters from the validation split, the last
10% of Tiny Shakespeare), greedy decoding with EOS off, so every call makes exactly
``--new-tokens`` tokens (default 224: prompt + new tokens = the target's 256-token context, so no
token is decoded past it); the implementations take turns (A B C, B C A, ...) so a slow spell of a
shared machine hits each alike.

Measured per prompt, median over ``--repeats`` rounds: tokens/s of one ``attnlab.generate`` call
(prefill included) for plain decoding of the target, speculative decoding with ``k`` in ``--ks``
(default 2..8) with each draft, and plain decoding of each draft alone (its cost per token
relative to the target's, ``c``, bounds what speculation can gain: a round of ``k`` proposals
costs ``k·c + 1`` target-steps, give or take the wider verification forward). Every speculative call's tokens are
compared with plain decoding's: the script exits with status 1 after writing its results if any
differ. Acceptance rate = kept / proposed draft tokens over all prompts; tokens per round = tokens
per target forward. Results: ``benchmarks/results/speculative_decoding.{md,json}``.

    python benchmarks/speculative_decoding.py --target runs/shakespeare-char-10m --draft runs/draft-baby --draft runs/draft-1layer
    python benchmarks/speculative_decoding.py --smoke     # tiny untrained models, seconds; not a result

``--smoke`` builds three tiny random GPTs (a target, two drafts) in the process (no runs needed), decodes 24 tokens with
``k`` = 2 and 4 for one round, and writes its report to a temporary folder unless ``--json`` /
``--markdown`` are given: it checks the script, not the speed.
"""  # noqa: E501

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

import attnlab
from attnlab import GPT, GPTConfig
from attnlab.analysis.attention_bench import describe_machine, machine_info
from attnlab.generation import speculative_generate

RESULTS = Path(__file__).resolve().parent / "results"
PLAIN = "plain (target)"

Run = Callable[[torch.Tensor], tuple[torch.Tensor, dict[str, Any] | None]]


def load_models(
    args: argparse.Namespace,
) -> tuple[GPT, dict[str, GPT], list[torch.Tensor], dict[str, Any]]:
    """(target, drafts by name, prompts, facts about them): trained runs, or tiny random models."""
    if args.smoke:
        torch.manual_seed(0)
        base = dict(vocab_size=65, max_seq_len=64, dropout=0.0, eos_id=None, init_std=0.3)
        target = GPT(GPTConfig(d_model=64, n_heads=2, n_layers=2, d_ff=256, **base))  # type: ignore[arg-type]
        small = [GPTConfig(d_model=d, n_heads=2, n_layers=1, d_ff=4 * d, **base) for d in (32, 16)]  # type: ignore[arg-type]
        drafts = {f"smoke-{c.d_model}": GPT(c).eval() for c in small}
        g = torch.Generator().manual_seed(1)
        prompts = [torch.randint(0, 65, (args.prompt_len,), generator=g) for _ in range(2)]
        return target.eval(), drafts, prompts, {"source": "random (smoke)"}
    from attnlab.data.text import load_text
    from attnlab.tokenizers import load_tokenizer
    from attnlab.training.rundir import find_tokenizer, resolve_model_directory

    models = []
    for path in (args.target, *args.draft):
        model = attnlab.from_pretrained(path)
        if not isinstance(model, GPT):
            raise SystemExit(f"{path} holds a {type(model).__name__}, not a GPT")
        models.append(model.eval())
    names = [Path(path).name for path in args.draft]
    if len(set(names)) != len(names):
        raise SystemExit(f"--draft: the drafts' directory names must differ, got {names}")
    tok_file = find_tokenizer(resolve_model_directory(args.target))
    if tok_file is None:
        raise SystemExit(f"{args.target} has no tokenizer.json")
    tokenizer = load_tokenizer(tok_file)
    text, source = load_text(args.data)
    val = text[int(len(text) * 0.9) :]  # the recipe's validation split (val_fraction 0.1)
    g = torch.Generator().manual_seed(0)
    starts = torch.randint(0, len(val) - args.prompt_len, (args.prompts,), generator=g).tolist()
    texts = [val[s : s + args.prompt_len] for s in starts]
    prompts = [torch.tensor(tokenizer.encode(t)) for t in texts]
    drafts = dict(zip(names, models[1:], strict=True))
    return models[0], drafts, prompts, {"source": str(source), "prompt_texts": texts}


def implementations(
    target: GPT, drafts: dict[str, GPT], ks: list[int], n: int, prompt_len: int
) -> dict[str, Run]:
    def plain(model: GPT, tokens: int = n) -> Run:
        return lambda ids: (
            attnlab.generate(model, ids[None], max_new_tokens=tokens, eos_id=()),
            None,
        )

    def speculative(draft: GPT, k: int) -> Run:
        def run(ids: torch.Tensor) -> tuple[torch.Tensor, dict[str, Any] | None]:
            out = speculative_generate(target, draft, ids[None], max_new_tokens=n,
                                       num_draft_tokens=k, eos_id=())  # fmt: skip
            return out.sequences, out.stats.to_dict()

        return run

    impls = {PLAIN: plain(target)}
    for name, draft in drafts.items():
        impls.update({f"speculative k={k}, draft {name}": speculative(draft, k) for k in ks})
        # Within its context only: past it, plain decoding recomputes the whole window per token,
        # which speculation does not (the draft restarts its cache).
        room = max(1, min(n, draft.config.max_seq_len - prompt_len))
        impls[draft_label(name)] = plain(draft, room)
    return impls


def draft_label(name: str) -> str:
    """The row of plain decoding with draft ``name`` alone."""
    return f"plain (draft {name} alone)"


def measure(impls: dict[str, Run], prompts: list[torch.Tensor], args: argparse.Namespace) -> dict:
    """Per implementation: median tokens/s per prompt, acceptance over all prompts, and whether
    every speculative output equals plain decoding's."""
    labels = list(impls)
    for label in labels:  # warm-up: decode-time weight copies, allocator
        impls[label](prompts[0][:4])
    per_prompt: dict[str, list[float]] = {label: [] for label in labels}
    stats: dict[str, list[dict[str, Any]]] = {label: [] for label in labels}
    mismatches: list[str] = []
    for i, ids in enumerate(prompts):
        times: dict[str, list[float]] = {label: [] for label in labels}
        outputs: dict[str, torch.Tensor] = {}
        for r in range(args.repeats):
            for label in labels[r % len(labels) :] + labels[: r % len(labels)]:
                t0 = time.perf_counter()
                out, st = impls[label](ids)
                times[label].append(time.perf_counter() - t0)
                outputs[label] = out
                if st is not None and r == 0:
                    stats[label].append(st)
        for label in labels:
            tokens = outputs[label].shape[-1]  # new tokens (a draft alone: within its context)
            per_prompt[label].append(tokens / statistics.median(times[label]))
            if label.startswith("speculative") and not torch.equal(outputs[label], outputs[PLAIN]):
                diff = (outputs[label] != outputs[PLAIN]).nonzero()[0, 1].item()
                mismatches.append(f"prompt {i}, {label}: first differing token at {diff}")
    rows = []
    for label in labels:
        tps = statistics.median(per_prompt[label])
        speedups = [a / b for a, b in zip(per_prompt[label], per_prompt[PLAIN], strict=True)]
        row: dict[str, Any] = {
            "implementation": label,
            "tokens_per_s": tps,
            "tokens_per_s_per_prompt": per_prompt[label],
            "speedup_vs_plain": statistics.median(speedups),
        }
        if stats[label]:
            proposed = sum(s["proposed"] for s in stats[label])
            accepted = sum(s["accepted"] for s in stats[label])
            rounds = sum(s["rounds"] for s in stats[label])
            histograms = [s["histogram"] for s in stats[label]]
            row.update(
                acceptance_rate=accepted / proposed,
                tokens_per_round=(accepted + rounds) / rounds,
                histogram=[sum(h) for h in zip(*histograms, strict=True)],
            )
        rows.append(row)
    return {"rows": rows, "mismatches": mismatches}


def describe(model: GPT) -> str:
    c = model.config
    params = sum(p.numel() for p in model.parameters())
    return (f"{params / 1e6:.2f}M parameters: {c.n_layers} layers, {c.n_heads} heads, d_model "
            f"{c.d_model}, context {c.max_seq_len}, vocabulary {c.vocab_size}")  # fmt: skip


def format_markdown(results: dict[str, Any]) -> str:
    meta = results["meta"]
    smoke = " **Smoke run: tiny untrained models; the numbers say nothing about speed.**"
    lines = [
        "# Speculative decoding (benchmarks/speculative_decoding.py)",
        "",
        f"{describe_machine(meta, meta['threads'])}, {meta['date_utc']}. Batch 1, greedy, EOS "
        f"off, {meta['prompts']} prompts of {meta['prompt_len']} tokens ({meta['source']}), "
        f"{meta['new_tokens']} new tokens, medians of {meta['repeats']} interleaved rounds per "
        f"prompt, then the median over prompts." + (smoke if meta["smoke"] else ""),
        "",
        f"- target: {meta['target']}",
        *(f"- draft `{name}`: {text}" for name, text in meta["drafts"].items()),
        "",
        "| implementation | tokens/s | vs plain | acceptance rate | tokens per target forward "
        "| kept per round (0..k) |",
        "|---|---|---|---|---|---|",
    ]
    for r in results["rows"]:
        acc = f"{r['acceptance_rate']:.3f}" if "acceptance_rate" in r else "-"
        tpr = f"{r['tokens_per_round']:.2f}" if "tokens_per_round" in r else "-"
        hist = " ".join(map(str, r["histogram"])) if "histogram" in r else "-"
        lines.append(f"| {r['implementation']} | {r['tokens_per_s']:.1f} | "
                     f"{r['speedup_vs_plain']:.2f}x | {acc} | {tpr} | {hist} |")  # fmt: skip
    rows = {r["implementation"]: r for r in results["rows"]}
    costs = ", ".join(
        f"`{name}` {rows[PLAIN]['tokens_per_s'] / rows[draft_label(name)]['tokens_per_s']:.2f}"
        for name in meta["drafts"]
    )
    best = max((r for r in results["rows"] if "acceptance_rate" in r),
               key=lambda r: r["speedup_vs_plain"])  # fmt: skip
    lines += [
        "",
        f"Draft cost per token / target cost per token (plain decoding), c: {costs}.",
        f"Fastest: {best['implementation']}, {best['speedup_vs_plain']:.2f}x plain decoding "
        "(the median over prompts of each prompt's ratio).",
        "Identical greedy tokens (every speculative call vs plain decoding): "
        + ("yes" if not results["mismatches"] else "NO: " + "; ".join(results["mismatches"])),
    ]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--target", default="runs/shakespeare-char-10m", help="run or model dir")
    parser.add_argument("--draft", action="append", default=None,
                        help="run or model dir; repeat for more drafts, each measured "
                        "(default: runs/shakespeare-char)")  # fmt: skip
    parser.add_argument("--data", default=None, help="text file (default: Tiny Shakespeare)")
    parser.add_argument("--ks", default="2,3,4,5,6,7,8", help="draft lengths, comma-separated")
    parser.add_argument("--prompts", type=int, default=4)
    parser.add_argument("--prompt-len", type=int, default=32)
    parser.add_argument("--new-tokens", type=int, default=224)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=None, help="torch threads")
    parser.add_argument("--smoke", action="store_true", help="tiny random models, a few seconds")
    parser.add_argument("--json", default=None, help="default: results/speculative_decoding.json")
    parser.add_argument("--markdown", default=None, help="default: ...speculative_decoding.md")
    args = parser.parse_args(argv)
    out_dir = RESULTS
    if args.smoke:
        args.ks, args.new_tokens, args.repeats, args.prompt_len = "2,4", 24, 1, 8
        out_dir = Path(tempfile.mkdtemp(prefix="speculative-smoke-"))
    if args.threads:
        torch.set_num_threads(args.threads)
    args.draft = args.draft or ["runs/shakespeare-char"]
    target, drafts, prompts, facts = load_models(args)
    ks = [int(k) for k in args.ks.split(",")]
    meta = machine_info() | {
        "threads": torch.get_num_threads(), "smoke": args.smoke, "prompts": len(prompts),
        "prompt_len": args.prompt_len, "new_tokens": args.new_tokens, "repeats": args.repeats,
        "ks": ks, "target": describe(target),
        "drafts": {name: describe(d) for name, d in drafts.items()}, **facts,
    }  # fmt: skip
    impls = implementations(target, drafts, ks, args.new_tokens, args.prompt_len)
    results = {"meta": meta, **measure(impls, prompts, args)}
    markdown = format_markdown(results)
    print(markdown)
    paths = (args.json or out_dir / "speculative_decoding.json",
             args.markdown or out_dir / "speculative_decoding.md")  # fmt: skip
    for path, text in zip(paths, (json.dumps(results, indent=2) + "\n", markdown), strict=True):
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_text(text, encoding="utf-8")
    print(f"wrote {paths[0]} and {paths[1]}", file=sys.stderr)
    return 1 if results["mismatches"] else 0


if __name__ == "__main__":
    sys.exit(main())
