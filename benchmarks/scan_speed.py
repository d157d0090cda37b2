"""Speed of Mamba's selective scan (issue 24): the parallel scan (recursive doubling, with its
adjoint as the backward) against the naive Python loop over time, and how both scale with n.

Rows, each forward + backward in float32 on the same inputs in this process:

- ``block/parallel``, ``block/sequential``: one :class:`attnlab.layers.ssm.MambaBlock` (RMSNorm,
  projections, causal conv, the scan, gate) of the ``mamba-char-baby`` shape (d_model 128,
  E 256, N 16), with ``scan`` switched;
- ``scan/parallel``, ``scan/sequential``: :func:`attnlab.layers.ssm_scan.selective_scan` alone
  (discretisation, the recurrence, the read-out) on ``(B, n, E)`` inputs.

For every n: training tokens/s (B·n over the median step time of ``--rounds`` rounds of
``--repeats`` steps, the row order rotated each round), the speed-up of the parallel scan over
the loop, and the bytes autograd keeps for the backward (counted with
``torch.autograd.graph.saved_tensors_hooks``, each storage once: the O(n) memory claim). The
scaling exponent is the least-squares slope of log(step time) on log(n), over all n and over
n >= 256 (where the loop's per-step Python overhead no longer dominates).

    python benchmarks/scan_speed.py                 # n = 64 .. 4096, batch 2 (~10-20 min)
    python benchmarks/scan_speed.py --smoke         # tiny, to /tmp

Results: ``benchmarks/results/scan_speed.{md,json}``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from attnlab import PRESETS
from attnlab.analysis.attention_bench import describe_machine, machine_info
from attnlab.analysis.attention_bench_report import fit_exponent
from attnlab.layers.ssm import MambaBlock, MambaMixer
from attnlab.layers.ssm_scan import SCANS, selective_scan

RESULTS = Path(__file__).resolve().parent / "results"
ROWS = ("block/parallel", "block/sequential", "scan/parallel", "scan/sequential")
Step = Callable[[], Tensor]  # runs a forward, returns a scalar loss


def block_step(scan: str, B: int, n: int) -> Step:
    c = PRESETS["mamba-char-baby"]
    torch.manual_seed(0)
    mixer = MambaMixer(c.d_model, c.d_inner, c.d_state, c.d_conv, c.dt_rank_value, scan=scan)
    block = MambaBlock(mixer, c.d_model)
    u = torch.randn(B, n, c.d_model, generator=torch.Generator().manual_seed(n))
    return lambda: block(u).square().mean()


def scan_step(scan: str, B: int, n: int) -> Step:
    c = PRESETS["mamba-char-baby"]
    E, N = c.d_inner, c.d_state
    g = torch.Generator().manual_seed(n)
    x = torch.randn(B, n, E, generator=g)
    dt = torch.randn(B, n, E, generator=g).requires_grad_()
    A = (-torch.arange(1.0, N + 1).repeat(E, 1)).requires_grad_()
    Bm, C = torch.randn(B, n, N, generator=g), torch.randn(B, n, N, generator=g)
    return lambda: selective_scan(x, F.softplus(dt), A, Bm, C, scan=scan)[0].square().mean()


def make(row: str, B: int, n: int) -> Step:
    kind, scan = row.split("/")
    SCANS.get(scan)
    return (block_step if kind == "block" else scan_step)(scan, B, n)


def saved_bytes(step: Step) -> int:
    """Bytes of the tensors autograd saves for the backward of one step (each storage once)."""
    storages: dict[int, int] = {}

    def pack(t: Tensor) -> Tensor:
        s = t.untyped_storage()
        storages[s.data_ptr()] = s.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loss = step()
    loss.backward()
    return sum(storages.values())


def timed(step: Step, repeats: int) -> list[float]:
    out = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        step().backward()
        out.append(time.perf_counter() - t0)
    return out


def run(args: argparse.Namespace) -> dict[str, Any]:
    results: dict[str, dict[int, dict[str, float]]] = {r: {} for r in args.rows}
    for n in args.ns:
        steps = {r: make(r, args.batch, n) for r in args.rows}
        times: dict[str, list[float]] = {r: [] for r in args.rows}
        for r in args.rows:
            timed(steps[r], 1)  # warm-up
        for k in range(args.rounds):
            order = list(args.rows[k % len(args.rows) :]) + list(args.rows[: k % len(args.rows)])
            for r in order:
                times[r] += timed(steps[r], args.repeats)
        for r in args.rows:
            t = statistics.median(times[r])
            results[r][n] = {"step_s": t, "tokens_per_s": args.batch * n / t,
                             "saved_bytes": saved_bytes(steps[r])}  # fmt: skip
            print(f"n={n} {r}: {1e3 * t:.1f} ms, {args.batch * n / t:,.0f} tok/s")
    exponents = {}
    for r, by_n in results.items():
        ns = sorted(by_n)
        big = [n for n in ns if n >= 256]
        exponents[r] = {
            "all": fit_exponent(ns, [by_n[n]["step_s"] for n in ns]),
            "n>=256": fit_exponent(big, [by_n[n]["step_s"] for n in big]),
            "saved_bytes": fit_exponent(ns, [by_n[n]["saved_bytes"] for n in ns]),
        }
    return {"results": results, "exponents": exponents}


def report(args: argparse.Namespace, meta: dict[str, Any], data: dict[str, Any]) -> list[str]:
    res, exps = data["results"], data["exponents"]
    md = [
        "# Selective-scan speed (benchmarks/scan_speed.py, issue 24)",
        "",
        describe_machine(meta, torch.get_num_threads()) + ".",
        f"float32, forward + backward, batch {args.batch}; mamba-char-baby shapes (E 256, N 16).",
        "",
        "| n | " + " | ".join(f"{r} tok/s" for r in args.rows) + " | block speed-up | scan speed-up"
        " | " + " | ".join(f"{r} saved MB" for r in args.rows) + " |",
        "|" + "---|" * (3 + 2 * len(args.rows)),
    ]

    def ratio(kind: str, n: int) -> str:
        p, s = res.get(f"{kind}/parallel", {}), res.get(f"{kind}/sequential", {})
        return f"{s[n]['step_s'] / p[n]['step_s']:.2f}x" if n in p and n in s else "-"

    for n in args.ns:
        cells = [f"{res[r][n]['tokens_per_s']:,.0f}" for r in args.rows]
        mem = [f"{res[r][n]['saved_bytes'] / 2**20:,.1f}" for r in args.rows]
        md.append(
            f"| {n} | " + " | ".join([*cells, ratio("block", n), ratio("scan", n), *mem]) + " |"
        )

    def fmt(x: float | None) -> str:
        return "-" if x is None else f"{x:.2f}"

    md += ["", "Scaling exponents (slope of log time, and of log saved bytes, on log n):", ""]
    md += ["| row | time, all n | time, n >= 256 | saved bytes |", "|---|---|---|---|"]
    md += [f"| {r} | {fmt(e['all'])} | {fmt(e['n>=256'])} | {fmt(e['saved_bytes'])} |"
           for r, e in exps.items()]  # fmt: skip
    return md


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--ns", type=lambda s: [int(x) for x in s.split(",")],
                   default=[64, 128, 256, 512, 1024, 2048, 4096])  # fmt: skip
    p.add_argument("--batch", type=int, default=2)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--rows", default=",".join(ROWS))
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--smoke", action="store_true")
    p.add_argument("--out", type=Path, default=None)
    args = p.parse_args(argv)
    args.rows = [r for r in args.rows.split(",") if r]
    bad = sorted(set(args.rows) - set(ROWS))
    if bad:
        p.error(f"--rows: unknown {bad}; valid: {', '.join(ROWS)}")
    if args.smoke:
        args.ns, args.rounds, args.repeats, args.batch = [16, 32, 300], 1, 1, 1
        args.out = args.out or Path("/tmp/attnlab_scan_smoke")
    out = args.out or RESULTS
    if args.threads:
        torch.set_num_threads(args.threads)
    meta = machine_info()
    data = run(args)
    md = report(args, meta, data)
    out.mkdir(parents=True, exist_ok=True)
    (out / "scan_speed.json").write_text(json.dumps({"meta": meta, **data}, indent=2) + "\n")
    (out / "scan_speed.md").write_text("\n".join(md) + "\n")
    print("\n".join(md))
    print(f"wrote {out / 'scan_speed.md'}")


if __name__ == "__main__":
    main()
