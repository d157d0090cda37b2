"""Nightly property run: the attention properties of CI with many more examples, random seeds.

Runs ``tests/hardening/test_property_attention.py`` with ``ATTNLAB_PROPERTY_SCALE`` times the
CI example counts (default 50: 55,000 examples instead of 1,100) and a fresh hypothesis seed
(CI is derandomized, so it always tries the same examples; this target explores new ones).

    python benchmarks/property_nightly.py                    # scale 50, random seed
    python benchmarks/property_nightly.py --scale 5 --seed 1234   # a quick, reproducible look

A failure prints hypothesis' minimal example and a ``@reproduce_failure`` blob; rerun with the
same ``--seed`` and ``--scale`` to reproduce it. The summary (seed, scale, examples per
property, pass/fail, wall time, machine, versions, command) goes to
``benchmarks/results/property_nightly.json`` (``--out``). Exit status: pytest's.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import re
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TESTS = ROOT / "tests" / "hardening" / "test_property_attention.py"
RESULTS = ROOT / "benchmarks" / "results"


def ci_examples() -> dict[str, int]:
    """``EXAMPLES`` of the test module, read without importing it (it needs hypothesis)."""
    text = TESTS.read_text(encoding="utf-8")
    block = text.split("EXAMPLES: dict[str, int] = {", 1)[1].split("}", 1)[0]
    return {m[0]: int(m[1]) for m in re.findall(r'"(\w+)": (\d+)', block)}


def versions() -> dict[str, str]:
    out = {"python": platform.python_version()}
    for name in ("torch", "hypothesis", "attnlab"):
        try:
            module = __import__(name)
            out[name] = str(getattr(module, "__version__", "?"))
        except ImportError:
            out[name] = "not installed"
    return out


def examples_run(output: str) -> dict[str, int]:
    """Passing + failing examples per property, from ``--hypothesis-show-statistics``."""
    counts: dict[str, int] = {}
    test = None
    for line in output.splitlines():
        header = re.match(r"\S+::(test_\w+):$", line.strip())
        if header:
            test = header[1]
            continue
        ran = re.search(r"(\d+) passing, (\d+) failing", line)
        if ran and test:
            counts[test] = counts.get(test, 0) + int(ran[1]) + int(ran[2])
    return counts


def torch_threads() -> int | None:
    try:
        import torch
    except ImportError:
        return None
    return torch.get_num_threads()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--scale", type=int, default=50, help="multiple of the CI counts")
    parser.add_argument("--seed", type=int, default=None, help="hypothesis seed (default random)")
    parser.add_argument("--out", default=str(RESULTS / "property_nightly.json"))
    parser.add_argument("pytest_args", nargs="*", help="extra pytest arguments (e.g. -k linear)")
    args = parser.parse_args(argv)
    if args.scale < 2:
        parser.error(f"--scale must be >= 2 (1 is the CI run), got {args.scale}")
    seed = random.SystemRandom().randrange(2**32) if args.seed is None else args.seed
    cmd = [
        sys.executable, "-m", "pytest", str(TESTS.relative_to(ROOT)), "-q",
        "-p", "no:cacheprovider", f"--hypothesis-seed={seed}", "--hypothesis-show-statistics",
        *args.pytest_args,
    ]  # fmt: skip
    env = {**os.environ, "ATTNLAB_PROPERTY_SCALE": str(args.scale)}
    print(f"seed {seed}, scale {args.scale}: {' '.join(cmd)}", flush=True)
    start = time.perf_counter()
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - start
    sys.stdout.write(proc.stdout[-20000:])
    sys.stderr.write(proc.stderr[-5000:])
    ran = examples_run(proc.stdout)
    summary = {
        "passed": proc.returncode == 0,
        "returncode": proc.returncode,
        "seed": seed,
        "scale": args.scale,
        "examples_configured": {k: v * args.scale for k, v in ci_examples().items()},
        "examples_run": ran,
        "total_examples": sum(ran.values()),
        "wall_s": round(wall, 1),
        "result_line": (proc.stdout.strip().splitlines() or [""])[-1],
        "machine": {
            "platform": platform.platform(),
            "processor": platform.processor() or platform.machine(),
            "cpus": os.cpu_count(),
            "torch_threads": torch_threads(),
        },
        "versions": versions(),
        "command": f"ATTNLAB_PROPERTY_SCALE={args.scale} python " + " ".join(cmd[1:]),
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(summary, indent=2) + "\n", encoding="utf-8")
    print(f"{summary['total_examples']} examples in {wall:.0f} s -> {out}")
    return proc.returncode


if __name__ == "__main__":
    sys.exit(main())
