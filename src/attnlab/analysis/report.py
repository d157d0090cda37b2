"""One analysis of a model: parameters, FLOPs, crossover, memory and KV cache, as a table or JSON.

:func:`analyze` gathers the closed forms of :mod:`~attnlab.analysis.params`,
:mod:`~attnlab.analysis.flops` and :mod:`~attnlab.analysis.memory` for a config (or a built
model, meta-device ones included: only its config and parameter count are read), so a
175B-parameter preset is analysed without allocating anything. :func:`format_report` renders the
readable table, :meth:`Analysis.to_dict` the JSON; :func:`format_sweep` and :func:`plot_sweep`
show how the FLOP shares move with the sequence length.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from torch import nn

from attnlab.analysis.flops import FLOP_GROUPS, FlopBreakdown, forward_flops
from attnlab.analysis.memory import (
    TrainingMemory,
    activation_bytes,
    dtype_bytes,
    kv_cache_bytes,
    kv_cache_bytes_per_token,
    training_memory,
)
from attnlab.analysis.params import ParamBreakdown, count_params, param_breakdown
from attnlab.analysis.scaling import Approximation, Crossover, approximations, crossover
from attnlab.config import config_to_dict
from attnlab.models.gpt import GPTConfig
from attnlab.models.transformer import TransformerConfig
from attnlab.models.vit import ViTConfig


@dataclass(frozen=True)
class Analysis:
    """Everything :func:`analyze` computes for one model at one batch and length."""

    name: str
    config: Any
    params: ParamBreakdown
    params_measured: int | None  # count_params of a built model, when one was given
    flops: FlopBreakdown
    approximations: list[Approximation]
    crossover: Crossover
    memory: TrainingMemory
    activations: dict[str, int]
    dtype: str
    kv_cache: dict[str, int | None] | None
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict (plain ints/floats/strings)."""
        f = self.flops
        backward = f.by_component(backward=True)
        return {
            "model": {
                "name": self.name,
                "model_type": type(self.config).model_type,
                "config": config_to_dict(self.config),
            },
            "inputs": {
                "batch": f.batch,
                "seq_len": f.seq_len,
                "src_len": f.src_len,
                "tokens": f.tokens,
            },
            "params": {
                "total": self.params.total,
                "measured": self.params_measured,
                "components": self.params.components,
                "per_layer": {n: self.params.per_layer(n) for n in self.params.layer_names},
                "groups": self.params.grouped(),
                "tied": self.params.tied,
                "n_layers": self.params.n_layers,
            },
            "flops": {
                "convention": "2·m·k·p per matmul; forward/backward/training count matmuls only",
                "forward": f.forward,
                "backward": f.backward,
                "training": f.training,
                "softmax": f.softmax,
                "forward_per_token": f.forward_per_token,
                "training_per_token": f.training_per_token,
                "components": {
                    name: {"forward": v, "backward": backward[name]}
                    for name, v in f.by_component().items()
                },
                "groups": f.grouped(),
                "shares": f.shares(),
                "approximations": [
                    {"name": a.name, "flops": a.flops, "relative_error": a.relative_error}
                    for a in self.approximations
                ],
            },
            "crossover": dataclasses.asdict(self.crossover),
            "memory": {
                "dtype": self.dtype,
                **self.memory.as_dict(),
                "activations_detail": self.activations,
            },
            "kv_cache": self.kv_cache,
            "notes": self.notes,
        }


