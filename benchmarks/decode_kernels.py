"""Which matrix-product kernel reads a decoder's weights fastest while decoding (issues 6, 13).

Decoding a few rows makes every projection a skinny product that streams the whole weight from
memory, so the kernel and the weight's memory layout decide the time per token. This script
times one projection of each GPT-2-small shape (q/k/v stacked, attention output, FFN up, FFN
down, vocabulary head) for 1 and 8 input rows with each candidate:

- ``linear``: ``F.linear`` on the ``(out, in)`` parameter (what training uses);
- ``input_major``: ``F.linear`` on an ``(in, out)`` copy seen transposed (GPT-2's ``Conv1D``
  layout; what attnlab's decoding used for 1-2 rows before this comparison);
- ``blocked``: the product 2,048 output rows at a time (what attnlab's LM head used for more
  rows before this comparison: MKL's packing of a slice stays in cache);
- ``mkl_packed``: MKL's packed-GEMM format (``torch.ops.mkl._mkl_reorder_linear_weight`` /
  ``_mkl_linear``), packed once for that number of rows;
- ``onednn``: oneDNN's reordered weight (``torch.ops.mkldnn._reorder_linear_weight`` /
  ``_linear_pointwise``; what the fused decode engine,
  :mod:`attnlab.transforms.decode_engine`, uses since).

Each shape gets as many distinct weights as fill 96 MB (three times this machine's 32 MiB L3),
called in turn as a decoder's layers are, so no weight is served from cache; the candidates
take turns within each round and the median of the rounds is reported. The per-token estimate
adds 12 layers of the four layer projections and the head. Results:
``benchmarks/results/decode_kernels.{md,json}``.

    python benchmarks/decode_kernels.py             # ~2 min on 2 cores
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from attnlab.analysis.attention_bench import describe_machine, machine_info

RESULTS = Path(__file__).resolve().parent / "results"
D, LAYERS, VOCAB = 768, 12, 50257
SHAPES = {  # name: (out, in, times per token)
    "qkv": (3 * D, D, LAYERS),
    "attn_out": (D, D, LAYERS),
    "ffn_up": (4 * D, D, LAYERS),
    "ffn_down": (D, 4 * D, LAYERS),
    "lm_head": (VOCAB, D, 1),
}
STREAM_BYTES = 96 * 2**20

Product = Callable[[torch.Tensor], torch.Tensor]


def blocked(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, block: int) -> torch.Tensor:
    """``F.linear(x, weight, bias)`` for 2-D ``x``, ``block`` output features at a time."""
    out = x.new_empty(x.shape[0], weight.shape[0])
    for i in range(0, weight.shape[0], block):
        torch.addmm(bias[i : i + block], x, weight[i : i + block].t(), out=out[:, i : i + block])
    return out


def candidates(weight: torch.Tensor, bias: torch.Tensor, rows: int) -> dict[str, Product]:
    """The products to compare for one ``(out, in)`` weight, each prepared for ``rows`` rows."""
    input_major = weight.t().contiguous().t()  # (out, in) view of an (in, out) buffer
    packed = torch.ops.mkl._mkl_reorder_linear_weight(weight, rows)
    reordered = torch.ops.mkldnn._reorder_linear_weight(weight, rows)
    return {
        "linear": lambda x: F.linear(x, weight, bias),
        "input_major": lambda x: F.linear(x, input_major, bias),
        "blocked": lambda x: blocked(x, weight, bias, 2048),
        "mkl_packed": lambda x: torch.ops.mkl._mkl_linear(x, packed, weight, bias, rows),
        "onednn": lambda x: torch.ops.mkldnn._linear_pointwise(x, reordered, bias, "none", [], ""),
    }


def time_shape(out_f: int, in_f: int, rows: int, rounds: int) -> dict[str, Any]:
    """Median ms per product of each candidate, streaming distinct weights of this shape."""
    gen = torch.Generator().manual_seed(0)
    count = max(1, math.ceil(STREAM_BYTES / (4 * out_f * in_f)))
    weights = [torch.randn(out_f, in_f, generator=gen) * 0.02 for _ in range(count)]
    biases = [torch.randn(out_f, generator=gen) for _ in range(count)]
    per_weight = [candidates(w, b, rows) for w, b in zip(weights, biases, strict=True)]
    names = list(per_weight[0])
    x = torch.randn(rows, in_f, generator=gen)
    reference = [F.linear(x, w, b) for w, b in zip(weights, biases, strict=True)]
    pairs = list(zip(per_weight, reference, strict=True))
    error = {n: max((fs[n](x) - r).abs().max().item() for fs, r in pairs) for n in names}
    times: dict[str, list[float]] = {n: [] for n in names}
    with torch.inference_mode():
        for r in range(rounds):
            for n in names[r % len(names) :] + names[: r % len(names)]:
                start = time.perf_counter()
                for fs in per_weight:
                    fs[n](x)
                times[n].append((time.perf_counter() - start) / count * 1e3)
    weight_mb = 4 * out_f * in_f / 1e6
    result = {}
    for n in names:
        ms = statistics.median(times[n])
        result[n] = {"ms": ms, "gb_per_s": weight_mb / ms, "max_abs_error": error[n]}
    return {"weights_streamed": count, "weight_mb": weight_mb, "kernels": result}


def markdown(results: dict[str, Any]) -> str:
    """The results as a markdown report."""
    m = results["machine"]
    lines = [
        "# Decode kernels (benchmarks/decode_kernels.py)",
        "",
        f"{describe_machine(m, results['threads'])}, {results['date']}. ms per product (GB/s "
        f"of weight read), median of {results['rounds']} rounds, weights streamed so none "
        "is served from cache.",
        "",
    ]
    for rows, shapes in results["rows"].items():
        names = list(next(iter(shapes.values()))["kernels"])
        lines += [f"## {rows} row(s)", "", "| shape | " + " | ".join(names) + " |"]
        lines.append("|---" * (len(names) + 1) + "|")
        totals = dict.fromkeys(names, 0.0)
        for shape, r in shapes.items():
            cells = []
            for n in names:
                k = r["kernels"][n]
                cells.append(f"{k['ms']:.3f} ({k['gb_per_s']:.1f})")
                totals[n] += k["ms"] * SHAPES[shape][2]
            lines.append(f"| {shape} | " + " | ".join(cells) + " |")
        best = sum(
            min(r["kernels"][n]["ms"] for n in names) * SHAPES[s][2] for s, r in shapes.items()
        )
        lines.append(
            "| **per token** (12 layers + head) | "
            + " | ".join(f"**{totals[n]:.1f}**" for n in names)
            + " |"
        )
        lines += ["", f"Best kernel per shape, per token: {best:.1f} ms.", ""]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0] if __doc__ else None)
    parser.add_argument("--rows", default="1,8", help="comma-separated input rows")
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--json", default=str(RESULTS / "decode_kernels.json"))
    parser.add_argument("--markdown", default=str(RESULTS / "decode_kernels.md"))
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    results: dict[str, Any] = {
        "machine": machine_info(),
        "threads": torch.get_num_threads(),
        "date": time.strftime("%Y-%m-%d %H:%M"),
        "rounds": args.rounds,
        "rows": {},
    }
    for rows in (int(r) for r in args.rows.split(",")):
        results["rows"][str(rows)] = {
            s: time_shape(o, i, rows, args.rounds) for s, (o, i, _) in SHAPES.items()
        }
        print(markdown({**results, "rows": {str(rows): results["rows"][str(rows)]}}))
    Path(args.json).write_text(json.dumps(results, indent=2) + "\n")
    Path(args.markdown).write_text(markdown(results))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
