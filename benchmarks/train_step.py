"""Train-step speed: forward + backward + AdamW step, fp32, attnlab against its peers (issue 13).

Every implementation trains the same GPT shape in the same process, on the same batch, with the
same optimizer (``torch.optim.AdamW(fused=True)``: one kernel over all tensors; the default
for-loop is several times slower on CPU, see the optimizer table), dropout off, and the same loss
(mean token cross-entropy over every position). Rows:

- ``attnlab``: :class:`attnlab.GPT` with exact GELU (nanoGPT's choice), and with GPT-2's tanh GELU;
- ``minimal GPT``: nanoGPT's architecture (one fused q/k/v linear,
  ``F.scaled_dot_product_attention`` with ``is_causal``, exact GELU, tied head) written out here
  in ~40 lines, the yardstick for "as fast as nanoGPT";
- ``transformers``: ``GPT2LMHeadModel`` with ``attn_implementation`` "sdpa" and "eager" (GPT-2's
  tanh GELU), and "sdpa" with exact GELU;
- ``x-transformers``: ``TransformerWrapper(Decoder(...))`` with flash (SDPA) attention and a tied
  head (skipped, with the reason, when the package is not installed: ``pip install .[bench]``);
- ``torch.nn``: a GPT made of ``nn.TransformerEncoder`` (pre-norm, GELU, causal mask);
- two rows that take the gap between the first two apart: ``minimal GPT (separate q/k/v)``, the
  minimal GPT with three q, k and v linears as attnlab has them (nanoGPT's layout otherwise),
  and ``attnlab layers (nanoGPT shell)``, attnlab's decoder layers inside the minimal GPT's
  embeddings, head and loss; and ``attnlab (q/k/v as three products)``, attnlab with its q, k
  and v linears called one by one, as before the training step's stacked product (only with
  ``--rows``);
- ``--compile`` adds ``torch.compile`` rows for attnlab and the minimal GPT, and two more for
  attnlab: Inductor's C++ wrapper (``cpp_wrapper``: the compiled graph called from C++, not
  Python) and Inductor leaving GELU and LayerNorm to ATen's kernels
  (:func:`inductor_with_aten_kernels`);
- ``--breakdown`` profiles every row once more and reports the time per step inside ATen's
  extern kernels (matrix products, attention, fused AdamW), which ``torch.compile`` calls as
  they are: with it, the most a compiled step can gain over another step (issue 26).

Timing: rounds of one timed burst (``--steps`` steps) per row, the row order rotated every round
(A B C, B C A, ...) so that a slow spell of a shared machine hits every row alike; the figure is
the median over ``--rounds`` rounds of the per-step time. FLOPs per step use nanoGPT's estimate,
``(6 N + 12 L H Q T) · T · B`` with N the parameters without the position table (the same N for
every row: attnlab's), and are compared with the machine's fp32 matmul ceiling, measured here on
2048³ and 4096³ products (MFU is against the larger).

    python benchmarks/train_step.py            # both shapes, 10 rounds (~3-4 min on 2 cores)
    python benchmarks/train_step.py --quick    # 3 rounds, 1 step each (~1 min)

Results: ``benchmarks/results/train_step.{md,json}``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import torch
import torch.nn.functional as F
from torch import Tensor, nn

import attnlab
from attnlab.analysis.attention_bench import describe_machine, machine_info

RESULTS = Path(__file__).resolve().parent / "results"


@dataclass(frozen=True)
class Shape:
    """A GPT training shape: L layers, H heads, E = d_model, T context, B batch, V vocabulary."""

    n_layers: int
    n_heads: int
    d_model: int
    context: int
    batch: int
    vocab: int = 65


SHAPES = {
    "baby": Shape(n_layers=4, n_heads=4, d_model=128, context=64, batch=12),
    "shakespeare": Shape(n_layers=6, n_heads=6, d_model=384, context=256, batch=8),
    # the baby GPT on 4 tokens: its kernels take next to nothing, so a step's time is what the
    # framework and the model's Python cost per step (only with --shapes)
    "overhead": Shape(n_layers=4, n_heads=4, d_model=128, context=4, batch=1),
}
DEFAULT_SHAPES = "baby,shakespeare"

LossFn = Callable[[Tensor, Tensor], Tensor]  # (ids, targets) -> scalar loss


def _lm_loss(logits: Tensor, targets: Tensor) -> Tensor:
    return F.cross_entropy(logits.flatten(0, 1), targets.flatten())


# ---- the competitors ------------------------------------------------------------------------


def build_attnlab(s: Shape, activation: str) -> tuple[nn.Module, LossFn]:
    config = attnlab.GPTConfig(
        vocab_size=s.vocab,
        d_model=s.d_model,
        n_heads=s.n_heads,
        n_layers=s.n_layers,
        d_ff=4 * s.d_model,
        max_seq_len=s.context,
        dropout=0.0,
        activation=activation,
        eos_id=None,
    )
    model = attnlab.GPT(config)
    return model, lambda x, y: model(x, targets=y)[1]


class MinimalBlock(nn.Module):
    """Pre-norm block with one fused q/k/v projection (nanoGPT's layout)."""

    def __init__(self, d: int, n_heads: int) -> None:
        super().__init__()
        self.n_heads = n_heads
        self.ln_1, self.ln_2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.fc, self.fc_out = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

    def forward(self, x: Tensor) -> Tensor:
        B, T, E = x.shape
        q, k, v = self.qkv(self.ln_1(x)).split(E, dim=2)  # (B, T, E) each
        q, k, v = (t.view(B, T, self.n_heads, -1).transpose(1, 2) for t in (q, k, v))
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)  # (B, H, T, D)
        x = x + self.proj(a.transpose(1, 2).reshape(B, T, E))
        return x + self.fc_out(F.gelu(self.fc(self.ln_2(x))))