def analyze(
    target: Any,
    *,
    seq_len: int | None = None,
    batch: int = 1,
    src_len: int | None = None,
    dtype: str = "float32",
    window: int | None = None,
    name: str | None = None,
) -> Analysis:
    """Analyse a config, or a built model (any device, ``"meta"`` included).

    Args:
        target: a model config or an ``nn.Module`` with a ``config`` attribute.
        seq_len: T (default the config's ``max_seq_len``; ViT: its patches + 1).
        batch: B. src_len: S for encoder-decoders (default T).
        dtype: weights/activations dtype for the memory figures (``"float32"``, ``"bfloat16"``).
        window: a sliding attention window for the KV-cache figures.
        name: a label (default the config class).

    Raises:
        ValueError: for bad sizes, an unknown dtype, or a config the analyser does not know.
    """
    measured = None
    if isinstance(target, nn.Module):
        config = getattr(target, "config", None)
        if config is None:
            raise ValueError(f"{type(target).__name__} has no .config; pass its config instead")
        measured = count_params(target)
    else:
        config = target
    params = param_breakdown(config)  # raises for unknown config types
    flops = forward_flops(config, seq_len, batch=batch, src_len=src_len)
    n = flops.seq_len
    memory = training_memory(config, n, batch=batch, src_len=src_len, dtype=dtype)
    acts = activation_bytes(config, n, batch=batch, src_len=src_len, dtype=dtype)
    notes: list[str] = []
    kv: dict[str, int | None] | None = None
    if isinstance(config, (GPTConfig, TransformerConfig)):  # decoders cache keys/values
        kv = {
            "bytes_per_token": kv_cache_bytes_per_token(config, dtype=dtype),
            "context_len": n,
            "window": window,
            "full_context": kv_cache_bytes(
                config, n, batch=batch, src_len=src_len, window=window, dtype=dtype
            ),
        }
    if getattr(config, "pos_encoding", None) == "learned" and n > config.max_seq_len:
        notes.append(
            f"seq_len={n} exceeds the learned position table (max_seq_len={config.max_seq_len}):"
            " the model cannot run it; the figures are the architecture's"
        )
    if isinstance(config, TransformerConfig):
        notes.append("tokens = target tokens (B·T) for the per-token and 6·N·tokens figures")
    if isinstance(config, ViTConfig) and n != config.max_seq_len:
        notes.append(f"seq_len={n} means {n - 1} patches, another image size than the config's")
    if measured is not None and measured != params.total:
        notes.append(f"the built model has {measured} parameters, the closed form {params.total}")
    return Analysis(
        name=name or type(config).__name__,
        config=config,
        params=params,
        params_measured=measured,
        flops=flops,
        approximations=approximations(config, flops),
        crossover=crossover(config),
        memory=memory,
        activations=acts,
        dtype=dtype if isinstance(dtype, str) else f"{dtype_bytes(dtype)} bytes",
        kv_cache=kv,
        notes=notes,
    )


# -- formatting ----------------------------------------------------------------------------------


