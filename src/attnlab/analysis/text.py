"""The analysis as text: the readable report of an :class:`~attnlab.analysis.report.Analysis`,
the sequence-length sweep table, and SI-prefixed numbers."""

from __future__ import annotations

from typing import Any

from attnlab.analysis.flops import FLOP_GROUPS
from attnlab.analysis.moe import format_moe
from attnlab.analysis.report import Analysis


def human(x: float, unit: str = "") -> str:
    """``1.23 G``-style number with SI prefixes (``human(1.5e12, "FLOP")`` -> ``1.50 TFLOP``)."""
    x = float(x) + 0.0  # -0.0 shows as 0
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


# the sizes that describe a config without attention fields (Mamba, LSTM/GRU)
_RECURRENT_FIELDS = ("cell", "d_model", "d_hidden", "n_layers", "d_state", "d_conv", "expand",
                     "dt_rank", "scan", "vocab_size")  # fmt: skip


def _config_line(c: Any) -> str:
    if not hasattr(c, "n_heads"):
        return ", ".join(f"{k}={getattr(c, k)}" for k in _RECURRENT_FIELDS if hasattr(c, k))
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


def _param_lines(a: Analysis) -> list[str]:
    p = a.params
    lines = [f"{'Parameters':<34}{'count':>16}{'share':>8}{'per layer':>14}"]
    for name, count in p.components.items():
        per = f"{p.per_layer(name):,}" if name in p.layer_names else ""
        if name in p.tied and count == 0:
            lines.append(f"  {name:<32}{0:>16,}  (tied to {p.tied[name]})")
            continue
        lines.append(f"  {name:<32}{count:>16,}{count / p.total:>8.1%}{per:>14}".rstrip())
    lines.append(f"  {'total':<32}{p.total:>16,}")
    if a.params_measured is not None:
        lines.append(f"  {'built model (measured)':<32}{a.params_measured:>16,}")
    return lines


def _flop_lines(a: Analysis) -> list[str]:
    f = a.flops
    lines = [f"{'Forward FLOPs (2·m·k·p per matmul)':<40}{'FLOPs':>14}{'share':>8}"]
    for name, v in f.by_component().items():
        lines.append(f"  {name:<38}{human(v):>14}{v / f.forward:>8.1%}")
    lines.append(f"  {'forward (matmuls)':<38}{human(f.forward):>14}")
    if a.crossover is not None:
        lines.append(f"  {'softmax (not in the total, estimate)':<38}{human(f.softmax):>14}")
    for name, v in a.elementwise.items():
        label = f"{name.replace('_', ' ')} (elementwise, not in it)"
        lines.append(f"  {label:<38}{human(v):>14}")
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
    if a.crossover is None:
        return lines
    lines.append("")
    c, d = a.crossover, a.config.d_model
    lines.append("Crossover length (attention n²·d products = n·d² products)")
    lines.append(f"  attention block: n = {c.block:,.0f} ({c.block / d:.3g}·d_model)")
    lines.append(f"  layer with FFN:  n = {c.layer:,.0f} ({c.layer / d:.3g}·d_model)")
    lines.append(f"  whole model:     n = {c.model:,.0f}")
    return lines


def _memory_lines(a: Analysis) -> list[str]:
    m = a.memory
    attention = ", math attention" if a.crossover is not None else ""
    lines = [f"Training memory ({a.dtype}, Adam, no checkpointing{attention})"]
    parts = {"attention scores": a.activations["attention_scores"]} if a.crossover else {}
    if "scan_states" in a.activations:  # Mamba's (B, T, E, N) tensors
        parts["scan states"] = a.activations["scan_states"]
    for label, v in (
        ("weights", m.weights),
        ("gradients", m.gradients),
        ("optimizer state", m.optimizer),
        ("activations", m.activations),
        *((f"  of which {name}", part) for name, part in parts.items()),
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
            f"  full context ({kv['context_len']} tokens x batch {a.flops.batch}{window}): "
            f"{human_bytes(kv['full_context'] or 0)}"
        )
    if a.state is not None:
        st = a.state
        lines.append("")
        lines.append(f"Decoding state ({a.dtype}; the same at any context length)")
        lines.append(f"  per sequence: {human_bytes(st['bytes_per_sequence'])}")
        lines.append(f"  batch {st['batch']}:      {human_bytes(st['total'])}")
        lines.append(
            f"  a KV cache of the same d_model and n_layers: "
            f"{human_bytes(st['kv_cache_per_token'])} per token, larger than the state from "
            f"{st['kv_cache_larger_from']:,} token{'s' * (st['kv_cache_larger_from'] != 1)}"
        )
    return lines


def format_report(a: Analysis) -> str:
    """The readable table of an :class:`Analysis`: parameters, FLOPs, memory, the MoE section
    (total vs active), notes."""
    f = a.flops
    src = f", src_len={f.src_len}" if f.src_len is not None else ""
    lines = [
        f"{a.name} ({type(a.config).model_type}): {_config_line(a.config)}",
        f"batch={f.batch}, seq_len={f.seq_len}{src}, tokens={f.tokens}",
        "",
        *_param_lines(a),
        "",
        *_flop_lines(a),
        "",
        *_memory_lines(a),
    ]
    if a.moe is not None:
        w = a.memory.weights
        lines += ["", *format_moe(a.moe, human_bytes(w), human_bytes(w * a.moe.active_fraction))]
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


__all__ = ["format_report", "format_sweep", "human", "human_bytes"]
