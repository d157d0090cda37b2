"""The CPU train step with glibc's default allocator settings and with freed memory retained
(:func:`attnlab.allocator.retain_freed_memory`, the trainer's ``retain_cpu_memory``).

The setting belongs to a process, so each arm is a process of its own, and the two take turns
(a host whose speed drifts over minutes, as shared ones do, then slows both alike): per shape,
both workers build :class:`attnlab.GPT` at the shape and take warm-up steps (forward, backward,
fused AdamW, float32, dropout off), then ``--rounds`` rounds follow, each one burst of steps in
either worker, the order alternating. A worker times each step and counts the page faults
(``ru_minflt``) of its bursts. A shape's figures are the medians over rounds of the bursts'
median step times, and the median over rounds of the ratio default / retained (above 1:
retaining is faster).

Shapes: ``baby`` and ``shakespeare`` are ``benchmarks/train_step.py``'s (4x128, context 64,
batch 12; 6x384, context 256, batch 8), ``speedrun`` the model of ``attnlab train
shakespeare-char --preset speedrun`` (the baby GPT with RoPE, RMSNorm, ReLU², QK-norm, a
soft-capped untied head, context 128, batch 12) trained here with AdamW.

    python benchmarks/cpu_allocator.py            # 3 shapes, 40 rounds (~5 min on 2 cores)
    python benchmarks/cpu_allocator.py --quick    # baby only, 3 rounds

Results: ``benchmarks/results/cpu_allocator.{md,json}``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import torch

import attnlab
from attnlab.allocator import retain_freed_memory
from attnlab.analysis.attention_bench import describe_machine, machine_info
from attnlab.training.recipes.text import SPEEDRUN_MODEL

RESULTS = Path(__file__).resolve().parent / "results"
ARMS = ("default", "retained")
# shape -> (GPT fields over the baby GPT's, batch, steps per burst)
SHAPES: dict[str, tuple[dict[str, Any], int, int]] = {
    "baby": ({}, 12, 5),
    "speedrun": (SPEEDRUN_MODEL, 12, 2),
    "shakespeare": (
        {"d_model": 384, "n_heads": 6, "n_layers": 6, "d_ff": 1536, "max_seq_len": 256}, 8, 1,
    ),
}  # fmt: skip


def build(shape: str) -> tuple[attnlab.GPT, int]:
    """The shape's GPT (float32, dropout off) and its batch size."""
    fields, batch, _ = SHAPES[shape]
    config = attnlab.GPTConfig(
        vocab_size=65, d_model=128, n_heads=4, n_layers=4, d_ff=512, max_seq_len=64,
        dropout=0.0, activation="gelu", eos_id=None,
    )  # fmt: skip
    return attnlab.GPT(dataclasses.replace(config, **fields)), batch


class Worker:
    """One arm's process: builds the shape's GPT after setting its allocator, then takes bursts
    of timed steps on request (``step N`` on its stdin; a JSON line back)."""

    def __init__(self, shape: str, arm: str, warmup: int) -> None:
        self.arm = arm
        self.proc = subprocess.Popen(
            [sys.executable, __file__, "--worker", shape, arm, str(warmup)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
        )  # fmt: skip
        self.ready = json.loads(self._line())  # {"retained": bool}

    def _line(self) -> str:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"the {self.arm} worker ended (exit code {self.proc.wait()})")
        return line

    def burst(self, steps: int) -> dict[str, Any]:
        """``steps`` timed steps: their times (s) and the page faults they cost."""
        assert self.proc.stdin is not None
        self.proc.stdin.write(f"step {steps}\n")
        self.proc.stdin.flush()
        return dict(json.loads(self._line()))

    def close(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        self.proc.wait(timeout=60)


def serve(shape: str, arm: str, warmup: int) -> None:
    """The worker's side of :class:`Worker` (``--worker``)."""
    retained = retain_freed_memory() if arm == "retained" else False
    torch.manual_seed(0)
    model, batch = build(shape)
    T = model.config.max_seq_len
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, fused=True)
    x = torch.randint(0, 65, (batch, T))
    y = torch.randint(0, 65, (batch, T))

    def step() -> None:
        model(x, targets=y)[1].backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    for _ in range(warmup):
        step()
    print(json.dumps({"retained": retained}), flush=True)
    for line in sys.stdin:
        n = int(line.split()[1])
        faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        times = []
        for _ in range(n):
            t0 = time.perf_counter()
            step()
            times.append(time.perf_counter() - t0)
        faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults
        print(json.dumps({"times": times, "faults": faults}), flush=True)


