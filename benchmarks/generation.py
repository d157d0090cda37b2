"""Generation speed: attnlab (with / without KV cache) vs transformers' ``generate`` (issues 6, 13).

Same process, same random weights (a Hugging Face GPT-2 with random init, saved and loaded with
:func:`attnlab.from_pretrained`), same prompts, greedy decoding with EOS switched off so every
run produces exactly the requested tokens; the implementations take turns (A B C, B C A, ...) so
that a slow spell of a shared machine hits each alike. Three measurements:

- throughput: tokens/s = batch · new tokens / wall time of one ``generate`` call (prefill
  included), for each batch size, a 32-token prompt and 256 new tokens; attnlab without a cache
  recomputes the whole prefix each step, so it runs ``--uncached-new-tokens`` (default 64) only
  (its tokens/s falls as the sequence grows; the number is reported with its length);
- per-token latency at a context of 32 and 1,000 tokens (batch 1): the wall time between
  consecutive tokens while decoding after a prompt of that length (attnlab's
  :func:`attnlab.generation.stream`, transformers' ``streamer`` hook), median over the steps
  of every round, the first step (the prefill) left out;
- the batch-1 floor: decoding one token reads every weight once, so per-token time cannot beat
  weight bytes / memory bandwidth, with the bandwidth measured here as a 256 MiB tensor copy
  (bytes read + written per second; ``torch.Tensor.copy_``).

Models: ``gpt2-small`` shapes (124M) and a small preset (``gpt-char-baby``: d_model 128, 4
layers, vocabulary 256; its context raised to 1,024 so the long-context case fits). The tokens of
attnlab and transformers are checked to be identical. Results:
``benchmarks/results/generation.{md,json}``.

    python benchmarks/generation.py            # the full run (~8-10 min on 2 cores)
    python benchmarks/generation.py --quick    # a short look (~1-2 min)
"""

from __future__ import annotations

import argparse
import itertools
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
from attnlab.analysis.attention_bench import describe_machine, machine_info
from attnlab.generation import stream

RESULTS = Path(__file__).resolve().parent / "results"
MODELS: dict[str, dict[str, Any]] = {
    "gpt2-small": dict(n_embd=768, n_layer=12, n_head=12, vocab_size=50257),
    "gpt-char-baby": dict(n_embd=128, n_layer=4, n_head=4, vocab_size=256),
}
CACHED, UNCACHED, HF = "attnlab (cache)", "attnlab (no cache)", "transformers"
HELD = "attnlab (cache, held session)"  # --held-session: the engine's copies made once


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


