"""Speed of Mamba's selective scan (issue 24): the parallel scan (recursive doubling, with its
adjoint as the backward) against the naive Python loop over time, and how both scale with n.

Rows, each on the same inputs in this process, float32:

- ``model/parallel``, ``model/sequential``: a training step of ``attnlab train shakespeare-char
  --arch mamba`` (the ``mamba-char-baby`` model: d_model 128, E 256, N 16, 7 layers) through the
  recipe's ``Trainer.train_step`` (forward, backward, clipping, AdamW) on ``--batch`` blocks of n
  characters, with ``--scan`` switched;
- ``scan/parallel``, ``scan/sequential``: :func:`attnlab.layers.ssm_scan.selective_scan` alone
  (discretisation, the recurrence, the read-out; forward + backward) on ``(B, n, E)`` inputs.

For every n: training tokens/s (B·n over the median step time of ``--rounds`` rounds of
``--repeats`` steps, the row order rotated each round), the speed-up of the parallel scan over
the loop, and the bytes autograd keeps for the backward (counted with
``torch.autograd.graph.saved_tensors_hooks``, each storage once: the O(n) memory claim; for the
model rows next to the closed form :func:`attnlab.analysis.activation_bytes`). The scaling
exponent is the least-squares slope of log(step time) on log(n), over all n and over n >= 256
(where the loop's per-step Python overhead no longer dominates).

    python benchmarks/scan_speed.py                 # n = 64 .. 4096, batch 2
    python benchmarks/scan_speed.py --smoke         # tiny, to /tmp (the numbers mean nothing)

Results: ``benchmarks/results/scan_speed.{md,json}`` (and ``.png`` via ``attnlab.viz``).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from attnlab import PRESETS
from attnlab.analysis import activation_bytes
from attnlab.analysis.attention_bench import describe_machine, machine_info
from attnlab.analysis.attention_bench_report import fit_exponent
from attnlab.analysis.measure import measure_activation_bytes
from attnlab.layers.ssm_scan import selective_scan
from attnlab.training import Trainer
from attnlab.training.recipes import prepare

RESULTS = Path(__file__).resolve().parent / "results"
ROWS = ("model/parallel", "model/sequential", "scan/parallel", "scan/sequential")


class Row:
    """One row at one n: ``step()`` runs a timed training step; ``saved`` its saved bytes."""

    def __init__(self, step: Callable[[], None], saved: int, closed_form: int | None) -> None:
        self.step, self.saved, self.closed_form = step, saved, closed_form


def model_row(scan: str, B: int, n: int) -> Row:
    """The recipe's Mamba on ``B`` blocks of ``n`` characters, trained by its ``Trainer``."""
    p = prepare("shakespeare-char", {"arch": "mamba", "scan": scan, "block_size": n,
                                     "batch_size": B, "progress": False})  # fmt: skip
    trainer = Trainer(p.model, p.objective, p.train)
    x, y = p.objective.val_batches(B, 1, 0)[0]
    saved = measure_activation_bytes(p.model, (x,), {"targets": y})

    def step() -> None:
        trainer.train_step()

    return Row(step, saved, activation_bytes(p.model_config, n, batch=B)["total"])


def scan_row(scan: str, B: int, n: int) -> Row:
    c = PRESETS["mamba-char-baby"]
    E, N = c.d_inner, c.d_state
    g = torch.Generator().manual_seed(n)
    x = torch.randn(B, n, E, generator=g)
    dt = torch.randn(B, n, E, generator=g).requires_grad_()
    A = (-torch.arange(1.0, N + 1).repeat(E, 1)).requires_grad_()
    Bm, C = torch.randn(B, n, N, generator=g), torch.randn(B, n, N, generator=g)

    def loss() -> Tensor:
        return selective_scan(x, F.softplus(dt), A, Bm, C, scan=scan)[0].square().mean()

    return Row(lambda: loss().backward(), saved_bytes(loss), None)


def saved_bytes(step: Callable[[], Tensor]) -> int:
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


def timed(step: Callable[[], None], repeats: int) -> list[float]:
    out = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        step()
        out.append(time.perf_counter() - t0)
    return out


