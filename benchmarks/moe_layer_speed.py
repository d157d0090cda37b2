"""MoE layer speed (issue 23): forward + backward of attnlab's MoE FFN vs a dense FFN of equal
active FLOPs, a naive per-expert-mask MoE and transformers' Mixtral block, on this CPU.

Same process, same inputs, the same weights in every MoE implementation (checked: their outputs
agree), the implementations take turns each round (A B C, B C A, ...), medians of the rounds:

- ``attnlab MoE``: :class:`attnlab.layers.moe.MoEFeedForward`, dropless, tokens grouped by expert
  (argsort), each expert once on its rows, combined with ``index_add_``;
- ``dense FFN (k·F)``: one SwiGLU :class:`~attnlab.layers.feedforward.FeedForward` of width
  ``k·F``: the same matmul FLOPs per token as the k experts (the router's ``2·D·E`` aside);
- ``naive mask (E x compute)``: every expert on every token, outputs weighted by a dense
  ``(N, E)`` gate matrix that is zero off the chosen k: E/k times the FLOPs;
- ``transformers eager`` / ``transformers grouped_mm``: ``MixtralSparseMoeBlock`` with its
  per-expert loop, and with ``torch.nn.functional.grouped_mm`` over stacked expert weights
  (``config._experts_implementation``), when transformers is installed.

Then ``torch.profiler`` over attnlab's MoE and the dense FFN: CPU self time of leaf ops grouped
into matrix products, routing (router softmax/top-k), dispatch (argsort, bincount, gather,
split/cat, index_add, the weight multiply) and the rest, so the overhead over the dense FFN is
attributed.

Last, whole training steps as ``attnlab train shakespeare-char`` runs them: the recipe's model
and objective (:func:`attnlab.training.recipes.prepare`) dense and with 8 experts of half the
width, top-2 (equal active FLOPs), each stepped by its own :class:`~attnlab.training.Trainer`
(``train_step``: forward, aux loss, backward, clipping, AdamW; the MoE statistics included),
taking turns; median ms per step and tokens/s. Results:
``benchmarks/results/moe_layer_speed.{md,json}``.

    OMP_NUM_THREADS=2 python benchmarks/moe_layer_speed.py          # defaults below, ~2-4 min
    python benchmarks/moe_layer_speed.py --smoke                    # tiny sizes, seconds
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn
from torch.profiler import ProfilerActivity, profile

from attnlab.analysis.attention_bench import describe_machine, machine_info
from attnlab.layers.feedforward import FeedForward
from attnlab.layers.moe import MoEFeedForward
from attnlab.training.recipes import prepare
from attnlab.training.trainer import Trainer

RESULTS = Path(__file__).resolve().parent / "results"
GROUPS = (
    ("matrix products", ("mm", "addmm", "bmm", "matmul", "linear", "mkl_linear", "grouped_mm")),
    ("routing", ("softmax", "softmax_backward_data", "topk", "logsumexp", "gather", "sigmoid",
                 "sigmoid_backward", "exp", "div", "clamp", "sign")),
    ("dispatch", ("sort", "argsort", "bincount", "index", "index_select", "index_add",
                  "index_add_", "index_put_", "index_put_impl_", "split", "split_with_sizes", "cat",
                  "remainder",
                  "scatter", "scatter_add", "new_zeros", "zeros", "zero_", "nonzero", "arange",
                  "cumsum", "masked_select", "local_scalar_dense", "item", "lt", "sub")),
    ("elementwise", ("silu", "silu_backward", "gelu", "gelu_backward", "relu",
                     "threshold_backward", "mul", "add", "add_", "sum", "fill_", "copy_")),
    ("views and allocation", ("t", "transpose", "as_strided", "view", "reshape", "expand",
                              "unsqueeze", "squeeze", "select", "slice", "narrow", "empty",
                              "empty_strided", "empty_like", "zeros_like", "ones_like",
                              "resize_", "detach", "alias", "reshape_alias", "contiguous",
                              "clone", "to", "copy", "permute", "unbind", "chunk", "split_copy")),
)  # fmt: skip


class NaiveMaskMoE(nn.Module):
    """Every expert on every token, weighted by a dense gate matrix (zero off the top-k)."""

    def __init__(self, moe: MoEFeedForward) -> None:
        super().__init__()
        self.moe = moe

    def forward(self, x: Tensor) -> Tensor:
        logits = self.moe.router(x)  # (N, E)
        weights, idx = self.moe.route(logits)
        gates = torch.zeros_like(logits, dtype=weights.dtype).scatter(1, idx, weights)  # (N, E)
        out = torch.zeros_like(x)
        for e, expert in enumerate(self.moe.experts):
            out = out + gates[:, e : e + 1].to(x.dtype) * expert(x)
        return out


def transformers_block(moe: MoEFeedForward, impl: str) -> nn.Module | None:
    """transformers' ``MixtralSparseMoeBlock`` with ``moe``'s weights, or ``None``."""
    try:
        import transformers
        from transformers.models.mixtral.modeling_mixtral import MixtralSparseMoeBlock
    except ImportError:
        return None
    f = moe.experts[0]
    cfg = transformers.MixtralConfig(
        hidden_size=moe.d_model, intermediate_size=f.up_proj.out_features,
        num_local_experts=moe.n_experts, num_experts_per_tok=moe.top_k,
    )  # fmt: skip
    cfg._experts_implementation = impl
    block = MixtralSparseMoeBlock(cfg)
    with torch.no_grad():
        block.gate.weight.copy_(moe.router.weight)
        for j, e in enumerate(moe.experts):
            block.experts.gate_up_proj[j].copy_(torch.cat([e.gate_proj.weight, e.up_proj.weight]))
            block.experts.down_proj[j].copy_(e.down_proj.weight)
    return block


def build(
    args: argparse.Namespace,
) -> tuple[dict[str, Callable[[Tensor], Tensor]], list[nn.Module]]:
    torch.manual_seed(0)
    moe = MoEFeedForward(args.d_model, args.d_ff, args.experts, args.top_k)
    dense = FeedForward(args.d_model, args.top_k * args.d_ff, activation="swiglu", bias=False)
    impls: dict[str, Callable[[Tensor], Tensor]] = {
        "attnlab MoE": moe,
        "dense FFN (k·F)": dense,
        "naive mask (E x compute)": NaiveMaskMoE(moe),
    }
    modules: list[nn.Module] = [moe, dense]
    for impl in ("eager", "grouped_mm"):
        block = transformers_block(moe, impl)
        if block is not None:
            modules.append(block)
            impls[f"transformers {impl}"] = lambda x, b=block: b(x.unsqueeze(0)).squeeze(0)
    return impls, modules


def step(fn: Callable[[Tensor], Tensor], x: Tensor, modules: list[nn.Module]) -> None:
    """One forward + backward (sum of the output)."""
    x.grad = None
    for m in modules:
        m.zero_grad(set_to_none=True)
    fn(x).sum().backward()


def time_all(
    impls: dict[str, Callable[[Tensor], Tensor]], x: Tensor, modules: list[nn.Module], repeats: int
) -> dict[str, float]:
    """Median ms of one forward + backward, implementations interleaved."""
    names = list(impls)
    for name in names:  # warm-up
        step(impls[name], x, modules)
    times: dict[str, list[float]] = {n: [] for n in names}
    for r in range(repeats):
        for name in names[r % len(names) :] + names[: r % len(names)]:
            t0 = time.perf_counter()
            step(impls[name], x, modules)
            times[name].append((time.perf_counter() - t0) * 1e3)
    return {n: statistics.median(t) for n, t in times.items()}


def group_of(name: str) -> str:
    """The group of a profiler event (``aten::mm`` -> "matrix products"); autograd's own
    events (``autograd::engine::...``, ``MmBackward0``) are "autograd bookkeeping"."""
    if name.startswith("autograd::") or name.rstrip("0123456789").endswith("Backward"):
        return "autograd bookkeeping"
    op = name.split("::")[-1].lstrip("_")
    for group, keys in GROUPS:
        if op in keys:
            return group
    return "other"


def profile_groups(
    fn: Callable[[Tensor], Tensor], x: Tensor, modules: list[nn.Module], repeats: int
) -> dict[str, Any]:
    """ms per call by op group, and the top ops, of forward + backward under the profiler."""
    step(fn, x, modules)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(repeats):
            step(fn, x, modules)
    groups: dict[str, float] = defaultdict(float)
    ops = []
    for e in prof.key_averages():
        ms = e.self_cpu_time_total / 1e3 / repeats
        if ms > 0:
            groups[group_of(e.key)] += ms
            ops.append((e.key, ms))
    ops.sort(key=lambda t: -t[1])
    return {"groups": dict(groups), "top_ops": ops[:10]}


def trainer_steps(args: argparse.Namespace) -> dict[str, Any]:
    """Median ms per ``Trainer.train_step`` of the recipe's dense and MoE GPTs, interleaved."""
    size: dict[str, Any] = {"progress": False}
    if args.smoke:
        size.update(d_model=32, n_heads=2, n_layers=2, max_seq_len=16, batch_size=4, d_ff=64)
    d_ff = size.get("d_ff", 512)
    rows = {"dense": {}, "moe": {"n_experts": 8, "top_k": 2, "moe_d_ff": d_ff // 2}}
    trainers = {}
    for name, extra in rows.items():
        p = prepare("shakespeare-char", {**size, **extra})
        trainers[name] = (Trainer(p.model, p.objective, p.train), p)
    for trainer, _ in trainers.values():  # the first steps of a process are slow (~1.4 s
        for _ in range(args.train_warmup):  # each, seen here), whatever the model
            trainer.train_step()
    times: dict[str, list[float]] = {n: [] for n in trainers}
    names = list(trainers)
    for r in range(args.train_steps):
        for name in names[r % 2 :] + names[: r % 2]:
            t0 = time.perf_counter()
            trainers[name][0].train_step()
            times[name].append((time.perf_counter() - t0) * 1e3)
    out: dict[str, Any] = {}
    for name, (_, p) in trainers.items():
        ms = statistics.median(times[name])
        tokens = p.train.batch_size * p.model_config.max_seq_len
        out[name] = {"ms": ms, "tokens_per_s": tokens / ms * 1e3, "params": p.n_params,
                     "overrides": {**size, **rows[name]}}  # fmt: skip
    return out


def agreement(impls: dict[str, Callable[[Tensor], Tensor]], x: Tensor) -> dict[str, float]:
    with torch.no_grad():
        ref = impls["attnlab MoE"](x)
        return {n: float((f(x) - ref).abs().max()) for n, f in impls.items() if "dense" not in n}


def markdown(res: dict[str, Any]) -> str:
    m, a = res["meta"], res["args"]
    t = res["ms"]
    moe = t["attnlab MoE"]
    lines = [
        "# MoE layer speed (benchmarks/moe_layer_speed.py)",
        "",
        *(["**SMOKE RUN: tiny sizes; the numbers mean nothing.**", ""] if a["smoke"] else []),
        f"{describe_machine(m, m['threads'])}, {m['date_utc']}. Forward + backward of one layer "
        f"on N={a['tokens']} tokens, d_model {a['d_model']}, {a['experts']} SwiGLU experts of "
        f"F={a['d_ff']}, top-{a['top_k']}; median of {a['repeats']} interleaved rounds.",
        "",
        "| implementation | ms (fwd+bwd) | vs attnlab MoE | max abs diff of output |",
        "|---|---:|---:|---:|",
    ]
    for name, ms in t.items():
        diff = res["agreement"].get(name)
        lines.append(
            f"| {name} | {ms:.2f} | {ms / moe:.2f}x | {'-' if diff is None else f'{diff:.1e}'} |"
        )
    lines += ["", "## Where the time goes (profiler, CPU self time per call)", ""]
    lines += ["| group | attnlab MoE ms | dense FFN ms | overhead ms |", "|---|---:|---:|---:|"]
    pm, pd = res["profile"]["attnlab MoE"]["groups"], res["profile"]["dense FFN (k·F)"]["groups"]
    for g in sorted(set(pm) | set(pd), key=lambda g: -pm.get(g, 0.0)):
        lines.append(
            f"| {g} | {pm.get(g, 0):.2f} | {pd.get(g, 0):.2f} "
            f"| {pm.get(g, 0) - pd.get(g, 0):+.2f} |"
        )
    lines += ["", "Top ops of attnlab MoE (self ms per call):", ""]
    lines += [f"- `{k}` {ms:.2f}" for k, ms in res["profile"]["attnlab MoE"]["top_ops"]]
    steps = res["trainer_steps"]
    lines += [
        "",
        "## Whole training steps (Trainer.train_step, shakespeare-char recipe)",
        "",
        f"Median of {a['train_steps']} interleaved steps after {a['train_warmup']} warm-up "
        "steps each.",
        "",
        "| model | params | ms per step | tokens/s | vs dense |",
        "|---|---:|---:|---:|---:|",
    ]
    for name, row in steps.items():
        lines.append(
            f"| {name} | {row['params']:,} | {row['ms']:.1f} | {row['tokens_per_s']:,.0f} | "
            f"{row['ms'] / steps['dense']['ms']:.2f}x |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--tokens", type=int, default=4096, help="N = batch x sequence")
    p.add_argument("--d-model", type=int, default=512)
    p.add_argument("--d-ff", type=int, default=1024, help="each expert's hidden width F")
    p.add_argument("--experts", type=int, default=8)
    p.add_argument("--top-k", type=int, default=2)
    p.add_argument("--repeats", type=int, default=10)
    p.add_argument("--train-steps", type=int, default=20, help="timed Trainer steps per model")
    p.add_argument("--train-warmup", type=int, default=5, help="untimed Trainer steps per model")
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--smoke", action="store_true", help="tiny sizes, to check the script runs")
    args = p.parse_args(argv)
    if args.smoke:
        args.tokens, args.d_model, args.d_ff, args.repeats, args.train_steps = 64, 32, 48, 2, 2
        args.train_warmup = 1
    if args.threads:
        torch.set_num_threads(args.threads)
    impls, modules = build(args)
    x = torch.randn(args.tokens, args.d_model, requires_grad=True)
    meta = {**machine_info(), "threads": torch.get_num_threads()}
    res: dict[str, Any] = {"meta": meta, "args": vars(args), "agreement": agreement(impls, x)}
    res["ms"] = time_all(impls, x, modules, args.repeats)
    res["profile"] = {
        n: profile_groups(impls[n], x, modules, max(2, args.repeats // 3))
        for n in ("attnlab MoE", "dense FFN (k·F)")
    }
    os.environ.setdefault("ATTNLAB_DATA", str(RESULTS.parent.parent.parent / "shared" / "data"))
    res["trainer_steps"] = trainer_steps(args)
    # a smoke run writes to a temporary directory, never over the real results
    out_dir = Path(tempfile.mkdtemp(prefix="moe_layer_smoke_")) if args.smoke else RESULTS
    out_dir.mkdir(exist_ok=True)
    (out_dir / "moe_layer_speed.json").write_text(json.dumps(res, indent=2) + "\n")
    (out_dir / "moe_layer_speed.md").write_text(markdown(res))
    print((out_dir / "moe_layer_speed.md").read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