class MinimalGPT(nn.Module):
    """The smallest reasonable GPT: token + position tables, blocks, final norm, tied head."""

    def __init__(self, s: Shape) -> None:
        super().__init__()
        self.tok = nn.Embedding(s.vocab, s.d_model)
        self.pos = nn.Embedding(s.context, s.d_model)
        self.blocks = nn.ModuleList(MinimalBlock(s.d_model, s.n_heads) for _ in range(s.n_layers))
        self.ln_f = nn.LayerNorm(s.d_model)
        self.head = nn.Linear(s.d_model, s.vocab, bias=False)
        self.head.weight = self.tok.weight

    def forward(self, ids: Tensor) -> Tensor:
        x = self.tok(ids) + self.pos(torch.arange(ids.shape[1], device=ids.device))
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln_f(x))  # (B, T, V)


def build_minimal(s: Shape) -> tuple[nn.Module, LossFn]:
    model = MinimalGPT(s)
    return model, lambda x, y: _lm_loss(model(x), y)


class SeparateQKVBlock(MinimalBlock):
    """:class:`MinimalBlock` with three q, k and v linears (attnlab's layout) for the fused one."""

    def __init__(self, d: int, n_heads: int) -> None:
        super().__init__(d, n_heads)
        del self.qkv
        self.q, self.k, self.v = nn.Linear(d, d), nn.Linear(d, d), nn.Linear(d, d)

    def forward(self, x: Tensor) -> Tensor:
        B, T, E = x.shape
        h = self.ln_1(x)
        q, k, v = (
            t(h).view(B, T, self.n_heads, -1).transpose(1, 2) for t in (self.q, self.k, self.v)
        )  # (B, H, T, D) each
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)  # (B, H, T, D)
        x = x + self.proj(a.transpose(1, 2).reshape(B, T, E))
        return x + self.fc_out(F.gelu(self.fc(self.ln_2(x))))


def build_minimal_separate_qkv(s: Shape) -> tuple[nn.Module, LossFn]:
    model = MinimalGPT(s)
    model.blocks = nn.ModuleList(SeparateQKVBlock(s.d_model, s.n_heads) for _ in range(s.n_layers))
    return model, lambda x, y: _lm_loss(model(x), y)