def run(args: argparse.Namespace) -> dict[str, Any]:
    results: dict[str, dict[int, dict[str, float | int | None]]] = {r: {} for r in args.rows}
    for n in args.ns:
        rows = {}
        for r in args.rows:
            kind, scan = r.split("/")
            rows[r] = (model_row if kind == "model" else scan_row)(scan, args.batch, n)
            timed(rows[r].step, 1)  # warm-up
        times: dict[str, list[float]] = {r: [] for r in args.rows}
        for k in range(args.rounds):
            for r in args.rows[k % len(args.rows) :] + args.rows[: k % len(args.rows)]:
                times[r] += timed(rows[r].step, args.repeats)
        for r in args.rows:
            t = statistics.median(times[r])
            results[r][n] = {"step_s": t, "tokens_per_s": args.batch * n / t,
                             "saved_bytes": rows[r].saved,
                             "closed_form_bytes": rows[r].closed_form}  # fmt: skip
            print(f"n={n} {r}: {1e3 * t:.1f} ms, {args.batch * n / t:,.0f} tok/s")
    exponents = {}
    for r, by_n in results.items():
        ns = sorted(by_n)
        big = [n for n in ns if n >= 256]
        step = [float(by_n[n]["step_s"] or 0) for n in ns]
        exponents[r] = {
            "all": fit_exponent(ns, step),
            "n>=256": fit_exponent(big, [float(by_n[n]["step_s"] or 0) for n in big]),
            "saved_bytes": fit_exponent(ns, [float(by_n[n]["saved_bytes"] or 0) for n in ns]),
        }
    return {"results": results, "exponents": exponents}


def report(args: argparse.Namespace, meta: dict[str, Any], data: dict[str, Any]) -> list[str]:
    res, exps = data["results"], data["exponents"]
    md = ["# Selective-scan speed (benchmarks/scan_speed.py, issue 24)", "",
          describe_machine(meta, torch.get_num_threads()) + ".", ""]  # fmt: skip
    if args.smoke:
        md += ["**Smoke run: tiny sizes, the numbers mean nothing.**", ""]
    md += [
        f"float32, training steps (forward + backward), batch {args.batch}; mamba-char-baby "
        "(E 256, N 16). Saved MB: what autograd keeps (closed form in brackets for the model).",
        "",
        "| n | " + " | ".join(f"{r} tok/s" for r in args.rows) + " | model speed-up | scan speed-up"
        " | " + " | ".join(f"{r} saved MB" for r in args.rows) + " |",
        "|" + "---|" * (3 + 2 * len(args.rows)),
    ]

    def ratio(kind: str, n: int) -> str:
        p, s = res.get(f"{kind}/parallel", {}), res.get(f"{kind}/sequential", {})
        return f"{s[n]['step_s'] / p[n]['step_s']:.2f}x" if n in p and n in s else "-"

    def saved(r: str, n: int) -> str:
        cell = f"{res[r][n]['saved_bytes'] / 2**20:,.1f}"
        closed = res[r][n]["closed_form_bytes"]
        return cell + (f" ({closed / 2**20:,.1f})" if closed is not None else "")

    for n in args.ns:
        cells = [f"{res[r][n]['tokens_per_s']:,.0f}" for r in args.rows]
        mem = [saved(r, n) for r in args.rows]
        md.append(
            f"| {n} | " + " | ".join([*cells, ratio("model", n), ratio("scan", n), *mem]) + " |"
        )

    def fmt(x: float | None) -> str:
        return "-" if x is None else f"{x:.2f}"

    md += ["", "Scaling exponents (slope of log time, and of log saved bytes, on log n):", ""]
    md += ["| row | time, all n | time, n >= 256 | saved bytes |", "|---|---|---|---|"]
    md += [f"| {r} | {fmt(e['all'])} | {fmt(e['n>=256'])} | {fmt(e['saved_bytes'])} |"
           for r, e in exps.items()]  # fmt: skip
    return md


def plot(path: Path, data: dict[str, Any]) -> None:
    from attnlab.viz import plot_benchmark

    cases = [{"n": n, "backend": r, "time_s": v["step_s"], "peak_mem_bytes": v["saved_bytes"]}
             for r, by_n in data["results"].items() for n, v in by_n.items()]  # fmt: skip
    plot_benchmark(cases, style=None, title="Selective scan: parallel vs Python loop", path=path)


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
    p.add_argument("--no-plots", action="store_true")
    p.add_argument("--out", type=Path, default=None)
    args = p.parse_args(argv)
    args.rows = [r for r in args.rows.split(",") if r]
    bad = sorted(set(args.rows) - set(ROWS))
    if bad:
        p.error(f"--rows: unknown {bad}; valid: {', '.join(ROWS)}")
    if args.smoke:
        args.ns, args.rounds, args.repeats, args.batch = [16, 32, 65], 1, 1, 1
        args.out = args.out or Path("/tmp/attnlab_scan_smoke")
    out = args.out or RESULTS
    os.environ.setdefault(
        "ATTNLAB_DATA", str(Path(__file__).resolve().parents[2] / "shared" / "data")
    )
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
    if not args.no_plots:
        try:
            plot(out / "scan_speed.png", data)
            print(f"wrote {out / 'scan_speed.png'}")
        except ImportError as e:
            print(f"no picture: {e}")


if __name__ == "__main__":
    main()
