"""Before and after attention (issue 24): the baby GPT, the modern GPT, Mamba and an LSTM, side
by side on the same tasks at the same parameter count (~0.8M, vocabulary 65).

Four comparisons, each its own part (``--only``), each writing
``benchmarks/results/families_<part>.{md,json}``:

1. ``shakespeare``: Tiny Shakespeare, the ``shakespeare-char`` recipe's data, objective and
   ``TrainConfig`` (AdamW 1e-3, cosine, batch 12, context 64) for every family. *Equal steps*:
   ``--steps`` (the recipe's 2000) each. *Equal wall time*: the baby GPT's training time of that
   run; every other family then trains for as many steps as its measured step time allows in it
   (its cosine schedule over those steps). Reported: validation loss (``--eval-batches`` fixed
   batches), training tokens/s (median step time; evaluation excluded), the curve.
2. ``seqlen``: training tokens/s (forward + backward + AdamW) against the sequence length
   64 .. 4096 at a fixed number of tokens per batch, the fitted exponent of step time in T, for
   each family: the LSTM's T sequential steps against attention's and the scan's parallelism.
3. ``recall``: the synthetic tasks of :mod:`attnlab.training.recall` (selective copy; with
   ``--kinds copy,associative`` also associative recall) at distances ``--distances``; every
   family gets the same steps (``--recall-steps``), batch (``--recall-batch``) and optimizer
   (AdamW 1e-3, cosine); accuracy on 2048 fresh sequences (chance = 1/16). The GPTs' context is
   the task's length.
4. ``decode``: per-token decoding latency (batch 1, after a prefill of n tokens: KV cache for
   the GPTs, the constant state for Mamba/LSTM) and the memory each keeps per sequence (measured
   bytes of the cache/state, and the closed form), for n = 128 .. 8192; where the curves cross.

Timing: every family runs in this process on the same inputs; step and token times are medians
of ``--repeats`` (rotating the family order each round in ``seqlen`` and ``decode``).

    python benchmarks/families_compare.py                       # all four parts (about 1-2 h)
    python benchmarks/families_compare.py --only seqlen,decode  # the two speed parts
    python benchmarks/families_compare.py --smoke               # tiny sizes, to /tmp

Data: ``$ATTNLAB_DATA``, else ``../shared/data`` beside the checkout. ``--smoke`` shrinks
everything (a few steps, short sequences) and writes to ``/tmp/attnlab_families_smoke`` unless
``--out`` says otherwise.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn

from attnlab import PRESETS, build_model, count_params
from attnlab.analysis import decode_state_bytes
from attnlab.analysis.attention_bench import describe_machine, machine_info
from attnlab.analysis.attention_bench_report import crossover, fit_exponent
from attnlab.analysis.recurrent import state_crossover
from attnlab.models import GPTConfig
from attnlab.training import TrainConfig, Trainer
from attnlab.training.recall import RecallObjective, RecallTask, recall_accuracy
from attnlab.training.recipes import prepare

RESULTS = Path(__file__).resolve().parent / "results"
VOCAB = 65

# The recipe's GPTs (shakespeare-char, arch classic / modern), checked against prepare() in part 1.
GPT_BABY = GPTConfig(
    vocab_size=VOCAB, d_model=128, n_heads=4, n_layers=4, d_ff=512, max_seq_len=64, dropout=0.0,
    bias=False, activation="gelu", eos_id=None,
)  # fmt: skip
GPT_MODERN = dataclasses.replace(
    GPT_BABY, pos_encoding="rope", activation="swiglu", norm="rmsnorm", d_ff=346
)
FAMILIES: dict[str, Any] = {
    "gpt": GPT_BABY,
    "gpt-modern": GPT_MODERN,
    "mamba": dataclasses.replace(PRESETS["mamba-char-baby"], vocab_size=VOCAB),
    "lstm": dataclasses.replace(PRESETS["lstm-char-baby"], vocab_size=VOCAB),
    "gru": dataclasses.replace(PRESETS["gru-char-baby"], vocab_size=VOCAB),
}
DEFAULT_FAMILIES = "gpt,gpt-modern,mamba,lstm"


def config_for(family: str, context: int | None = None) -> Any:
    """The family's config; GPTs get ``max_seq_len = context`` (recurrent models have none)."""
    c = FAMILIES[family]
    if isinstance(c, GPTConfig) and context is not None:
        c = dataclasses.replace(c, max_seq_len=context)
    return c