class _CausalLayer(nn.Module):
    """An attnlab decoder layer called as a minimal block: ``x -> layer(x, is_causal=True)``."""

    def __init__(self, layer: nn.Module) -> None:
        super().__init__()
        self.layer = layer

    def forward(self, x: Tensor) -> Tensor:
        return cast(Tensor, self.layer(x, is_causal=True))


def build_attnlab_layers_in_minimal(s: Shape) -> tuple[nn.Module, LossFn]:
    model = MinimalGPT(s)
    layers = cast(nn.ModuleList, build_attnlab(s, "gelu")[0].layers)
    model.blocks = nn.ModuleList(_CausalLayer(layer) for layer in layers)
    return model, lambda x, y: _lm_loss(model(x), y)


def build_attnlab_three_products(s: Shape) -> tuple[nn.Module, LossFn]:
    """attnlab with its q, k and v linears called as three modules in the training step (a
    no-op forward pre-hook on each, which :class:`attnlab.layers.MultiHeadAttention` takes as
    "observed" and so does not stack them): the step before the stacked product."""
    model, loss_fn = build_attnlab(s, "gelu")
    for layer in cast(nn.ModuleList, model.layers):
        attn = layer.self_attn
        for linear in (attn.q_proj, attn.k_proj, attn.v_proj):
            linear.register_forward_pre_hook(lambda module, args: None)
    return model, loss_fn


def build_transformers(s: Shape, attn: str, activation: str) -> tuple[nn.Module, LossFn]:
    import transformers

    transformers.logging.set_verbosity_error()
    config = transformers.GPT2Config(
        vocab_size=s.vocab,
        n_positions=s.context,
        n_embd=s.d_model,
        n_layer=s.n_layers,
        n_head=s.n_heads,
        activation_function=activation,
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
        use_cache=False,
        bos_token_id=None,
        eos_token_id=None,
    )
    model = transformers.GPT2LMHeadModel._from_config(config, attn_implementation=attn)
    return model, lambda x, y: _lm_loss(model(input_ids=x).logits, y)


def build_x_transformers(s: Shape) -> tuple[nn.Module, LossFn]:
    from x_transformers import Decoder, TransformerWrapper

    model = TransformerWrapper(
        num_tokens=s.vocab,
        max_seq_len=s.context,
        tie_embedding=True,
        attn_layers=Decoder(
            dim=s.d_model,
            depth=s.n_layers,
            heads=s.n_heads,
            attn_dim_head=s.d_model // s.n_heads,
            attn_flash=True,
        ),
    )
    return model, lambda x, y: _lm_loss(model(x), y)


class TorchNNGPT(nn.Module):
    """A GPT from ``nn.TransformerEncoder``: pre-norm layers with a causal mask, tied head."""

    def __init__(self, s: Shape) -> None:
        super().__init__()
        self.tok = nn.Embedding(s.vocab, s.d_model)
        self.pos = nn.Embedding(s.context, s.d_model)
        layer = nn.TransformerEncoderLayer(
            s.d_model,
            s.n_heads,
            dim_feedforward=4 * s.d_model,
            dropout=0.0,
            activation="gelu",
            batch_first=True,
            norm_first=True,
        )
        self.encoder = nn.TransformerEncoder(layer, s.n_layers, enable_nested_tensor=False)
        self.ln_f = nn.LayerNorm(s.d_model)
        self.head = nn.Linear(s.d_model, s.vocab, bias=False)
        self.head.weight = self.tok.weight
        self.causal: Tensor
        mask = nn.Transformer.generate_square_subsequent_mask(s.context)  # (T, T) additive
        self.register_buffer("causal", mask, persistent=False)

    def forward(self, ids: Tensor) -> Tensor:
        T = ids.shape[1]
        x = self.tok(ids) + self.pos(torch.arange(T, device=ids.device))
        x = self.encoder(x, mask=self.causal[:T, :T], is_causal=True)
        return self.head(self.ln_f(x))  # (B, T, V)


