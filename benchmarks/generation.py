"""Generation speed: attnlab (with / without KV cache) vs transformers' ``generate`` (issue 6).

Same process, same random weights (a Hugging Face GPT-2 with random init, saved and loaded with
:func:`attnlab.from_pretrained`), same prompts, greedy decoding with EOS switched off so every
run produces exactly the requested tokens. Two measurements:

- throughput: tokens/s = batch · new tokens / wall time (prefill included), for each batch size,
  a 32-token prompt and 256 new tokens; attnlab without a cache recomputes the whole prefix each
  step, so it is run for ``--uncached-new-tokens`` (default 64) tokens only (its tokens/s falls
  as the sequence grows; the number is reported with the length it was measured at);
- per-token latency at a context of 32 and 1,000 tokens: ``(t(prompt, 1 + k new) - t(prompt, 1
  new)) / k``, i.e. the time of one decode step with that many tokens in the cache.

Models: ``gpt2-small`` shapes (124M) and a small preset (``gpt-char-baby``: d_model 128, 4
layers, vocabulary 256; its context raised to 1,024 so the long-context case fits). Timings are
medians of ``--repeats`` runs after a warm-up; the tokens of attnlab and transformers are checked
to be identical. Results: ``benchmarks/results/generation.{md,json}``.

    python benchmarks/generation.py                       # the full run (several minutes)
    python benchmarks/generation.py --quick               # a short look (seconds to a minute)
"""

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
from attnlab.analysis.attention_bench import machine_info

RESULTS = Path(__file__).resolve().parent / "results"
MODELS: dict[str, dict[str, int]] = {
    "gpt2-small": dict(n_embd=768, n_layer=12, n_head=12, vocab_size=50257),
    "gpt-char-baby": dict(n_embd=128, n_layer=4, n_head=4, vocab_size=256),
}


def build_pair(name: str, directory: Path) -> tuple[Any, Any]:
    """(transformers GPT-2, attnlab GPT) with the same random weights, eval mode."""
    import transformers

    transformers.logging.set_verbosity_error()
    torch.manual_seed(0)
    cfg = transformers.GPT2Config(n_positions=1024, **MODELS[name])
    hf = transformers.GPT2LMHeadModel(cfg).eval()
    hf.generation_config.eos_token_id = None  # exactly max_new_tokens tokens every run
    hf.generation_config.pad_token_id = 0
    hf.save_pretrained(directory)
    return hf, attnlab.from_pretrained(directory)


def median_time(fn: Callable[[], Any], repeats: int) -> tuple[float, Any]:
    fn()  # warm-up
    times, out = [], None
    for _ in range(repeats):
        t0 = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), out


def runners(hf: Any, ours: Any) -> dict[str, Callable[[torch.Tensor, int], torch.Tensor]]:
    def hf_run(ids: torch.Tensor, n: int) -> torch.Tensor:
        with torch.inference_mode():
            out = hf.generate(
                ids, attention_mask=torch.ones_like(ids), max_new_tokens=n, do_sample=False
            )
        return out[:, ids.shape[1] :]

    return {
        "attnlab (cache)": lambda ids, n: attnlab.generate(ours, ids, max_new_tokens=n, eos_id=()),
        "attnlab (no cache)": lambda ids, n: attnlab.generate(
            ours, ids, max_new_tokens=n, eos_id=(), use_cache=False
        ),
        "transformers": hf_run,
    }


def throughput(
    run: dict[str, Callable[..., torch.Tensor]], ids: torch.Tensor, args: argparse.Namespace
) -> dict[str, Any]:
    row: dict[str, Any] = {}
    outputs = {}
    for label, fn in run.items():
        n = args.uncached_new_tokens if "no cache" in label else args.new_tokens
        if n <= 0:
            continue
        t, out = median_time(lambda fn=fn, n=n: fn(ids, n), args.repeats)
        outputs[label] = out
        row[label] = {"new_tokens": n, "seconds": t, "tokens_per_s": ids.shape[0] * n / t}
    if "transformers" in outputs:
        row["same_tokens"] = bool(torch.equal(outputs["attnlab (cache)"], outputs["transformers"]))
    return row


def latency(
    run: dict[str, Callable[..., torch.Tensor]], vocab: int, context: int, args: argparse.Namespace
) -> dict[str, float]:
    ids = torch.randint(0, vocab, (1, context), generator=torch.Generator().manual_seed(1))
    k = args.latency_steps
    row = {}
    for label, fn in run.items():
        if "no cache" in label and context > args.uncached_max_context:
            continue
        t1, _ = median_time(lambda fn=fn: fn(ids, 1), args.repeats)
        tk, _ = median_time(lambda fn=fn: fn(ids, 1 + k), args.repeats)
        row[label] = max(tk - t1, 0.0) / k * 1e3  # ms per decode step
    return row


