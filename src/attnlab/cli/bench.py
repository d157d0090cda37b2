"""``attnlab bench attention``: time and peak memory of each attention backend vs length.

Each case runs in a fresh subprocess (:mod:`attnlab.analysis.attention_bench`), so a peak
memory figure is the case's own; the report (:mod:`attnlab.analysis.attention_bench_report`)
fits time and memory exponents, finds where each backend overtakes the math path and the
largest length within the memory cap. Output files are checked to be writable first.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any, TextIO

from attnlab.analysis.attention_bench import (
    DEFAULT_BACKENDS,
    DEFAULT_SEQ_LENS,
    BenchConfig,
    CaseResult,
    parse_seq_lens,
)
from attnlab.analysis.attention_bench_report import format_markdown, plot_results, run_benchmark
from attnlab.cli.common import check_device, check_writable, guarded


def add_parser(commands: Any) -> Any:
    """``bench attention``."""
    bench = commands.add_parser("bench", help="benchmarks")
    targets = bench.add_subparsers(dest="bench_target", required=True)
    attention = targets.add_parser(
        "attention",
        help="time and peak memory of each attention backend vs sequence length",
        description=__doc__.split("\n\n")[0] if __doc__ else None,
    )
    add_attention_arguments(attention)
    attention.set_defaults(func=guarded("attnlab bench attention", run_from_args))
    return bench


def add_attention_arguments(
    parser: argparse.ArgumentParser,
    *,
    json_default: str | None = None,
    markdown_default: str | None = None,
    plot_default: str | None = None,
) -> None:
    """The options of ``attnlab bench attention`` (also used by ``benchmarks/``)."""
    d = BenchConfig()
    add = parser.add_argument
    add("--backends", default=",".join(DEFAULT_BACKENDS), help="comma-separated backend names")
    add(
        "--seq-lens",
        default=",".join(str(n) for n in DEFAULT_SEQ_LENS),
        help="comma-separated lengths; 'a,...,b' doubles from a to b (default %(default)s)",
    )
    add("--batch", type=int, default=d.batch)
    add("--heads", type=int, default=d.heads)
    add("--d-head", type=int, default=d.d_head)
    add("--window", type=int, default=d.window, help="sliding_window's window")
    add(
        "--sparse-block",
        type=int,
        default=None,
        help="sparse_strided/sparse_fixed's block l (default: sqrt(n), a power of two)",
    )
    add("--bidirectional", action="store_true", help="non-causal attention (default causal)")
    add("--backward", action="store_true", help="also time forward + backward")
    add("--dtype", default=d.dtype, choices=["float32", "float64", "bfloat16", "float16"])
    add("--device", default=d.device)
    add("--repeats", type=int, default=d.repeats, help="timed calls per case (median)")
    add(
        "--warmup",
        type=int,
        default=d.warmup,
        help="untimed calls first (the first one is the memory measurement)",
    )
    add(
        "--time-budget",
        type=float,
        default=d.time_budget_s,
        help="seconds of timed calls per case before stopping short of --repeats",
    )
    add("--threads", type=int, default=None, help="torch threads per case (default torch's)")
    add("--mem-cap-gb", type=float, default=d.mem_cap_gb, help="skip cases estimated above this")
    add("--timeout", type=float, default=d.timeout_s, help="seconds per case")
    add("--fit-range", default=f"{d.fit_range[0]},{d.fit_range[1]}", help="n range of the fits")
    add("--json", default=json_default, help="write results as JSON here")
    add("--markdown", default=markdown_default, help="write the Markdown report here")
    add("--plot", default=plot_default, help="write a log-log plot here (needs matplotlib)")


def config_from_args(args: argparse.Namespace) -> BenchConfig:
    """Build the config; raises ``ValueError`` on bad values (unknown backends included)."""
    from attnlab.layers import ATTENTION_BACKENDS

    backends = tuple(b.strip() for b in args.backends.split(",") if b.strip())
    for b in backends:
        ATTENTION_BACKENDS.get(b)  # unknown names: a ValueError listing the valid ones
    for name in ("batch", "heads", "d_head", "repeats", "time_budget", "mem_cap_gb", "timeout"):
        _positive(name.replace("_", "-"), getattr(args, name))
    try:
        lo, hi = (int(x) for x in args.fit_range.split(","))
    except ValueError:
        raise ValueError(f"--fit-range must be two integers a,b, got {args.fit_range!r}") from None
    return BenchConfig(
        backends=backends,
        seq_lens=parse_seq_lens(args.seq_lens),
        batch=args.batch,
        heads=args.heads,
        d_head=args.d_head,
        causal=not args.bidirectional,
        backward=args.backward,
        window=args.window,
        sparse_block=args.sparse_block,
        dtype=args.dtype,
        device=check_device(args.device),  # up front, not in every case's process
        repeats=args.repeats,
        warmup=args.warmup,
        threads=args.threads,
        mem_cap_gb=args.mem_cap_gb,
        timeout_s=args.timeout,
        time_budget_s=args.time_budget,
        fit_range=(lo, hi),
    )


def _positive(name: str, value: float) -> None:
    if not value > 0:
        raise ValueError(f"--{name} must be positive, got {value}")


def run_from_args(args: argparse.Namespace, stream: TextIO | None = None) -> int:
    """Run the benchmark, report progress and tables on ``stream``, write requested files."""
    out = sys.stdout if stream is None else stream
    config = config_from_args(args)
    for flag in ("json", "markdown", "plot"):
        check_writable(getattr(args, flag), what=f"--{flag}")

    def progress(c: CaseResult) -> None:
        detail = (
            f"{c.time_s * 1e3:9.1f} ms {(c.peak_mem_bytes or 0) / 2**20:8.0f} MiB"
            if c.status == "ok" and c.time_s is not None
            else f"{c.status}: {c.reason}"
        )
        out.write(f"{c.mode:16s} {c.backend:15s} n={c.n:<6d} {detail}\n")
        out.flush()

    results = run_benchmark(config, progress)
    report = format_markdown(results)
    out.write("\n" + report)
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(results, indent=1) + "\n", encoding="utf-8")
    if args.markdown:
        Path(args.markdown).parent.mkdir(parents=True, exist_ok=True)
        Path(args.markdown).write_text(report, encoding="utf-8")
    if args.plot:
        if plot_results(results, args.plot):
            out.write(f"plot written to {args.plot}\n")
        else:
            out.write("matplotlib is not installed: no plot (pip install matplotlib)\n")
    return 0


__all__ = ["add_attention_arguments", "add_parser", "config_from_args", "run_from_args"]