def build_torch_nn(s: Shape) -> tuple[nn.Module, LossFn]:
    model = TorchNNGPT(s)
    return model, lambda x, y: _lm_loss(model(x), y)


def compiled(
    build: Callable[[Shape], tuple[nn.Module, LossFn]], **options: Any
) -> Callable[..., Any]:
    def make(s: Shape) -> tuple[nn.Module, LossFn]:
        model, loss_fn = build(s)
        return model, torch.compile(loss_fn, **options)

    return make


def inductor_with_aten_kernels(gm: torch.fx.GraphModule, example_inputs: list[Tensor]) -> Any:
    """A ``torch.compile`` backend: Inductor without its decompositions of GELU and LayerNorm
    (forward and backward), so that ATen's own kernels (oneDNN's GELU) run them inside the
    compiled graph as extern calls, where Inductor would generate fused C++ loops (issue 26:
    does a faster GELU or LayerNorm kernel shorten the compiled step?)."""
    from torch._inductor.compile_fx import compile_fx
    from torch._inductor.decomposition import select_decomp_table

    aten = torch.ops.aten
    keep = {
        aten.gelu.default,
        aten.gelu_backward.default,
        aten.native_layer_norm.default,
        aten.native_layer_norm_backward.default,
    }
    table = {op: fn for op, fn in select_decomp_table().items() if op not in keep}
    # the caches' keys leave out the decompositions: a cached default compile would come back.
    # With ``CI`` set in the environment, Inductor treats an extern call to an op that has a
    # decomposition as a bug in its own lowering table and raises (a check meant for PyTorch's
    # own CI): this backend asks for exactly such calls, so it lowers the forward and the
    # backward graph now (not the backward lazily, at the first backward) without ``CI``.
    ci = os.environ.pop("CI", None)
    try:
        with torch._functorch.config.patch(
            enable_autograd_cache=False, force_non_lazy_backward_lowering=True
        ):
            return compile_fx(
                gm, example_inputs, decompositions=table, config_patches={"fx_graph_cache": False}
            )
    finally:
        if ci is not None:
            os.environ["CI"] = ci


CPP_WRAPPER_ROW = "attnlab (compiled; C++ wrapper)"  # not profiled by --breakdown (see below)


def competitors(args: argparse.Namespace) -> dict[str, Callable[[Shape], tuple[nn.Module, LossFn]]]:
    rows: dict[str, Callable[[Shape], tuple[nn.Module, LossFn]]] = {
        "attnlab": lambda s: build_attnlab(s, "gelu"),
        "attnlab (tanh GELU)": lambda s: build_attnlab(s, "gelu_tanh"),
        "minimal GPT (nanoGPT layout)": build_minimal,
        "transformers sdpa": lambda s: build_transformers(s, "sdpa", "gelu_new"),
        "transformers eager": lambda s: build_transformers(s, "eager", "gelu_new"),
        "transformers sdpa (exact GELU)": lambda s: build_transformers(s, "sdpa", "gelu"),
        "x-transformers": build_x_transformers,
        "torch.nn.TransformerEncoder": build_torch_nn,
    }
    attribution = {
        "minimal GPT (separate q/k/v)": build_minimal_separate_qkv,
        "attnlab layers (nanoGPT shell)": build_attnlab_layers_in_minimal,
        "attnlab (q/k/v as three products)": build_attnlab_three_products,
    }
    if args.compile:
        rows["attnlab (compiled)"] = compiled(lambda s: build_attnlab(s, "gelu"))
        rows["minimal GPT (compiled)"] = compiled(build_minimal)
        rows[CPP_WRAPPER_ROW] = compiled(
            lambda s: build_attnlab(s, "gelu"),
            options={"cpp_wrapper": True},
        )
        rows["attnlab (compiled; ATen GELU and LayerNorm)"] = compiled(
            lambda s: build_attnlab(s, "gelu"), backend=inductor_with_aten_kernels
        )
    if args.rows:
        wanted = [r.strip() for r in args.rows.split(",")]
        rows |= attribution
        unknown = [r for r in wanted if r not in rows]
        if unknown:
            raise SystemExit(f"unknown rows {unknown}; valid: {', '.join(rows)}")
        rows = {r: rows[r] for r in wanted}
    return rows