def human(x: float, unit: str = "") -> str:
    """``1.23 G``-style number with SI prefixes (``human(1.5e12, "FLOP")`` -> ``1.50 TFLOP``)."""
    for prefix, scale in (("P", 1e15), ("T", 1e12), ("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(x) >= scale:
            return f"{x / scale:.2f} {prefix}{unit}"
    return f"{x:.0f} {unit}".rstrip() if float(x).is_integer() else f"{x:.3g} {unit}".rstrip()


def human_bytes(n: float) -> str:
    """Bytes with binary prefixes (``1.50 GiB``)."""
    for prefix, scale in (("Ti", 2**40), ("Gi", 2**30), ("Mi", 2**20), ("Ki", 2**10)):
        if n >= scale:
            return f"{n / scale:.2f} {prefix}B"
    return f"{n:.0f} B"


def _config_line(c: Any) -> str:
    kv = c.n_kv_heads or c.n_heads
    parts = [
        f"d_model={c.d_model}",
        f"n_heads={c.n_heads}" + (f" (kv {kv})" if kv != c.n_heads else ""),
        f"n_layers={c.n_layers}",
        f"d_ff={c.d_ff}",
        f"activation={c.activation}",
    ]
    for attr in ("vocab_size", "n_classes"):
        if hasattr(c, attr):
            parts.append(f"{attr}={getattr(c, attr)}")
    return ", ".join(parts)


def format_report(a: Analysis) -> str:
    """The readable table of an :class:`Analysis`."""
    f, p = a.flops, a.params
    lines = [f"{a.name} ({type(a.config).model_type}): {_config_line(a.config)}"]
    src = f", src_len={f.src_len}" if f.src_len is not None else ""
    lines.append(f"batch={f.batch}, seq_len={f.seq_len}{src}, tokens={f.tokens}")
    lines.append("")
    lines.append(f"{'Parameters':<34}{'count':>16}{'share':>8}{'per layer':>14}")
    for name, count in p.components.items():
        per = f"{p.per_layer(name):,}" if name in p.layer_names else ""
        if name in p.tied and count == 0:
            lines.append(f"  {name:<32}{0:>16,}  (tied to {p.tied[name]})")
            continue
        lines.append(f"  {name:<32}{count:>16,}{count / p.total:>8.1%}{per:>14}".rstrip())
    lines.append(f"  {'total':<32}{p.total:>16,}")
    if a.params_measured is not None:
        lines.append(f"  {'built model (measured)':<32}{a.params_measured:>16,}")
    lines.append("")
    lines.append(f"{'Forward FLOPs (2·m·k·p per matmul)':<40}{'FLOPs':>14}{'share':>8}")
    for name, v in f.by_component().items():
        lines.append(f"  {name:<38}{human(v):>14}{v / f.forward:>8.1%}")
    lines.append(f"  {'forward (matmuls)':<38}{human(f.forward):>14}")
    lines.append(f"  {'softmax (not in the total, estimate)':<38}{human(f.softmax):>14}")
    lines.append(f"  {'backward':<38}{human(f.backward):>14}")
    lines.append(f"  {'training step (forward + backward)':<38}{human(f.training):>14}")
    lines.append(
        f"  per token: forward {human(f.forward_per_token, 'FLOP')}, "
        f"training {human(f.training_per_token, 'FLOP')}"
    )
    shares = f.shares()
    lines.append(
        "  shares: " + ", ".join(f"{g} {shares[g]:.1%}" for g in FLOP_GROUPS if shares[g] > 0)
    )
    lines.append("")
    lines.append("Rules of thumb vs the exact training FLOPs")
    for ap in a.approximations:
        lines.append(f"  {ap.name:<36}{human(ap.flops):>14}  error {ap.relative_error:+.2%}")
    lines.append("")
    c, d = a.crossover, a.config.d_model
    lines.append("Crossover length (attention n²·d products = n·d² products)")
    lines.append(f"  attention block: n = {c.block:,.0f} ({c.block / d:.3g}·d_model)")
    lines.append(f"  layer with FFN:  n = {c.layer:,.0f} ({c.layer / d:.3g}·d_model)")
    lines.append(f"  whole model:     n = {c.model:,.0f}")
    lines.append("")
    m = a.memory
    lines.append(f"Training memory ({a.dtype}, Adam, no checkpointing, math attention)")
    for label, v in (
        ("weights", m.weights),
        ("gradients", m.gradients),
        ("optimizer state", m.optimizer),
        ("activations", m.activations),
        ("  of which attention scores", a.activations["attention_scores"]),
        ("total", m.total),
    ):
        lines.append(f"  {label:<30}{human_bytes(v):>14}")
    if a.kv_cache is not None:
        kv = a.kv_cache
        window = f", window {kv['window']}" if kv["window"] is not None else ""
        lines.append("")
        lines.append(f"KV cache ({a.dtype})")
        lines.append(f"  per token:  {human_bytes(kv['bytes_per_token'] or 0)}")
        lines.append(
            f"  full context ({kv['context_len']} tokens x batch {f.batch}{window}): "
            f"{human_bytes(kv['full_context'] or 0)}"
        )
    if a.notes:
        lines.append("")
        lines.extend(f"note: {n}" for n in a.notes)
    return "\n".join(lines)


def format_sweep(rows: list[dict[str, float]]) -> str:
    """A table of :func:`~attnlab.analysis.flops.sweep_seq_len` rows."""
    head = f"{'seq_len':>9}{'forward':>14}" + "".join(f"{g:>13}" for g in FLOP_GROUPS)
    out = [head]
    for r in rows:
        out.append(
            f"{int(r['seq_len']):>9}{human(r['forward']):>14}"
            + "".join(f"{r[g]:>13.1%}" for g in FLOP_GROUPS)
        )
    return "\n".join(out)


def plot_sweep(
    rows: list[dict[str, float]],
    path: str | Path,
    *,
    title: str = "",
    crossover: Crossover | None = None,
) -> Path:
    """Draw the FLOP shares against the sequence length (log x) into ``path`` (needs
    matplotlib).

    Raises:
        ImportError: without matplotlib (``pip install matplotlib``).
    """
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as e:  # pragma: no cover - depends on the environment
        raise ImportError("plotting needs matplotlib: pip install matplotlib") from e
    n = [r["seq_len"] for r in rows]
    fig, ax = plt.subplots(figsize=(7, 4.2))
    styles = {"projections": "o-", "attention": "s-", "ffn": "^-", "other": "x--"}
    for g in FLOP_GROUPS:
        if any(r[g] > 0 for r in rows):
            ax.plot(n, [100 * r[g] for r in rows], styles[g], ms=4, label=g)
    if crossover is not None:
        for x, label in (
            (crossover.block, "block crossover"),
            (crossover.layer, "layer crossover"),
        ):
            if n[0] <= x <= n[-1]:
                ax.axvline(x, color="grey", ls="--", lw=0.8)
                ax.annotate(label, (x, 95), rotation=90, fontsize=7, ha="right", va="top")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("sequence length n")
    ax.set_ylabel("share of forward matmul FLOPs (%)")
    ax.set_ylim(0, 100)
    ax.set_title(title or "Where the FLOPs go")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    out = Path(path)
    fig.savefig(out, dpi=120)
    plt.close(fig)
    return out


__all__ = [
    "Analysis",
    "analyze",
    "format_report",
    "format_sweep",
    "human",
    "human_bytes",
    "plot_sweep",
]