def format_markdown(results: dict[str, Any]) -> str:
    meta = results["meta"]
    lines = [
        "# Generation speed (benchmarks/generation.py)",
        "",
        f"`{meta['command']}` on {meta['platform']} ({meta['processor']}, {meta['cpu_count']} "
        f"CPUs, {meta['threads']} torch threads), torch {meta['torch']}, transformers "
        f"{meta['transformers']}, {meta['date_utc']}. Greedy, random weights, EOS off, "
        f"{meta['prompt_len']}-token prompts, medians of {meta['repeats']} runs.",
        "",
        "## Throughput (tokens/s)",
        "",
        "| model | batch | attnlab cache | attnlab no cache | transformers | cache / transformers "
        "| cache / no cache | same tokens |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in results["throughput"]:
        c, u, h = (r.get(k, {}) for k in ("attnlab (cache)", "attnlab (no cache)", "transformers"))

        def cell(x: dict[str, Any]) -> str:
            return f"{x['tokens_per_s']:.1f} ({x['new_tokens']} new)" if x else "-"

        ratio_h = f"{c['tokens_per_s'] / h['tokens_per_s']:.2f}x" if c and h else "-"
        ratio_u = f"{c['tokens_per_s'] / u['tokens_per_s']:.1f}x" if c and u else "-"
        lines.append(
            f"| {r['model']} | {r['batch']} | {cell(c)} | {cell(u)} | {cell(h)} | {ratio_h} "
            f"| {ratio_u} | {r.get('same_tokens', '-')} |"
        )
    lines += [
        "",
        "## Per-token latency (ms per decode step, batch 1)",
        "",
        "| model | context | attnlab cache | attnlab no cache | transformers |",
        "|---|---|---|---|---|",
    ]
    for r in results["latency"]:
        cells = [
            f"{r[k]:.2f}" if k in r else "-"
            for k in ("attnlab (cache)", "attnlab (no cache)", "transformers")
        ]
        lines.append(f"| {r['model']} | {r['context']} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--models", default=",".join(MODELS), help="comma-separated")
    parser.add_argument("--batch-sizes", default="1,8")
    parser.add_argument("--prompt-len", type=int, default=32)
    parser.add_argument("--new-tokens", type=int, default=256)
    parser.add_argument("--uncached-new-tokens", type=int, default=64, help="0: skip")
    parser.add_argument("--uncached-max-context", type=int, default=1000)
    parser.add_argument("--contexts", default="32,1000", help="per-token latency contexts")
    parser.add_argument("--latency-steps", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=None, help="torch threads")
    parser.add_argument("--quick", action="store_true", help="32 new tokens, 1 repeat, small")
    parser.add_argument("--json", default=str(RESULTS / "generation.json"))
    parser.add_argument("--markdown", default=str(RESULTS / "generation.md"))
    args = parser.parse_args(argv)
    if args.quick:
        args.new_tokens, args.uncached_new_tokens, args.repeats = 32, 16, 1
        args.latency_steps, args.uncached_max_context = 8, 32
    if args.threads:
        torch.set_num_threads(args.threads)
    import transformers

    meta = machine_info() | {
        "transformers": transformers.__version__,
        "threads": torch.get_num_threads(),
        "prompt_len": args.prompt_len,
        "repeats": args.repeats,
    }
    results: dict[str, Any] = {"meta": meta, "throughput": [], "latency": []}
    for name in args.models.split(","):
        with tempfile.TemporaryDirectory() as tmp:
            hf, ours = build_pair(name, Path(tmp))
        run = runners(hf, ours)
        vocab = MODELS[name]["vocab_size"]
        for batch in map(int, args.batch_sizes.split(",")):
            g = torch.Generator().manual_seed(0)
            ids = torch.randint(0, vocab, (batch, args.prompt_len), generator=g)
            row = {"model": name, "batch": batch, **throughput(run, ids, args)}
            results["throughput"].append(row)
            print(json.dumps(row), flush=True)
        for context in map(int, args.contexts.split(",")):
            lat = {"model": name, "context": context, **latency(run, vocab, context, args)}
            results["latency"].append(lat)
            print(json.dumps(lat), flush=True)
    markdown = format_markdown(results)
    print(markdown)
    for path, text in ((args.json, json.dumps(results, indent=2)), (args.markdown, markdown)):
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_text(text + ("\n" if not text.endswith("\n") else ""), encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