# ---- measuring -------------------------------------------------------------------------------


def matmul_ceiling(n: int, repeats: int) -> float:
    """fp32 GFLOP/s of an ``n x n`` matmul (median of ``repeats`` after a warm-up)."""
    a, b = torch.randn(n, n), torch.randn(n, n)
    out = torch.empty(n, n)
    torch.mm(a, b, out=out)
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        torch.mm(a, b, out=out)
        times.append(time.perf_counter() - t0)
    return 2 * n**3 / statistics.median(times) / 1e9


def flops_per_step(model: nn.Module, s: Shape) -> float:
    """nanoGPT's estimate: (6 N + 12 L H Q T) per token, N without the position table."""
    n = sum(p.numel() for p in model.parameters()) - s.context * s.d_model  # the (T, E) table
    per_token = 6 * n + 12 * s.n_layers * s.n_heads * (s.d_model // s.n_heads) * s.context
    return float(per_token * s.context * s.batch)


@dataclass
class Trainee:
    """One competitor set up to take steps."""

    model: nn.Module
    loss_fn: LossFn
    optimizer: torch.optim.Optimizer
    n_params: int

    def step(self, x: Tensor, y: Tensor) -> float:
        self.optimizer.zero_grad(set_to_none=True)
        loss = self.loss_fn(x, y)
        loss.backward()
        self.optimizer.step()
        return float(loss.detach())


def make_trainee(build: Callable[[Shape], tuple[nn.Module, LossFn]], s: Shape) -> Trainee:
    torch.manual_seed(0)
    model, loss_fn = build(s)
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4, weight_decay=0.1, fused=True)
    n_params = sum(p.numel() for p in model.parameters())
    return Trainee(model, loss_fn, optimizer, n_params)


def bench_shape(name: str, s: Shape, args: argparse.Namespace, ceiling: float) -> dict[str, Any]:
    g = torch.Generator().manual_seed(0)
    data = torch.randint(0, s.vocab, (s.batch, s.context + 1), generator=g)
    x, y = data[:, :-1].contiguous(), data[:, 1:].contiguous()  # (B, T) each
    trainees: dict[str, Trainee] = {}
    skipped: dict[str, str] = {}
    first_s: dict[str, float] = {}  # the first step's seconds (with compilation)
    for label, build in competitors(args).items():
        try:
            trainees[label] = make_trainee(build, s)
        except ImportError as exc:  # an optional competitor that is not installed
            skipped[label] = f"{type(exc).__name__}: {exc}"
            print(f"[{name}] skipping {label}: {skipped[label]}", flush=True)
            continue
        t0 = time.perf_counter()
        first = [trainees[label].step(x, y)]  # compiled rows compile here
        first_s[label] = time.perf_counter() - t0
        first += [trainees[label].step(x, y) for _ in range(args.warmup - 1)]
        print(f"[{name}] {label}: warm-up losses {[round(v, 3) for v in first]}", flush=True)
    flops = flops_per_step(build_attnlab(s, "gelu")[0], s)
    labels = list(trainees)
    times: dict[str, list[float]] = {label: [] for label in labels}
    for r in range(args.rounds):
        order = labels[r % len(labels) :] + labels[: r % len(labels)]  # rotate: A B C, B C A, ...
        for label in order:
            t0 = time.perf_counter()
            for _ in range(args.steps):
                trainees[label].step(x, y)
            times[label].append((time.perf_counter() - t0) / args.steps)
    rows: list[dict[str, Any]] = []
    for label in labels:
        med = statistics.median(times[label])
        q = statistics.quantiles(times[label], n=4) if len(times[label]) > 1 else [med, med, med]
        rows.append(
            {
                "implementation": label,
                "params": trainees[label].n_params,
                "step_ms": med * 1e3,
                "step_ms_q1": q[0] * 1e3,
                "step_ms_q3": q[2] * 1e3,
                "tokens_per_s": s.batch * s.context / med,
                "gflops": flops / med / 1e9,
                "mfu": flops / med / 1e9 / ceiling,
                "rounds_ms": [t * 1e3 for t in times[label]],
                "first_step_s": first_s[label],
            }
        )
    if args.breakdown:
        for row in rows:
            if row["implementation"] == CPP_WRAPPER_ROW:
                continue  # its C++ wrapper calls ATen's kernels past the profiler
            trainee = trainees[row["implementation"]]
            row["kernels_ms"] = kernel_breakdown(trainee, x, y, max(args.steps, 3))
    base = next((row["step_ms"] for row in rows if row["implementation"] == "attnlab"), None)
    for row in rows:
        row["vs_attnlab"] = row["step_ms"] / base if base else None
    return {
        "shape": name,
        **dataclasses.asdict(s),
        "flops_per_step": flops,
        "rows": rows,
        "skipped": skipped,
    }