def build(family: str, context: int | None = None, seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return build_model(config_for(family, context))


def write(out: Path, part: str, meta: dict[str, Any], data: dict[str, Any], md: list[str]) -> None:
    out.mkdir(parents=True, exist_ok=True)
    payload = {"meta": meta, **data}
    (out / f"families_{part}.json").write_text(json.dumps(payload, indent=2) + "\n")
    head = [f"# Families, part {part} (benchmarks/families_compare.py, issue 24)", ""]
    head += [describe_machine(meta, torch.get_num_threads()) + ".", ""]
    (out / f"families_{part}.md").write_text("\n".join(head + md) + "\n")
    print("\n".join(md))
    print(f"wrote {out / f'families_{part}.md'}")


def table(header: list[str], rows: list[list[Any]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return lines + ["| " + " | ".join(str(x) for x in r) + " |" for r in rows]


# -- 1. Tiny Shakespeare ------------------------------------------------------------------------


def train_timed(
    model: nn.Module, objective: Any, train: TrainConfig, eval_batches: int, n_evals: int
) -> dict[str, Any]:
    """Train ``train.steps`` steps timing each one; evaluate ``n_evals`` times on the way
    (outside the timing). Returns step times, the val curve and the final val loss."""
    trainer = Trainer(model, objective, train)
    torch.manual_seed(train.seed)
    times, curve, elapsed = [], [], 0.0
    every = max(1, train.steps // n_evals)
    for step in range(1, train.steps + 1):
        t0 = time.perf_counter()
        trainer.train_step()
        times.append(time.perf_counter() - t0)
        elapsed += times[-1]
        if step % every == 0 or step == train.steps:
            m = trainer.evaluate(eval_batches)
            curve.append({"step": step, "train_s": elapsed, "val_loss": m["val_loss"]})
    tokens = train.batch_size * objective.block_size
    return {
        "steps": train.steps,
        "train_s": elapsed,
        "median_step_s": statistics.median(times),
        "tokens_per_s": tokens / statistics.median(times),
        "val_loss": curve[-1]["val_loss"],
        "curve": curve,
    }


def part_shakespeare(args: argparse.Namespace, meta: dict[str, Any]) -> None:
    over = {"steps": args.steps, "progress": False, "eval_every": 0, "checkpoint_every": 0}
    if args.smoke:
        over["warmup"] = 1
    base = prepare("shakespeare-char", over)
    modern = prepare("shakespeare-char", {**over, "arch": "modern"})
    assert base.model_config == GPT_BABY and modern.model_config == GPT_MODERN, "recipe drifted"
    objective, train = base.objective, base.train
    runs: dict[str, dict[str, Any]] = {}
    for family in args.families:  # equal steps
        model = build(family, 64, seed=train.seed)
        runs[family] = {"params": count_params(model)}
        runs[family]["equal_steps"] = train_timed(model, objective, train, args.eval_batches, 10)
    budget = runs[args.families[0]]["equal_steps"]["train_s"]
    for family in args.families:  # equal wall time: the first family's training time
        first = runs[family]["equal_steps"]
        steps = max(1, int(budget / first["median_step_s"]))
        if family == args.families[0] or steps == first["steps"]:
            runs[family]["equal_time"] = first
            continue
        t = dataclasses.replace(train, steps=steps, warmup=min(train.warmup, steps // 4))
        runs[family]["equal_time"] = train_timed(
            build(family, 64, seed=train.seed), objective, t, args.eval_batches, 10
        )
    rows = [
        [
            f,
            f"{r['params']:,}",
            r["equal_steps"]["steps"],
            f"{r['equal_steps']['val_loss']:.4f}",
            f"{r['equal_steps']['tokens_per_s']:,.0f}",
            r["equal_time"]["steps"],
            f"{r['equal_time']['train_s']:.0f}",
            f"{r['equal_time']['val_loss']:.4f}",
        ]
        for f, r in runs.items()
    ]
    md = [f"Equal wall time = {args.families[0]}'s training time ({budget:.0f} s).", ""]
    md += table(
        [
            "family",
            "params",
            "steps",
            "val loss",
            "train tok/s",
            "steps (equal time)",
            "train s",
            "val loss (equal time)",
        ],
        rows,
    )
    write(args.out, "shakespeare", meta, {"budget_s": budget, "runs": runs}, md)


# -- 2. training throughput vs sequence length ---------------------------------------------


def step_time(model: nn.Module, B: int, T: int, repeats: int) -> list[float]:
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    ids = torch.randint(VOCAB, (B, T + 1), generator=torch.Generator().manual_seed(0))
    out = []
    for i in range(repeats + 1):  # the first is a warm-up
        t0 = time.perf_counter()
        _, loss = model(ids[:, :-1], targets=ids[:, 1:])
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        if i:
            out.append(time.perf_counter() - t0)
    return out


def part_seqlen(args: argparse.Namespace, meta: dict[str, Any]) -> None:
    results: dict[str, dict[int, float]] = {f: {} for f in args.families}
    for T in args.seq_lens:
        B = max(1, args.tokens_per_batch // T)
        models = {f: build(f, T).train() for f in args.families}
        times: dict[str, list[float]] = {f: [] for f in args.families}
        for r in range(args.rounds):  # rotate the order: a slow spell hits every family alike
            order = (
                args.families[r % len(args.families) :] + args.families[: r % len(args.families)]
            )
            for f in order:
                times[f] += step_time(models[f], B, T, args.repeats)
        for f in args.families:
            results[f][T] = B * T / statistics.median(times[f])
    exps = {f: fit_exponent(list(r), [1 / v for v in r.values()]) for f, r in results.items()}
    rows = [[T, *(f"{results[f][T]:,.0f}" for f in args.families)] for T in args.seq_lens]
    fitted = [f"{exps[f]:.2f}" if exps[f] is not None else "-" for f in args.families]
    rows.append(["exponent of time/token in T", *fitted])
    md = [f"Training tokens/s, {args.tokens_per_batch} tokens per batch (B = tokens / T).", ""]
    md += table(["T", *args.families], rows)
    data = {"tokens_per_s": results, "exponent_time_per_token": exps}
    write(args.out, "seqlen", meta, data, md)


# -- 3. long-range recall ------------------------------------------------------------------


def part_recall(args: argparse.Namespace, meta: dict[str, Any]) -> None:
    results: dict[str, dict[str, dict[int, dict[str, float]]]] = {}
    for kind in args.kinds:
        results[kind] = {f: {} for f in args.families}
        for d in args.distances:
            task = RecallTask(kind=kind, distance=d)
            train = TrainConfig(
                steps=args.recall_steps, batch_size=args.recall_batch, optimizer="adamw", lr=1e-3,
                betas=(0.9, 0.99), weight_decay=0.1, schedule="cosine",
                warmup=min(100, args.recall_steps // 4), min_lr_ratio=0.1, label_smoothing=0.0,
                clip_grad_norm=1.0, progress=False, eval_batches=2,
            )  # fmt: skip
            for f in args.families:
                model = build(f, task.seq_len, seed=train.seed)
                t0 = time.perf_counter()
                Trainer(model, RecallObjective(task), train).fit()
                seconds = time.perf_counter() - t0
                acc = recall_accuracy(model, task, n=args.recall_eval)
                results[kind][f][d] = {"accuracy": acc, "train_s": seconds}
                print(f"recall {kind} d={d} {f}: {acc:.3f} ({seconds:.0f} s)")
    md = [
        f"Accuracy (chance 1/16) after {args.recall_steps} steps of batch {args.recall_batch}, "
        "per distance d.",
        "",
    ]
    for kind in args.kinds:
        md += [f"### {kind}", ""]
        rows = [
            [d, *(f"{results[kind][f][d]['accuracy']:.3f}" for f in args.families)]
            for d in args.distances
        ]
        md += [*table(["d", *args.families], rows), ""]
    write(args.out, "recall", meta, {"steps": args.recall_steps, "results": results}, md)


# -- 4. decoding latency and memory vs context ----------------------------------------------


def cache_bytes(cache: Any) -> int:
    """Bytes of the filled part of a KV cache (the buffers are preallocated to max_len)."""
    total = 0
    for layer in cache.self_attn:
        if layer.k is not None:
            n = layer.length
            total += layer.k[:, :, :n].nbytes + layer.v[:, :, :n].nbytes
    return total


@torch.inference_mode()
def decode_case(model: nn.Module, n: int, steps: int) -> tuple[list[float], int]:
    """Per-token times of ``steps`` decode steps after an n-token prefill; bytes kept."""
    ids = torch.randint(VOCAB, (1, n), generator=torch.Generator().manual_seed(n))
    recurrent = hasattr(model, "new_state")
    memo = model.new_state(1) if recurrent else model.new_cache(n + steps + 1)
    kw = {"state": memo} if recurrent else {"cache": memo}
    logits, _ = model(ids, **kw)
    times = []
    for _ in range(steps):
        token = logits[:, -1].argmax(-1, keepdim=True)
        t0 = time.perf_counter()
        logits, _ = model(token, **kw)
        times.append(time.perf_counter() - t0)
    return times, memo.nbytes() if recurrent else cache_bytes(memo)


def part_decode(args: argparse.Namespace, meta: dict[str, Any]) -> None:
    top = max(args.contexts) + args.decode_steps + 1
    models = {f: build(f, top).eval() for f in args.families}
    lat: dict[str, dict[int, float]] = {f: {} for f in args.families}
    mem: dict[str, dict[int, dict[str, int]]] = {f: {} for f in args.families}
    for n in args.contexts:
        times: dict[str, list[float]] = {f: [] for f in args.families}
        for r in range(args.rounds):
            order = (
                args.families[r % len(args.families) :] + args.families[: r % len(args.families)]
            )
            for f in order:
                t, nbytes = decode_case(models[f], n, args.decode_steps)
                times[f] += t
                closed = decode_state_bytes(models[f].config, n + args.decode_steps)
                mem[f][n] = {"measured": nbytes, "closed_form": closed}
        for f in args.families:
            lat[f][n] = statistics.median(times[f])
    gpts = [f for f in args.families if isinstance(FAMILIES[f], GPTConfig)]
    others = [f for f in args.families if f not in gpts]
    # Smallest context from which the recurrent family decodes faster than the GPT, for good;
    # and the context at which the GPT's KV cache outgrows the recurrent state (closed form).
    cross = {f"{f} vs {g}": crossover(lat[f], lat[g]) for f in others for g in gpts}
    mem_cross = {
        f"{f} vs {g}": state_crossover(FAMILIES[f], config_for(g, top))
        for f in others
        for g in gpts
    }
    rows = [
        [n, *(f"{1e3 * lat[f][n]:.2f}" for f in args.families),
         *(f"{mem[f][n]['measured'] / 1024:,.0f}" for f in args.families)]
        for n in args.contexts
    ]  # fmt: skip
    md = ["Per-token decode latency (ms, median) and KiB kept per sequence, batch 1.", ""]
    header = ["context", *(f"{f} ms" for f in args.families), *(f"{f} KiB" for f in args.families)]
    md += [*table(header, rows), ""]
    md += [f"- faster from context {n} on: {k}" for k, n in cross.items()]
    md += [f"- KV cache larger than the state from context {n}: {k}" for k, n in mem_cross.items()]
    data = {"latency_s": lat, "bytes": mem, "faster_from": cross, "memory_crossover": mem_cross}
    write(args.out, "decode", meta, data, md)


PARTS: dict[str, Callable[[argparse.Namespace, dict[str, Any]], None]] = {
    "shakespeare": part_shakespeare,
    "seqlen": part_seqlen,
    "recall": part_recall,
    "decode": part_decode,
}


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    def ints(s: str) -> list[int]:
        return [int(x) for x in s.split(",")]

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--only", default=",".join(PARTS), help="parts, comma-separated")
    p.add_argument("--families", default=DEFAULT_FAMILIES, help=f"of {', '.join(FAMILIES)}")
    p.add_argument("--smoke", action="store_true", help="tiny sizes (checks the script runs)")
    p.add_argument("--out", type=Path, default=None, help="results directory")
    p.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    p.add_argument("--steps", type=int, default=2000, help="shakespeare: steps per family")
    p.add_argument("--eval-batches", type=int, default=50, help="shakespeare: val batches")
    p.add_argument("--seq-lens", type=ints, default=[64, 128, 256, 512, 1024, 2048, 4096])
    p.add_argument("--tokens-per-batch", type=int, default=4096, help="seqlen: B·T")
    p.add_argument("--rounds", type=int, default=3, help="seqlen/decode: rotated rounds")
    p.add_argument("--repeats", type=int, default=3, help="seqlen: timed steps per round")
    p.add_argument("--kinds", default="copy", help="recall: copy,associative")
    p.add_argument("--distances", type=ints, default=[4, 16, 64, 256])
    p.add_argument("--recall-steps", type=int, default=1000)
    p.add_argument("--recall-batch", type=int, default=16)
    p.add_argument("--recall-eval", type=int, default=2048)
    p.add_argument("--contexts", type=ints, default=[128, 256, 512, 1024, 2048, 4096, 8192])
    p.add_argument("--decode-steps", type=int, default=16, help="decode: timed tokens per round")
    args = p.parse_args(argv)
    args.only = [x for x in args.only.split(",") if x]
    args.families = [x for x in args.families.split(",") if x]
    args.kinds = [x for x in args.kinds.split(",") if x]
    for name, valid in (("only", PARTS), ("families", FAMILIES)):
        bad = sorted(set(getattr(args, name)) - set(valid))
        if bad:
            p.error(f"--{name}: unknown {bad}; valid: {', '.join(valid)}")
    if args.smoke:
        args.steps, args.eval_batches, args.seq_lens, args.tokens_per_batch = 3, 1, [16, 32], 64
        args.rounds, args.repeats, args.distances, args.recall_steps = 1, 1, [2, 4], 2
        args.recall_eval, args.contexts, args.decode_steps = 32, [8, 16], 2
        args.out = args.out or Path("/tmp/attnlab_families_smoke")
    args.out = args.out or RESULTS
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse(argv)
    os.environ.setdefault(
        "ATTNLAB_DATA", str(Path(__file__).resolve().parents[2] / "shared" / "data")
    )
    if args.threads:
        torch.set_num_threads(args.threads)
    meta = machine_info()
    for part in args.only:
        PARTS[part](args, meta)


if __name__ == "__main__":
    main()