def copy_bandwidth(mib: int = 256, repeats: int = 5) -> float:
    """GB/s moved (read + write) by copying a ``mib`` MiB float32 tensor, median of ``repeats``."""
    src = torch.randn(mib * 2**20 // 4)
    dst = torch.empty_like(src)
    dst.copy_(src)
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        dst.copy_(src)
        times.append(time.perf_counter() - t0)
    return 2 * src.nbytes / statistics.median(times) / 1e9


def weight_bytes(model: torch.nn.Module) -> int:
    """Bytes of every parameter, each shared (tied) tensor once: what one decoded token reads."""
    unique = {p.data_ptr(): p for p in model.parameters()}
    return sum(p.numel() * p.element_size() for p in unique.values())


class _StepClock:
    """A transformers streamer that records when each token arrives (``put`` per step)."""

    def __init__(self) -> None:
        self.stamps: list[float] = []

    def put(self, value: torch.Tensor) -> None:
        self.stamps.append(time.perf_counter())

    def end(self) -> None:
        pass


Run = Callable[[torch.Tensor, int], torch.Tensor]  # (prompt ids (B, P), new tokens) -> (B, N)
StepTimes = Callable[[torch.Tensor, int], list[float]]  # -> seconds per decode step


def implementations(hf: Any, ours: Any, held: bool = False) -> dict[str, tuple[Run, StepTimes]]:
    """Each implementation as (a generate call, a per-step timer); ``held``: also attnlab
    through a :class:`~attnlab.generation.engines.DecodeSession` per batch size, kept across
    calls (the fused engine then makes its weight copies once, not at every call)."""
    sessions: dict[int, Any] = {}

    def session_for(ids: torch.Tensor) -> Any:
        from attnlab.generation.engines import DecodeSession

        if ids.shape[0] not in sessions:
            sessions[ids.shape[0]] = DecodeSession(ours, rows=ids.shape[0])
        return sessions[ids.shape[0]]

    def hf_run(ids: torch.Tensor, n: int, streamer: Any = None) -> torch.Tensor:
        with torch.inference_mode():
            out = hf.generate(
                ids,
                attention_mask=torch.ones_like(ids),
                max_new_tokens=n,
                do_sample=False,
                streamer=streamer,
            )
        return out[:, ids.shape[1] :]

    def hf_steps(ids: torch.Tensor, n: int) -> list[float]:
        clock = _StepClock()
        hf_run(ids, n, clock)
        # stamps: the prompt, then one per new token; the first token comes from the prefill.
        return [b - a for a, b in itertools.pairwise(clock.stamps[1:])]

    def ours_steps(use_cache: bool, keep: bool = False) -> StepTimes:
        def steps(ids: torch.Tensor, n: int) -> list[float]:
            session = session_for(ids) if keep else None
            it = stream(ours, ids, max_new_tokens=n, eos_id=(), use_cache=use_cache,
                        decode_session=session)  # fmt: skip
            next(it)  # the prefill's token
            stamps = [time.perf_counter()]
            for _ in it:
                stamps.append(time.perf_counter())
            return [b - a for a, b in itertools.pairwise(stamps)]

        return steps

    def ours_run(use_cache: bool, keep: bool = False) -> Run:
        return lambda ids, n: attnlab.generate(
            ours, ids, max_new_tokens=n, eos_id=(), use_cache=use_cache,
            decode_session=session_for(ids) if keep else None,
        )  # fmt: skip

    impls = {
        CACHED: (ours_run(True), ours_steps(True)),
        UNCACHED: (ours_run(False), ours_steps(False)),
        HF: (hf_run, hf_steps),
    }
    if held:
        impls[HELD] = (ours_run(True, keep=True), ours_steps(True, keep=True))
    return impls


def _rotations(labels: list[str], rounds: int) -> list[list[str]]:
    return [labels[r % len(labels) :] + labels[: r % len(labels)] for r in range(rounds)]


def throughput(
    impls: dict[str, tuple[Run, StepTimes]], ids: torch.Tensor, args: argparse.Namespace
) -> dict[str, Any]:
    """tokens/s of one ``generate`` call per implementation (interleaved rounds, medians)."""
    tokens = {
        label: args.uncached_new_tokens if label == UNCACHED else args.new_tokens for label in impls
    }
    labels = [label for label in impls if tokens[label] > 0]
    outputs = {label: impls[label][0](ids, 2) for label in labels}  # warm-up
    times: dict[str, list[float]] = {label: [] for label in labels}
    for order in _rotations(labels, args.repeats):
        for label in order:
            t0 = time.perf_counter()
            outputs[label] = impls[label][0](ids, tokens[label])
            times[label].append(time.perf_counter() - t0)
    row: dict[str, Any] = {}
    for label in labels:
        t = statistics.median(times[label])
        n = tokens[label]
        row[label] = {"new_tokens": n, "seconds": t, "tokens_per_s": ids.shape[0] * n / t}
    if CACHED in outputs and HF in outputs:
        row["same_tokens"] = bool(torch.equal(outputs[CACHED], outputs[HF]))
    return row


def latency(
    impls: dict[str, tuple[Run, StepTimes]], vocab: int, context: int, args: argparse.Namespace
) -> dict[str, Any]:
    """ms per decode step after a ``context``-token prompt, batch 1 (median over all steps)."""
    ids = torch.randint(0, vocab, (1, context), generator=torch.Generator().manual_seed(1))
    labels = [
        label for label in impls if not (label == UNCACHED and context > args.uncached_max_context)
    ]
    steps: dict[str, list[float]] = {label: [] for label in labels}
    for order in _rotations(labels, args.repeats):
        for label in order:
            n = args.uncached_latency_steps if label == UNCACHED else args.latency_steps
            steps[label] += impls[label][1](ids, n + 1)
    return {label: statistics.median(s) * 1e3 for label, s in steps.items() if s}


def format_markdown(results: dict[str, Any]) -> str:
    meta = results["meta"]
    lines = [
        "# Generation speed (benchmarks/generation.py)",
        "",
        f"{describe_machine(meta, meta['threads'])}, transformers "
        f"{meta['transformers']}, {meta['date_utc']}. Greedy, random weights, EOS off, "
        f"{meta['prompt_len']}-token prompts, medians of {meta['repeats']} interleaved rounds. "
        f"Memory copy (256 MiB, read + write): {meta['copy_gb_s']:.1f} GB/s.",
        "",
        "## Throughput (tokens/s, prefill included)",
        "",
        "| model | batch | attnlab cache | attnlab no cache | transformers | cache / transformers "
        "| cache / no cache | same tokens |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in results["throughput"]:
        c, u, h = (r.get(k, {}) for k in (CACHED, UNCACHED, HF))

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
        "Floor: weight bytes (each tied tensor once) / copy bandwidth, the time to read every "
        "weight once.",
        "",
        "| model | context | attnlab cache | attnlab no cache | transformers | transformers / "
        "attnlab | floor | attnlab / floor |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in results["latency"]:
        cells = [f"{r[k]:.2f}" if k in r else "-" for k in (CACHED, UNCACHED, HF)]
        speedup = f"{r[HF] / r[CACHED]:.2f}x" if HF in r and CACHED in r else "-"
        floor = results["floor_ms"][r["model"]]
        lines.append(
            f"| {r['model']} | {r['context']} | " + " | ".join(cells) + f" | {speedup} | "
            f"{floor:.2f} | {r[CACHED] / floor:.2f} |"
        )
    lines += ["", "Weights read per token:"]
    lines += [f"- {k}: {v / 1e6:.1f} MB" for k, v in results["weight_bytes"].items()]
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
    parser.add_argument("--latency-steps", type=int, default=16)
    parser.add_argument("--uncached-latency-steps", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=None, help="torch threads")
    parser.add_argument("--quick", action="store_true", help="32 new tokens, 1 round")
    parser.add_argument(
        "--held-session",
        action="store_true",
        help=f"also {HELD!r}: attnlab through a DecodeSession kept across calls (JSON only)",
    )
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
        "copy_gb_s": copy_bandwidth(),
    }
    results: dict[str, Any] = {
        "meta": meta,
        "throughput": [],
        "latency": [],
        "weight_bytes": {},
        "floor_ms": {},
    }
    for name in args.models.split(","):
        with tempfile.TemporaryDirectory() as tmp:
            hf, ours = build_pair(name, Path(tmp))
        results["weight_bytes"][name] = weight_bytes(ours)
        results["floor_ms"][name] = weight_bytes(ours) / (meta["copy_gb_s"] * 1e9) * 1e3
        impls = implementations(hf, ours, held=args.held_session)
        vocab = MODELS[name]["vocab_size"]
        for batch in map(int, args.batch_sizes.split(",")):
            g = torch.Generator().manual_seed(0)
            ids = torch.randint(0, vocab, (batch, args.prompt_len), generator=g)
            row = {"model": name, "batch": batch, **throughput(impls, ids, args)}
            results["throughput"].append(row)
            print(json.dumps(row), flush=True)
        for context in map(int, args.contexts.split(",")):
            lat = {"model": name, "context": context, **latency(impls, vocab, context, args)}
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
