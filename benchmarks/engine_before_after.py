"""Decoding speed before and after issue 48's decode engine, side by side, on one host.

Issue 48 replaced the implicit fast path (``decode_layout``: methods patched onto the live model,
weight copies kept with it between calls) by an explicit engine (``GenerationConfig(engine=...)``:
the layers run from outside, copies owned by one call or a held session). This script runs the
two speed benchmarks of attnlab's decoding — ``benchmarks/generation.py`` (float32) and
``benchmarks/quantized_decoding.py`` (int8/int4) — once for the code *before* the change (a
source tree given by ``--before``, e.g. a ``git worktree`` of the commit before issue 48, each
tree with its own benchmark scripts and its own C++ extension build directory) and once for this
checkout, in the order before, after, after, before (gen, gen, quant, quant), then writes their
attnlab rows side by side. transformers' rows of the same runs are the control: the same code
both times, so their ratio shows how much the host itself drifted between the runs.

    git worktree add /tmp/base <commit before issue 48>
    python benchmarks/engine_before_after.py --before /tmp/base      # ~25-30 min, alone
    python benchmarks/engine_before_after.py --before /tmp/base --quick   # a short look

A second table times one decode step in alternating processes (before, after, after, before,
... ``--step-rounds`` times each): a small worker (``--worker``, the same code for both versions:
``attnlab.build_model``, ``attnlab.quantize``, ``attnlab.generation.stream``) decodes GPT-2 small
(random weights; float32, int8, int4 with the head) after a 32- or 1,000-token prompt and reports
the median step. A benchmark run is one sample of its host's state; alternating short processes
puts each version's samples side by side, so the drift between runs averages out.

Results: ``benchmarks/results/engine_before_after.{md,json}``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
RESULTS = HERE / "results"


def run_benchmark(tree: Path, script: str, args: list[str], out: Path, ext: Path) -> dict[str, Any]:
    """Run ``tree``'s ``benchmarks/<script>`` against ``tree``'s source, JSON to ``out``."""
    env = dict(os.environ, PYTHONPATH=str(tree / "src"), TORCH_EXTENSIONS_DIR=str(ext))
    cmd = [sys.executable, str(tree / "benchmarks" / script), *args, "--json", str(out),
           "--markdown", str(out.with_suffix(".md"))]  # fmt: skip
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, env=env, cwd=tree, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed:\n{proc.stderr[-3000:]}")
    data: dict[str, Any] = json.loads(out.read_text(encoding="utf-8"))
    data["_seconds"] = time.perf_counter() - t0
    data["_command"] = " ".join(cmd)
    return data


CACHED, HELD, HF = "attnlab (cache)", "attnlab (cache, held session)", "transformers"
# (row label, the before run's label, the after run's label)
GEN_PAIRS = ((CACHED, CACHED, CACHED), (HELD, CACHED, HELD), (HF, HF, HF))


def generation_rows(before: dict[str, Any], after: dict[str, Any]) -> list[dict[str, Any]]:
    """generation.py: throughput and latency, attnlab and transformers, before/after (the held
    session's row: before's plain call, which kept its copies between calls, against it)."""
    rows = []
    for b, a in zip(before["throughput"], after["throughput"], strict=True):
        for label, kb, ka in GEN_PAIRS:
            if kb in b and ka in a:
                rows.append({
                    "benchmark": "generation.py", "case": f"{b['model']} batch {b['batch']}",
                    "competitor": label, "metric": "tokens/s",
                    "before": b[kb]["tokens_per_s"], "after": a[ka]["tokens_per_s"],
                })  # fmt: skip
    for b, a in zip(before["latency"], after["latency"], strict=True):
        for label, kb, ka in GEN_PAIRS:
            if kb in b and ka in a:
                rows.append({
                    "benchmark": "generation.py", "case": f"{b['model']} context {b['context']}",
                    "competitor": label, "metric": "ms/token", "before": b[kb], "after": a[ka],
                })  # fmt: skip
    return rows


def quantized_rows(before: dict[str, Any], after: dict[str, Any]) -> list[dict[str, Any]]:
    """quantized_decoding.py: tokens/s and ms/step of every competitor, before/after."""
    rows = []
    for batch, b_rows in before["decoding"].items():
        a_rows = after["decoding"][batch]
        pairs = [(k, k, k) for k in b_rows]
        pairs += [
            (f"{k} (session)", k, f"{k} (session)") for k in b_rows if f"{k} (session)" in a_rows
        ]
        for label, kb, ka in pairs:
            b, a = b_rows.get(kb), a_rows.get(ka)
            if not isinstance(b, dict) or not isinstance(a, dict) or "tokens_per_s" not in b:
                continue
            for metric, key in (("tokens/s", "tokens_per_s"), ("ms/step", "step_ms")):
                if key in b and key in a:
                    rows.append({
                        "benchmark": "quantized_decoding.py", "case": f"batch {batch}",
                        "competitor": label, "metric": metric, "before": b[key], "after": a[key],
                    })  # fmt: skip
    return rows


def markdown(rows: list[dict[str, Any]], meta: dict[str, Any]) -> str:
    lines = [
        "# Decoding before and after issue 48's decode engine (benchmarks/engine_before_after.py)",
        "",
        f"{meta['host']}; {meta['date_utc']}. Before: `{meta['before']}` (the implicit "
        "`decode_layout`, copies kept with the model between calls). After: this checkout "
        '(`engine="auto"`, the default: the fused engine makes its copies at each call and '
        "frees them at its end; the rows marked *held session* / *(session)* run the same engine "
        "through a `DecodeSession` kept across calls, against before's plain call). "
        "Each benchmark ran once per version, in the order before, "
        "after, after, before; within a run its competitors take turns and report medians. "
        "The transformers rows run the same code both times: their ratio is the host's own "
        "drift between the runs.",
        "",
        f"Commands: {'; '.join(meta['commands'])}",
        "",
        "| benchmark | case | competitor | metric | before | after | after / before |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        ratio = r["after"] / r["before"] if r["before"] else float("nan")
        lines.append(
            f"| {r['benchmark']} | {r['case']} | {r['competitor']} | {r['metric']} | "
            f"{r['before']:.2f} | {r['after']:.2f} | {ratio:.3f} |"
        )
    return "\n".join(lines) + "\n"


# (format, batch, prompt length) of the step table
STEP_CASES = (("fp32", 1, 32), ("fp32", 1, 1000), ("fp32", 8, 32), ("int8", 1, 32),
              ("int4+head", 1, 32), ("int4+head", 8, 32))  # fmt: skip


def worker(steps: int = 32, calls: int = 3) -> dict[str, float]:
    """Median ms per decode step of every case in :data:`STEP_CASES`, with whatever attnlab
    is importable (this checkout or the tree in ``PYTHONPATH``): the default ``generate`` path
    of that version, warmed up by one call."""
    import itertools
    import statistics

    import torch

    import attnlab
    from attnlab.generation import stream

    torch.manual_seed(0)
    base = attnlab.build_model("gpt2-small", dropout=0.0, eos_id=None).eval()
    out: dict[str, float] = {}
    for fmt, batch, prompt in STEP_CASES:
        model = base
        if fmt != "fp32":
            import copy

            model = attnlab.quantize(copy.deepcopy(base), fmt.split("+")[0],
                                     include_lm_head="+head" in fmt)  # fmt: skip
        g = torch.Generator().manual_seed(1)
        ids = torch.randint(0, 50257, (batch, prompt), generator=g)

        def times(n: int, m: Any = model, x: Any = ids) -> list[float]:
            it = stream(m, x, max_new_tokens=n + 1, eos_id=())
            next(it)  # the prefill's token
            stamps = [time.perf_counter()]
            stamps += [time.perf_counter() for _ in it]
            return [b - a for a, b in itertools.pairwise(stamps)]

        times(4)
        samples = [t for _ in range(calls) for t in times(steps)]
        out[f"{fmt} batch {batch} context {prompt}"] = statistics.median(samples) * 1e3
    return out


def step_table(trees: dict[str, Path], ext: dict[str, Path], rounds: int) -> dict[str, Any]:
    """:func:`worker` in alternating processes: ``{version: {case: [ms per round]}}``."""
    found: dict[str, dict[str, list[float]]] = {"before": {}, "after": {}}
    for r in range(rounds):
        order = ["before", "after"] if r % 2 == 0 else ["after", "before"]
        for version in order:
            env = dict(os.environ, PYTHONPATH=str(trees[version] / "src"),
                       TORCH_EXTENSIONS_DIR=str(ext[version]))  # fmt: skip
            proc = subprocess.run(
                [sys.executable, str(Path(__file__).resolve()), "--worker"], env=env,
                cwd=trees[version], capture_output=True, text=True, check=False,
            )  # fmt: skip
            if proc.returncode != 0:
                raise RuntimeError(f"step worker ({version}) failed:\n{proc.stderr[-3000:]}")
            for case, ms in json.loads(proc.stdout.strip().splitlines()[-1]).items():
                found[version].setdefault(case, []).append(ms)
    return found


def step_markdown(steps: dict[str, dict[str, list[float]]]) -> str:
    """The alternating step table: each version's runs (ms per step) and the median ratio."""
    import statistics

    rounds = len(next(iter(steps["before"].values()), []))
    lines = [
        "",
        "## One decode step, alternating processes",
        "",
        f"GPT-2 small (random weights), greedy, the default `generate` path of each version; "
        f"{rounds} processes per version, alternating (before, after, after, before, ...); "
        "each process: median ms per step over three calls of 32 steps after one warm-up call. "
        "The ratio is after / before of the medians across processes.",
        "",
        "| case | before (ms per step, per process) | after | after / before |",
        "|---|---|---|---|",
    ]
    for case, before in steps["before"].items():
        after = steps["after"][case]
        ratio = statistics.median(after) / statistics.median(before)
        cells = [", ".join(f"{x:.2f}" for x in v) for v in (before, after)]
        lines.append(f"| {case} | {cells[0]} | {cells[1]} | {ratio:.3f} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--before", help="source tree of the code before (required)")
    parser.add_argument("--quick", action="store_true", help="short runs (not for the record)")
    parser.add_argument("--step-rounds", type=int, default=3, help="alternating step runs each")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--json", default=str(RESULTS / "engine_before_after.json"))
    parser.add_argument("--markdown", default=str(RESULTS / "engine_before_after.md"))
    args = parser.parse_args(argv)
    if args.worker:
        print(json.dumps(worker()))
        return 0
    if args.before is None:
        parser.error("--before is required")
    before_tree = Path(args.before).resolve()
    gen_args = ["--models", "gpt2-small,gpt-char-baby", "--uncached-new-tokens", "0"]
    quant_args = ["--variants", "fp32,int8,int8+head,int4,int4+head", "--kernel-reps", "5"]
    # the after runs add attnlab through a DecodeSession held across calls
    extra = {"generation.py": ["--held-session"], "quantized_decoding.py": ["--held-sessions"]}
    if args.quick:
        gen_args += ["--new-tokens", "32", "--repeats", "1", "--contexts", "32"]
        quant_args += ["--new-tokens", "32", "--repeats", "1", "--no-dynamic"]
    with tempfile.TemporaryDirectory() as tmp:
        t = Path(tmp)
        ext = {"before": t / "ext-before", "after": t / "ext-after"}
        trees = {"before": before_tree, "after": ROOT}
        runs: dict[str, dict[str, Any]] = {}
        plan = [("before", "generation.py", gen_args), ("after", "generation.py", gen_args),
                ("after", "quantized_decoding.py", quant_args),
                ("before", "quantized_decoding.py", quant_args)]  # fmt: skip
        for version, script, given in plan:
            key = f"{version}:{script}"
            print(f"running {key} ...", file=sys.stderr, flush=True)
            flags = given + (extra[script] if version == "after" else [])
            runs[key] = run_benchmark(
                trees[version], script, flags, t / f"{version}-{script}.json", ext[version]
            )
        print("running the alternating step table ...", file=sys.stderr, flush=True)
        steps = step_table(trees, ext, 1 if args.quick else args.step_rounds)
    rows = generation_rows(runs["before:generation.py"], runs["after:generation.py"])
    rows += quantized_rows(runs["before:quantized_decoding.py"],
                           runs["after:quantized_decoding.py"])  # fmt: skip
    meta = runs["after:generation.py"]["meta"]
    from attnlab.analysis.attention_bench import describe_machine

    info = {
        "host": describe_machine(meta, meta["threads"]),
        "date_utc": meta["date_utc"],
        "before": str(before_tree),
        "quick": args.quick,
        "commands": [f"{k} ({v['_seconds']:.0f} s)" for k, v in runs.items()],
    }
    out = {"meta": info, "rows": rows, "runs": runs, "steps": steps}
    text = markdown(rows, info) + step_markdown(steps)
    Path(args.json).write_text(json.dumps(out, indent=2) + "\n", encoding="utf-8")
    Path(args.markdown).write_text(text, encoding="utf-8")
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