# issue 26: the compiled attnlab step over the eager nanoGPT-layout step, per shape
TARGETS = {"baby": 1.25, "shakespeare": 1.05}

KERNEL_GROUPS = {  # profiler event names -> the work compile leaves to ATen's own kernels
    "matrix products": ("aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm"),
    "attention kernels": ("aten::_scaled_dot_product",),
    "AdamW": ("aten::_fused_adamw",),
}


def kernel_breakdown(trainee: Trainee, x: Tensor, y: Tensor, steps: int) -> dict[str, float]:
    """ms per step spent inside the extern kernels (self CPU time under torch.profiler, summed
    over the events of each of :data:`KERNEL_GROUPS`; ``torch.compile`` calls these kernels as
    they are, so they bound what compiling can save), and the profiled step's total."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(steps):
            trainee.step(x, y)
    out = dict.fromkeys(KERNEL_GROUPS, 0.0)
    total = 0.0
    for event in prof.key_averages():
        total += event.self_cpu_time_total
        for group, prefixes in KERNEL_GROUPS.items():
            if event.key.startswith(prefixes):
                out[group] += event.self_cpu_time_total
    return {k: v / steps / 1e3 for k, v in out.items()} | {"profiled step": total / steps / 1e3}


def bench_optimizer(s: Shape, repeats: int) -> dict[str, float]:
    """ms per AdamW step on attnlab's model at shape ``s``: fused, foreach, for-loop."""
    model = build_attnlab(s, "gelu")[0]
    for p in model.parameters():
        p.grad = torch.randn_like(p)
    out = {}
    for label, kw in (
        ("fused", {"fused": True}),
        ("foreach", {"foreach": True}),
        ("for-loop (CPU default)", {"foreach": False}),
    ):
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4, **kw)  # type: ignore[arg-type]
        opt.step()
        times = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            opt.step()
            times.append(time.perf_counter() - t0)
        out[label] = statistics.median(times) * 1e3
    return out


# ---- report ----------------------------------------------------------------------------------


