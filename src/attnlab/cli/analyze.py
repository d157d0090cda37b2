"""``attnlab analyze``: parameters, FLOPs, crossover, memory of a preset or a config file.

Examples::

    attnlab analyze gpt3-175b --seq-len 2048
    attnlab analyze my_config.json --batch 8 --json
    attnlab analyze gpt2-small --sweep-seq-len --plot shares.png
    attnlab analyze gpt-char-baby --seq-len 64 --batch 8 --measure
    attnlab analyze mamba-char-baby --seq-len 64 --batch 12     # also lstm-char-baby, ...

A config file is JSON: a config as :func:`attnlab.config.config_to_dict` writes it (with its
``model_type``), ``{"config": {...}}`` (a checkpoint's ``config.json`` layout), or
``{"preset": NAME, **overrides}``.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from attnlab.analysis.measure import (
    example_inputs,
    measure_flops,
    measure_peak_flops,
    measure_step_time,
    mfu,
)
from attnlab.analysis.memory_check import check_training_fits
from attnlab.analysis.params import count_params
from attnlab.analysis.report import analyze, plot_sweep
from attnlab.analysis.scaling import sweep_seq_len
from attnlab.analysis.text import format_report, format_sweep, human
from attnlab.cli.common import check_writable, guarded
from attnlab.io import read_json
from attnlab.models.family import Kind, family_of

# --measure really runs the model on the CPU: refuse what would not fit comfortably.
MEASURE_MAX_PARAMS = 1_000_000_000


def load_config(target: str) -> tuple[str, Any]:
    """Resolve a preset name or a JSON config file to ``(label, config)``.

    Raises:
        ValueError: for an unknown preset, a missing/unreadable file, or a bad config.
    """
    from attnlab.models import PRESETS, config_for, config_from_json_dict

    if target in PRESETS:
        return target, PRESETS[target]
    path = Path(target)
    if not path.is_file():
        presets = ", ".join(sorted(PRESETS))
        raise ValueError(f"{target!r} is neither a preset nor a config file; presets: {presets}")
    data = read_json(path, what="config file")
    if isinstance(data, dict) and isinstance(data.get("config"), dict):
        data = data["config"]
    if not isinstance(data, dict):
        raise ValueError(f"config file {target} must hold a JSON object")
    try:
        if "preset" in data:
            overrides = {k: v for k, v in data.items() if k != "preset"}
            return path.stem, config_for(str(data["preset"]), **overrides)
        return path.stem, config_from_json_dict(data)
    except TypeError as e:  # wrongly typed values reach the dataclass
        raise ValueError(f"bad config in {target}: {e}") from e


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """The ``analyze`` command."""
    p = subparsers.add_parser(
        "analyze",
        help="parameters, FLOPs, crossover length and memory of a model",
        description=(
            "Closed-form analysis of a preset or config file: per-component parameters and "
            "FLOPs (2·m·k·p per matmul), the 6·N·tokens rule, the length where attention "
            "overtakes the projections, training memory and KV cache. Nothing is allocated "
            "unless --measure is given."
        ),
    )
    p.add_argument("target", help="preset name or JSON config file")
    p.add_argument("--seq-len", type=int, default=None, help="tokens per sequence (T)")
    p.add_argument("--src-len", type=int, default=None, help="source tokens (encoder-decoder)")
    p.add_argument("--batch", type=int, default=1, help="sequences per step (B)")
    p.add_argument(
        "--dtype",
        default="float32",
        choices=["float32", "bfloat16", "float16"],
        help="weights/activations dtype for the memory figures",
    )
    p.add_argument("--window", type=int, default=None, help="sliding window for the KV cache")
    p.add_argument("--json", action="store_true", help="print JSON instead of the table")
    p.add_argument(
        "--sweep-seq-len",
        action="store_true",
        help="FLOP shares of projections / attention / FFN across sequence lengths",
    )
    p.add_argument("--plot", metavar="PATH", help="draw the sweep (needs matplotlib)")
    p.add_argument(
        "--measure",
        action="store_true",
        help="also run one step on the CPU: FlopCounterMode count (math attention), step time, MFU",
    )
    p.add_argument(
        "--ignore-memory-check", action="store_true",
        help="--measure even if its training step's memory estimate exceeds the available RAM",
    )  # fmt: skip
    p.add_argument("--meta", action="store_true", help="build on the meta device, count params")
    p.add_argument("--step-time", type=float, default=None, help="measured step seconds (MFU)")
    p.add_argument("--peak-tflops", type=float, default=None, help="peak TFLOP/s for MFU")
    p.set_defaults(func=guarded("attnlab analyze", _run))
    return p


def _measure(config: Any, args: argparse.Namespace, training_flops: int) -> dict[str, Any]:
    from attnlab.models import build_model

    family = family_of(config)
    why = family.costs.unmeasured if family.costs is not None else None
    if why is not None:
        raise ValueError(
            f"--measure cannot check {type(config).__name__}'s closed form: {why} (the tests "
            "compare the two op by op); analyse it without --measure"
        )
    n = count_params(config)
    if n > MEASURE_MAX_PARAMS:
        raise ValueError(
            f"--measure runs the model on the CPU; this one has {n:,} parameters "
            f"(limit {MEASURE_MAX_PARAMS:,}): analyse it without --measure"
        )
    # an image classifier's length is its image size: measure the config's own
    seq_len = None if family.kind is Kind.IMAGE_CLASSIFIER else args.seq_len
    if not args.ignore_memory_check and (seq_len is not None or hasattr(config, "max_seq_len")):
        # the step runs --batch sequences forward and backward: refuse what cannot fit first
        check_training_fits(config, args.batch, seq_len)
    counted = measure_flops(config, seq_len, batch=args.batch, src_len=args.src_len, backward=True)
    model = build_model(config)
    fargs, fkwargs = example_inputs(config, batch=args.batch, seq_len=seq_len, src_len=args.src_len)
    step = measure_step_time(model, fargs, fkwargs, backward=True, repeats=3)
    return {
        "flops_forward": counted.forward,
        "flops_backward": counted.backward,
        "flops_training": counted.training,
        "matches_analytic": counted.training == training_flops,
        "step_time_s": step,
    }


def _mfu(training_flops: int, step_time: float, peak_tflops: float | None) -> dict[str, Any]:
    if peak_tflops is not None:
        peak, source = peak_tflops * 1e12, "given"
    else:
        peak, source = measure_peak_flops(), "measured float32 matmul on this CPU"
    return {
        "step_time_s": step_time,
        "achieved_flops_per_s": training_flops / step_time,
        "peak_flops_per_s": peak,
        "peak_source": source,
        "mfu": mfu(training_flops, step_time, peak),
    }


def _run(args: argparse.Namespace) -> int:
    label, config = load_config(args.target)
    check_writable(args.plot, what="--plot")
    target: Any = config
    if args.meta:
        from attnlab.models import build_model

        target = build_model(config, device="meta")
    if args.step_time is not None and args.step_time <= 0:
        raise ValueError(f"--step-time must be positive, got {args.step_time}")
    if args.peak_tflops is not None and args.peak_tflops <= 0:
        raise ValueError(f"--peak-tflops must be positive, got {args.peak_tflops}")
    a = analyze(
        target,
        seq_len=args.seq_len,
        batch=args.batch,
        src_len=args.src_len,
        dtype=args.dtype,
        window=args.window,
        name=label,
    )
    out = a.to_dict()
    text = [format_report(a)]
    measured = None
    if args.measure:
        measured = _measure(config, args, a.flops.training)
        out["measured"] = measured
        verdict = "equal" if measured["matches_analytic"] else "DIFFERENT"
        text.append(
            f"\nMeasured (FlopCounterMode, math attention): training "
            f"{human(measured['flops_training'])} FLOPs, analytic {verdict}; "
            f"step {measured['step_time_s'] * 1e3:.1f} ms"
        )
    step_time = args.step_time or (measured["step_time_s"] if measured else None)
    if step_time is not None:
        out["mfu"] = _mfu(a.flops.training, step_time, args.peak_tflops)
        m = out["mfu"]
        text.append(
            f"MFU: {human(m['achieved_flops_per_s'], 'FLOP/s')} achieved / "
            f"{human(m['peak_flops_per_s'], 'FLOP/s')} peak ({m['peak_source']}) = {m['mfu']:.1%}"
        )
    if args.sweep_seq_len or args.plot:
        rows = sweep_seq_len(config, batch=args.batch)
        out["sweep"] = rows
        text.append("\nFLOP shares by sequence length (forward matmuls)\n" + format_sweep(rows))
        if args.plot:
            path = plot_sweep(
                rows, args.plot, title=f"{label}: where the FLOPs go", crossover=a.crossover
            )
            print(f"wrote {path}", file=sys.stderr)
    if args.json:
        print(json.dumps(out, indent=2))
    else:
        print("\n".join(text))
    return 0


__all__ = ["MEASURE_MAX_PARAMS", "add_parser", "load_config"]
