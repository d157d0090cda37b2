"""Analysis, command line, tables and plot of the attention scaling benchmark.

The measuring lives in :mod:`attnlab.analysis.attention_bench`; this file fits the scaling
exponents and finds the crossovers (:func:`analyse`), turns parsed arguments into a
:class:`~attnlab.analysis.attention_bench.BenchConfig`, formats results as Markdown (one table per
mode: time and peak memory per backend and n, then the exponents, crossovers and largest
lengths), and draws the log-log plot with n and n² reference slopes (matplotlib is optional:
without it the plot is skipped with a message).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from attnlab.analysis.attention_bench import (
    BenchConfig,
    CaseResult,
    describe_machine,
    machine_info,
    run_case,
)

MODE_TITLES = {"forward": "Forward (no grad)", "forward_backward": "Forward + backward"}


def fit_exponent(ns: Sequence[float], values: Sequence[float]) -> float | None:
    """Least-squares slope of log(value) vs log(n); None with fewer than two usable points."""
    pts = [(math.log(n), math.log(v)) for n, v in zip(ns, values, strict=True) if n > 0 and v > 0]
    if len({x for x, _ in pts}) < 2:
        return None
    mx = sum(x for x, _ in pts) / len(pts)
    my = sum(y for _, y in pts) / len(pts)
    sxx = sum((x - mx) ** 2 for x, _ in pts)
    return sum((x - mx) * (y - my) for x, y in pts) / sxx


def crossover(times: dict[int, float], reference: dict[int, float]) -> int | None:
    """Smallest n from which ``times`` beats ``reference`` at every larger n measured by both."""
    common = sorted(set(times) & set(reference))
    best: int | None = None
    for n in reversed(common):
        if times[n] < reference[n]:
            best = n
        else:
            break
    return best


def analyse(cases: Sequence[CaseResult], config: BenchConfig) -> dict[str, dict[str, Any]]:
    """Per ``"backend/mode"``: time and memory exponents, crossover vs math, largest n that ran."""
    lo, hi = config.fit_range
    out: dict[str, dict[str, Any]] = {}
    for mode in config.modes:
        ok = {
            b: {c.n: c for c in cases if c.backend == b and c.mode == mode and c.status == "ok"}
            for b in config.backends
        }
        math_times = {n: c.time_s for n, c in ok.get("math", {}).items() if c.time_s is not None}
        for backend, runs in ok.items():
            fit_ns = [n for n in sorted(runs) if lo <= n <= hi]
            fit_ns = fit_ns if len(fit_ns) >= 2 else sorted(runs)
            times = {n: c.time_s for n, c in runs.items() if c.time_s is not None}
            out[f"{backend}/{mode}"] = {
                "backend": backend,
                "mode": mode,
                "time_exponent": fit_exponent(fit_ns, [runs[n].time_s or 0.0 for n in fit_ns]),
                "mem_exponent": fit_exponent(
                    fit_ns, [float(runs[n].peak_mem_bytes or 0) for n in fit_ns]
                ),
                "fit_ns": fit_ns,
                "crossover_vs_math": None if backend == "math" else crossover(times, math_times),
                "largest_n_ok": max(runs) if runs else None,
                "skipped_ns": sorted(
                    c.n
                    for c in cases
                    if c.backend == backend and c.mode == mode and c.status != "ok"
                ),
            }
    return out


def _cell(case: dict[str, Any] | None) -> str:
    if case is None:
        return "-"
    if case["status"] != "ok":
        return f"{case['status']}"
    mem = (case["peak_mem_bytes"] or 0) / 2**20
    return f"{case['time_s'] * 1e3:.1f} ms / {mem:.0f} MiB"


def _fmt(x: float | None, spec: str = ".2f") -> str:
    return "-" if x is None else format(x, spec)


def format_markdown(results: dict[str, Any]) -> str:
    """The results as Markdown: setup, one table per mode, the analysis, skipped cases."""
    cfg, meta = results["config"], results["meta"]
    backends, cases = cfg["backends"], results["cases"]
    lines = [
        "# Attention scaling",
        "",
        f"{describe_machine(meta)}, Python {meta['python']}, {meta['date_utc']}.",
        "",
        f"B={cfg['batch']}, H={cfg['heads']}, D={cfg['d_head']}, {cfg['dtype']} on "
        f"{cfg['device']}, {'causal' if cfg['causal'] else 'bidirectional'}, "
        f"sliding window {cfg['window']}, "
        f"sparse block {cfg.get('sparse_block') or 'sqrt(n)'} (strided/fixed; bigbird, lsh: "
        f"blocks/chunks of 64), median of up to {cfg['repeats']} calls "
        f"({cfg['time_budget_s']:g} s budget) after {cfg['warmup']} warm-up, threads "
        f"{cfg['threads'] or meta['torch_threads_default']}, memory cap {cfg['mem_cap_gb']:g} GiB.",
        "Cells: median time / peak memory above the inputs.",
    ]
    modes = ["forward", "forward_backward"] if cfg["backward"] else ["forward"]
    for mode in modes:
        by_key = {(c["backend"], c["n"]): c for c in cases if c["mode"] == mode}
        lines += ["", f"## {MODE_TITLES[mode]}", ""]
        lines += ["| n | " + " | ".join(backends) + " |", "|---" * (len(backends) + 1) + "|"]
        for n in sorted({c["n"] for c in cases}):
            row = [_cell(by_key.get((b, n))) for b in backends]
            lines.append(f"| {n} | " + " | ".join(row) + " |")
    lo, hi = cfg["fit_range"]
    lines += [
        "",
        "## Scaling",
        "",
        f"Exponents: least-squares slope of log(time) and log(peak memory) vs log(n) over the "
        f"measured n in [{lo}, {hi}] (all measured n if fewer than two fall there). Crossover: the "
        "smallest n from which the backend is faster than `math` at every larger n both ran.",
        "",
        "| backend | mode | time exponent | memory exponent | faster than math from n | "
        "largest n run |",
        "|---|---|---|---|---|---|",
    ]
    for row in results["analysis"].values():
        cross = "-" if row["backend"] == "math" else _fmt(row["crossover_vs_math"], "d")
        if row["backend"] != "math" and row["crossover_vs_math"] is None:
            cross = "never (in range)"
        lines.append(
            f"| {row['backend']} | {row['mode']} | {_fmt(row['time_exponent'])} | "
            f"{_fmt(row['mem_exponent'])} | {cross} | {_fmt(row['largest_n_ok'], 'd')} |"
        )
    not_run = [c for c in cases if c["status"] != "ok"]
    if not_run:
        lines += ["", "## Not run", ""]
        lines += [
            f"- {c['backend']} n={c['n']} {c['mode']}: {c['status']} ({c['reason']})"
            for c in not_run
        ]
    return "\n".join(lines) + "\n"


def plot_results(results: dict[str, Any], path: str | Path) -> bool:
    """Log-log time and memory vs n with n and n² reference slopes; False without matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    cfg, cases = results["config"], [c for c in results["cases"] if c["status"] == "ok"]
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
    panels = [("time_s", "median time (s)"), ("peak_mem_bytes", "peak memory (bytes)")]
    for ax, (key, label) in zip(axes, panels, strict=True):
        for mode, style in (("forward", "-"), ("forward_backward", "--")):
            for i, backend in enumerate(cfg["backends"]):
                pts = sorted(
                    (c["n"], c[key])
                    for c in cases
                    if c["backend"] == backend and c["mode"] == mode and c[key]
                )
                if pts:
                    suffix = "" if mode == "forward" else " (fwd+bwd)"
                    ax.plot(
                        *zip(*pts, strict=True),
                        style,
                        marker="o",
                        color=f"C{i}",
                        label=backend + suffix,
                    )
        anchor = sorted((c["n"], c[key]) for c in cases if c[key])
        if anchor:
            n0, y0 = anchor[0]
            ns = sorted({c["n"] for c in cases})
            for power, name in ((1, "∝ n"), (2, "∝ n²")):
                ax.plot(ns, [y0 * (n / n0) ** power for n in ns], ":", color="grey", label=name)
        ax.set(xscale="log", yscale="log", xlabel="sequence length n", ylabel=label)
        ax.grid(True, which="both", alpha=0.3)
    axes[0].legend(fontsize=7)
    fig.suptitle(
        f"Attention backends: B={cfg['batch']} H={cfg['heads']} D={cfg['d_head']}, "
        f"{'causal' if cfg['causal'] else 'bidirectional'}"
    )
    fig.tight_layout()
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True


def run_benchmark(
    config: BenchConfig, progress: Callable[[CaseResult], None] | None = None
) -> dict[str, Any]:
    """Run every case (shortest first) and return ``{"meta", "config", "cases", "analysis"}``."""
    cases = []
    for mode in config.modes:
        for n in sorted(config.seq_lens):
            for backend in config.backends:
                res = run_case(config, backend, n, mode)
                cases.append(res)
                if progress is not None:
                    progress(res)
    return {
        "meta": machine_info(),
        "config": asdict(config),
        "cases": [asdict(c) for c in cases],
        "analysis": analyse(cases, config),  # exponents, crossovers, largest n
    }


__all__ = [
    "analyse",
    "crossover",
    "fit_exponent",
    "format_markdown",
    "plot_results",
    "run_benchmark",
]