def format_markdown(results: dict[str, Any]) -> str:
    meta, ceil = results["meta"], results["ceiling_gflops"]
    lines = [
        "# Train-step speed (benchmarks/train_step.py)",
        "",
        f"{describe_machine(meta, meta['threads'])}, transformers "
        f"{meta.get('transformers', '-')}, x-transformers {meta.get('x_transformers', '-')}, "
        f"{meta['date_utc']}. fp32, forward + backward + AdamW(fused), dropout 0; medians of "
        f"{meta['rounds']} interleaved rounds of {meta['steps']} step(s).",
        "",
        "fp32 matmul ceiling: "
        + ", ".join(f"{k}³ {v:.1f} GFLOP/s" for k, v in ceil.items())
        + f". MFU is nanoGPT's (6N + 12·L·H·Q·T)·T·B FLOPs per step over the {max(ceil)}³ figure.",
    ]
    for shape in results["shapes"]:
        lines += [
            "",
            f"## {shape['shape']}: {shape['n_layers']} layers, {shape['n_heads']} heads, d_model "
            f"{shape['d_model']}, context {shape['context']}, batch {shape['batch']}, vocab "
            f"{shape['vocab']} ({shape['flops_per_step'] / 1e9:.2f} GFLOP per step)",
            "",
            "| implementation | params | ms/step (q1-q3) | tokens/s | GFLOP/s | MFU | vs attnlab "
            "| first step s (compile) |",
            "|---|---|---|---|---|---|---|---|",
        ]
        for r in shape["rows"]:
            ratio = f"{r['vs_attnlab']:.2f}" if r["vs_attnlab"] else "-"
            lines.append(
                f"| {r['implementation']} | {r['params'] / 1e6:.2f}M | {r['step_ms']:.1f} "
                f"({r['step_ms_q1']:.1f}-{r['step_ms_q3']:.1f}) | {r['tokens_per_s']:,.0f} "
                f"| {r['gflops']:.1f} | {r['mfu']:.0%} | {ratio} | {r.get('first_step_s', 0):.1f} |"
            )
        for label, why in shape["skipped"].items():
            lines.append(f"| {label} | skipped: {why} | | | | | | |")
        others = [r for r in shape["rows"] if not r["implementation"].startswith("attnlab")]
        ours = next((r for r in shape["rows"] if r["implementation"] == "attnlab"), None)
        if others and ours:
            best = min(others, key=lambda r: r["step_ms"])
            lines += [
                "",
                f"attnlab / fastest other ({best['implementation']}): "
                f"{ours['step_ms'] / best['step_ms']:.2f} (<= 1.00 means attnlab is at least as "
                "fast).",
            ]
        lines += _breakdown_lines(shape)
    opt = results.get("optimizer")
    if opt:
        lines += [
            "",
            f"## AdamW step alone ({opt['shape']} shape, attnlab's model, ms)",
            "",
            "| implementation | ms |",
            "|---|---|",
            *(f"| {k} | {v:.1f} |" for k, v in opt["ms"].items()),
        ]
    return "\n".join(lines) + "\n"


