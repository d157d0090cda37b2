"""Attention scaling: time and peak memory of every backend vs sequence length (issue 9).

Same code as ``attnlab bench attention``, with the results files as defaults:
``benchmarks/results/attention_scaling.{md,json}`` and ``.png`` when matplotlib is installed.

    python benchmarks/attention_scaling.py                  # n = 256 ... 32768, forward
    python benchmarks/attention_scaling.py --backward       # also forward + backward
    python benchmarks/attention_scaling.py --seq-lens 256,512,1024 --repeats 3   # a quick look

The sparse patterns (``sparse_strided``, ``sparse_fixed`` with the block ``l = sqrt(n)``,
``bigbird``, ``lsh``; issue 50) are among the default backends; their exponents from 1k to 64k
tokens (raise the memory cap: at 64k the generous estimates exceed 4 GiB):

    python benchmarks/attention_scaling.py --seq-lens 1024,...,65536 --fit-range 1024,65536 \
        --backends sdpa,sliding_window,linear,sparse_strided,sparse_fixed,bigbird,lsh \
        --mem-cap-gb 20 --json /tmp/sparse.json --markdown /tmp/sparse.md --plot /tmp/sparse.png

Run it on a quiet machine: every case is a fresh subprocess, timings are medians, and cases whose
estimated peak memory exceeds ``--mem-cap-gb`` (default 4) are reported as skipped.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from attnlab.cli.bench import add_attention_arguments, run_from_args

RESULTS = Path(__file__).resolve().parent / "results"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_attention_arguments(
        parser,
        json_default=str(RESULTS / "attention_scaling.json"),
        markdown_default=str(RESULTS / "attention_scaling.md"),
        plot_default=str(RESULTS / "attention_scaling.png"),
    )
    return run_from_args(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