def measure(shape: str, rounds: int, steps: int, warmup: int) -> dict[str, Any]:
    """Both arms' processes side by side, taking turns: ``rounds`` rounds of one burst of
    ``steps`` steps each, the order alternating; a shape's summary."""
    workers = {arm: Worker(shape, arm, warmup) for arm in ARMS}
    try:
        bursts: dict[str, list[dict[str, Any]]] = {arm: [] for arm in ARMS}
        for r in range(rounds):
            for arm in ARMS if r % 2 == 0 else ARMS[::-1]:
                bursts[arm].append(workers[arm].burst(steps))
    finally:
        for w in workers.values():
            w.close()
    out: dict[str, Any] = {"shape": shape, "rounds": rounds, "steps_per_burst": steps}
    per_round: dict[str, list[float]] = {}
    for arm in ARMS:
        ms = [statistics.median(b["times"]) * 1e3 for b in bursts[arm]]
        q = statistics.quantiles(ms, n=4) if len(ms) > 1 else [ms[0]] * 3
        per_round[arm] = ms
        out[arm] = {
            "retained": workers[arm].ready["retained"],
            "median_ms": statistics.median(ms), "q1_ms": q[0], "q3_ms": q[2],
            "faults_per_step": statistics.median(b["faults"] / steps for b in bursts[arm]),
        }  # fmt: skip
    ratios = [d / r for d, r in zip(per_round["default"], per_round["retained"], strict=True)]
    out["ratio"] = statistics.median(ratios)
    out["rounds_faster"] = sum(x > 1 for x in ratios)
    out["per_round_ms"] = per_round
    return out


def markdown(summaries: list[dict[str, Any]], meta: dict[str, Any]) -> str:
    lines = [
        "# The CPU train step with freed memory retained (glibc's malloc)",
        "",
        f"{describe_machine(meta, meta['threads'])}, {meta['date']}.",
        "Two processes, one per arm, took turns: a round is one burst of steps in each, the",
        "order alternating. Figures are medians over rounds (interquartile range in brackets);",
        "the ratio is default / retained per round, its median (above 1: retaining is faster),",
        "with the number of rounds in which retaining was faster.",
        "",
        "| shape | rounds x steps | default ms/step | retained ms/step | ratio | rounds faster "
        "| page faults/step default / retained |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for s in summaries:
        d, r = s["default"], s["retained"]
        lines.append(
            f"| {s['shape']} | {s['rounds']} x {s['steps_per_burst']} | {d['median_ms']:.1f} "
            f"({d['q1_ms']:.1f}-{d['q3_ms']:.1f}) | {r['median_ms']:.1f} ({r['q1_ms']:.1f}-"
            f"{r['q3_ms']:.1f}) | {s['ratio']:.3f} | {s['rounds_faster']} of {s['rounds']} | "
            f"{d['faults_per_step']:,.0f} / {r['faults_per_step']:,.0f} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--shapes", default=",".join(SHAPES), help="comma-separated: " + ", ".join(SHAPES)
    )
    p.add_argument("--rounds", type=int, default=40)
    p.add_argument("--warmup", type=int, default=3, help="untimed steps per worker first")
    p.add_argument("--quick", action="store_true", help="baby only, 3 rounds")
    p.add_argument("--json", type=Path, default=RESULTS / "cpu_allocator.json")
    p.add_argument("--markdown", type=Path, default=RESULTS / "cpu_allocator.md")
    p.add_argument("--worker", nargs=3, metavar=("SHAPE", "ARM", "WARMUP"), help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.worker:
        shape, arm, warmup = args.worker
        serve(shape, arm, int(warmup))
        return
    shapes = ["baby"] if args.quick else args.shapes.split(",")
    bad = [s for s in shapes if s not in SHAPES]
    if bad:
        p.error(f"unknown shape(s) {bad}; expected some of {list(SHAPES)}")
    if args.rounds < 1:
        p.error(f"--rounds must be at least 1, got {args.rounds}")
    rounds = 3 if args.quick else args.rounds
    summaries = []
    for shape in shapes:
        summaries.append(measure(shape, rounds, SHAPES[shape][2], args.warmup))
        s = summaries[-1]
        d, r = s["default"]["median_ms"], s["retained"]["median_ms"]
        print(f"{shape}: default {d:.1f} ms, retained {r:.1f} ms, ratio {s['ratio']:.3f}")
    meta = machine_info() | {
        "command": "python benchmarks/cpu_allocator.py " + " ".join(sys.argv[1:]),
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "threads": torch.get_num_threads(),
        "omp_num_threads": os.environ.get("OMP_NUM_THREADS"),
    }
    args.json.parent.mkdir(parents=True, exist_ok=True)
    text = json.dumps({"meta": meta, "summaries": summaries}, indent=1)
    args.json.write_text(text + "\n")
    args.markdown.write_text(markdown(summaries, meta))
    print(markdown(summaries, meta))


if __name__ == "__main__":
    main()