def _breakdown_lines(shape: dict[str, Any]) -> list[str]:
    """The ``--breakdown`` table of one shape, and what it bounds for the compiled rows."""
    rows = [r for r in shape["rows"] if "kernels_ms" in r]
    if not rows:
        return []
    groups = list(KERNEL_GROUPS)
    lines = [
        "",
        "Time per step inside ATen's extern kernels, which compile calls as they are: each "
        "group's share of the profiled step (torch.profiler self time) times the unprofiled "
        "median step, in ms (the profiler's own cost falls mostly on the many small operations, "
        "so the extern shares are if anything too small):",
        "",
        "| implementation | " + " | ".join(groups) + " | extern total | rest |",
        "|---|" + "---|" * (len(groups) + 2),
    ]
    for r in rows:
        k = r["kernels_ms"]
        share = {g: k[g] / k["profiled step"] for g in groups}
        r["extern_ms"] = extern = sum(share.values()) * r["step_ms"]
        lines.append(
            f"| {r['implementation']} | "
            + " | ".join(f"{share[g] * r['step_ms']:.1f}" for g in groups)
            + f" | {extern:.1f} | {r['step_ms'] - extern:.1f} |"
        )
    by_name = {r["implementation"]: r for r in rows}
    nano, ours = by_name.get("minimal GPT (nanoGPT layout)"), by_name.get("attnlab (compiled)")
    if nano and ours:
        bound = nano["step_ms"] / ours["extern_ms"]
        target = TARGETS.get(shape["shape"], 1.0)
        lines += [
            "",
            f"Even if everything but the extern kernels took no time, the compiled attnlab step "
            f"could be at most {bound:.2f}x the eager nanoGPT-layout step "
            f"({nano['step_ms']:.1f} / {ours['extern_ms']:.1f} ms); measured "
            f"{nano['step_ms'] / ours['step_ms']:.2f}x. Issue 26's {target}x would need the rest "
            f"in {nano['step_ms'] / target - ours['extern_ms']:.1f} ms "
            f"(it is {ours['step_ms'] - ours['extern_ms']:.1f}).",
        ]
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument(
        "--shapes", default=DEFAULT_SHAPES, help=f"comma-separated, of {', '.join(SHAPES)}"
    )
    parser.add_argument("--rows", default="", help="comma-separated subset of the rows")
    parser.add_argument("--rounds", type=int, default=None, help="default 10 (--quick: 3)")
    parser.add_argument("--steps", type=int, default=None, help="steps per burst (default: auto)")
    parser.add_argument("--warmup", type=int, default=None, help="default 3 (--quick: 1)")
    parser.add_argument("--threads", type=int, default=2, help="torch threads")
    parser.add_argument("--compile", action="store_true", help="add torch.compile rows")
    parser.add_argument("--quick", action="store_true", help="3 rounds of 1 step, small ceiling")
    parser.add_argument(
        "--breakdown", action="store_true", help="profile each row: time in extern kernels"
    )
    parser.add_argument("--json", default=str(RESULTS / "train_step.json"))
    parser.add_argument("--markdown", default=str(RESULTS / "train_step.md"))
    args = parser.parse_args(argv)
    unknown = [name for name in args.shapes.split(",") if name not in SHAPES]
    if unknown:
        parser.error(f"unknown shape(s) {unknown}; expected some of {list(SHAPES)}")
    if args.quick:
        args.steps = args.steps or 1
    args.rounds = args.rounds or (3 if args.quick else 10)
    args.warmup = args.warmup or (1 if args.quick else 3)
    torch.set_num_threads(args.threads)
    meta = machine_info() | {
        "threads": torch.get_num_threads(),
        "rounds": args.rounds,
        "steps": args.steps or "auto (5 baby, 1 shakespeare)",
    }
    for module, key in (("transformers", "transformers"), ("x_transformers", "x_transformers")):
        try:
            meta[key] = __import__(module).__version__
        except (ImportError, AttributeError):
            from importlib.metadata import PackageNotFoundError, version

            try:
                meta[key] = version(module.replace("_", "-"))
            except PackageNotFoundError:
                meta[key] = "not installed"
    sizes = (2048,) if args.quick else (2048, 4096)
    ceiling = {str(n): matmul_ceiling(n, 2 if args.quick else 5) for n in sizes}
    print(f"matmul ceiling (GFLOP/s): {ceiling}", flush=True)
    results: dict[str, Any] = {"meta": meta, "ceiling_gflops": ceiling, "shapes": []}
    for name in args.shapes.split(","):
        s = SHAPES[name]
        shape_args = argparse.Namespace(**vars(args))
        shape_args.steps = args.steps or (5 if s.d_model * s.context * s.batch < 1e6 else 1)
        result = bench_shape(name, s, shape_args, ceiling[max(ceiling, key=int)])
        results["shapes"].append(result)
        for row in result["rows"]:
            print(f"[{name}] {row['implementation']}: {row['step_ms']:.1f} ms", flush=True)
    opt_shape = "shakespeare" if "shakespeare" in args.shapes.split(",") else args.shapes
    results["optimizer"] = {
        "shape": opt_shape.split(",")[0],
        "ms": bench_optimizer(SHAPES[opt_shape.split(",")[0]], 3 if args.quick else 10),
    }
    markdown = format_markdown(results)
    print(markdown)
    for path, text in ((args.json, json.dumps(results, indent=2)), (args.markdown, markdown)):
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_text(text + ("\n" if not text.endswith("\n") else ""), encoding="utf-8")
    return 0 if math.isfinite(ceiling[max(ceiling, key=int)]) else 1


if __name__ == "__main__":
    sys.exit(main())
