"""The attention scaling benchmark: tiny real cases in subprocesses, skipping, JSON, analysis.

No timing is asserted (timings do not belong in tests); only the shape of what is reported.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from attnlab.analysis.attention_bench import (
    BenchConfig,
    CaseResult,
    estimate_peak_bytes,
    parse_seq_lens,
    run_case,
)
from attnlab.analysis.attention_bench_report import (
    analyse,
    crossover,
    fit_exponent,
    format_markdown,
)
from attnlab.cli.bench import add_parser as add_bench_subparser


def test_parse_seq_lens() -> None:
    assert parse_seq_lens("256,...,2048") == (256, 512, 1024, 2048)
    assert parse_seq_lens("64, 32,64") == (32, 64)
    for bad in ("...,64", "64,...", "x", "0"):
        with pytest.raises(ValueError):
            parse_seq_lens(bad)


def test_memory_estimates_scale_as_expected() -> None:
    cfg = BenchConfig()
    for backend, power in (("math", 2), ("chunked", 1), ("sliding_window", 1), ("linear", 1)):
        small, big = (estimate_peak_bytes(backend, n, cfg, backward=False) for n in (8192, 32768))
        ratio = big / small
        assert 4 ** (power - 0.25) < ratio < 4 ** (power + 0.25), (backend, ratio)
    assert estimate_peak_bytes("math", 4096, cfg, backward=True) > estimate_peak_bytes(
        "math", 4096, cfg, backward=False
    )
    with pytest.raises(ValueError, match="heads"):
        BenchConfig(heads=0)


def test_fit_exponent_and_crossover() -> None:
    ns = [1024, 2048, 4096]
    assert fit_exponent(ns, [3e-9 * n**2 for n in ns]) == pytest.approx(2.0)
    assert fit_exponent(ns, [5e-6 * n for n in ns]) == pytest.approx(1.0)
    assert fit_exponent([1024], [1.0]) is None
    math_t = {256: 1.0, 512: 4.0, 1024: 16.0}
    assert crossover({256: 2.0, 512: 3.0, 1024: 6.0}, math_t) == 512
    assert crossover({256: 0.5, 512: 5.0, 1024: 6.0}, math_t) == 1024  # must hold onwards
    assert crossover({256: 2.0, 512: 8.0, 1024: 32.0}, math_t) is None
    cases = [
        CaseResult(backend=b, n=n, mode="forward", status="ok", est_mem_bytes=0, time_s=t)
        for b, times in (("math", math_t), ("linear", {256: 2.0, 512: 3.0, 1024: 6.0}))
        for n, t in times.items()
    ]
    cfg = BenchConfig(backends=("math", "linear"), seq_lens=(256, 512, 1024), fit_range=(1, 10**6))
    rows = analyse(cases, cfg)
    assert rows["math/forward"]["time_exponent"] == pytest.approx(2.0)
    assert rows["linear/forward"]["crossover_vs_math"] == 512
    assert rows["linear/forward"]["largest_n_ok"] == 1024


def test_cli_runs_tiny_cases_and_reports_skipped_ones(tmp_path: Path) -> None:
    parser = argparse.ArgumentParser(prog="attnlab")
    add_bench_subparser(parser.add_subparsers(dest="command"))
    out_json, out_md, out_png = tmp_path / "r.json", tmp_path / "r.md", tmp_path / "r.png"
    args = parser.parse_args(
        [
            "bench",
            "attention",
            "--backends",
            "math,linear",
            "--seq-lens",
            f"32,{1 << 22}",  # the long one is estimated far above the cap: skipped, not run
            "--heads",
            "1",
            "--d-head",
            "8",
            "--repeats",
            "2",
            "--threads",
            "1",
            "--mem-cap-gb",
            "0.25",
            "--json",
            str(out_json),
            "--markdown",
            str(out_md),
            "--plot",
            str(out_png),
        ]
    )
    assert args.func(args) == 0
    results = json.loads(out_json.read_text(encoding="utf-8"))
    assert set(results) == {"meta", "config", "cases", "analysis"}
    assert {"torch", "platform", "command", "cpu_count"} <= set(results["meta"])
    by_key = {(c["backend"], c["n"]): c for c in results["cases"]}
    assert len(by_key) == 4
    for backend in ("math", "linear"):
        ok, skipped = by_key[(backend, 32)], by_key[(backend, 1 << 22)]
        assert ok["status"] == "ok" and ok["time_s"] > 0 and len(ok["times_s"]) == 2
        assert isinstance(ok["peak_mem_bytes"], int) and ok["threads"] == 1
        assert skipped["status"] == "skipped" and "cap" in skipped["reason"]
        assert skipped["time_s"] is None
    assert results["analysis"]["linear/forward"]["largest_n_ok"] == 32
    report = out_md.read_text(encoding="utf-8")
    assert "| 32 |" in report and "skipped" in report
    assert report == format_markdown(results)
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        assert not out_png.exists()
    else:
        assert out_png.stat().st_size > 0


def test_a_failing_case_is_reported_not_raised() -> None:
    cfg = BenchConfig(backends=("no_such_backend",), seq_lens=(16,), heads=1, d_head=8, repeats=1)
    res = run_case(cfg, "no_such_backend", 16, "forward")
    assert res.status == "error" and "no_such_backend" in (res.reason or "")
