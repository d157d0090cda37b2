"""One analysis of a model: parameters, FLOPs, crossover, memory and KV cache, as a table or JSON.

:func:`analyze` gathers the closed forms of :mod:`~attnlab.analysis.params`,
:mod:`~attnlab.analysis.flops` and :mod:`~attnlab.analysis.memory` for a config (or a built
model, meta-device ones included: only its config and parameter count are read), so a
175B-parameter preset is analysed without allocating anything.
:func:`attnlab.analysis.text.format_report` renders the readable table and
:meth:`Analysis.to_dict` the JSON; :func:`~attnlab.analysis.sweep_plot.plot_sweep` (and
:func:`attnlab.analysis.text.format_sweep`) show how the FLOP shares move with the sequence
length.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from torch import nn

from attnlab.analysis.flops import FlopBreakdown, forward_flops
from attnlab.analysis.memory import (
    TrainingMemory,
    activation_bytes,
    dtype_bytes,
    kv_cache_bytes,
    kv_cache_bytes_per_token,
    training_memory,
)
from attnlab.analysis.moe import MoESummary, moe_summary
from attnlab.analysis.params import ParamBreakdown, count_params, family_costs, param_breakdown
from attnlab.analysis.recurrent import (
    ANALYZE_SEQ_LEN,
    elementwise_flops,
    is_recurrent_config,
    state_figures,
)
from attnlab.analysis.scaling import Approximation, Crossover, approximations, crossover
from attnlab.analysis.sweep_plot import plot_sweep  # re-exported: attnlab analyze --plot
from attnlab.config import config_to_dict


@dataclass(frozen=True)
class Analysis:
    """Everything :func:`analyze` computes for one model at one batch and length."""

    name: str
    config: Any
    params: ParamBreakdown
    params_measured: int | None  # count_params of a built model, when one was given
    flops: FlopBreakdown
    approximations: list[Approximation]
    crossover: Crossover | None  # None: no attention (a recurrent model)
    memory: TrainingMemory
    activations: dict[str, int]
    dtype: str
    kv_cache: dict[str, int | None] | None
    notes: list[str] = field(default_factory=list)
    moe: MoESummary | None = None  # mixture-of-experts models: total vs active
    state: dict[str, int] | None = None  # a recurrent model's decoding state
    elementwise: dict[str, int] = field(default_factory=dict)  # FLOPs outside the matmuls

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
                "elementwise": self.elementwise,
                "approximations": [
                    {"name": a.name, "flops": a.flops, "relative_error": a.relative_error}
                    for a in self.approximations
                ],
            },
            "crossover": dataclasses.asdict(self.crossover) if self.crossover else None,
            "memory": {
                "dtype": self.dtype,
                **self.memory.as_dict(),
                "activations_detail": self.activations,
            },
            "kv_cache": self.kv_cache,
            "moe": dataclasses.asdict(self.moe) if self.moe is not None else None,
            "state": self.state,
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
        seq_len: T (default the config's ``max_seq_len``; ViT: its patches + 1; a recurrent
            model, which has no context length: :data:`~attnlab.analysis.recurrent.
            ANALYZE_SEQ_LEN`, said in a note).
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
    recurrent = is_recurrent_config(config)
    if recurrent and src_len is not None:
        raise ValueError("src_len applies to encoder-decoder models")
    length = ANALYZE_SEQ_LEN if recurrent and seq_len is None else seq_len
    flops = forward_flops(config, length, batch=batch, src_len=src_len)
    n = flops.seq_len
    memory = training_memory(config, n, batch=batch, src_len=src_len, dtype=dtype)
    acts = activation_bytes(config, n, batch=batch, src_len=src_len, dtype=dtype)
    kv: dict[str, int | None] | None = None
    if family_costs(config, "analysis").kv_cache is not None:  # decoders cache keys/values
        kv = {
            "bytes_per_token": kv_cache_bytes_per_token(config, dtype=dtype),
            "context_len": n,
            "window": window,
            "full_context": kv_cache_bytes(
                config, n, batch=batch, src_len=src_len, window=window, dtype=dtype
            ),
        }
    return Analysis(
        name=name or type(config).__name__,
        config=config,
        params=params,
        params_measured=measured,
        flops=flops,
        approximations=approximations(config, flops),
        crossover=None if recurrent else crossover(config),
        memory=memory,
        activations=acts,
        dtype=dtype if isinstance(dtype, str) else f"{dtype_bytes(dtype)} bytes",
        kv_cache=kv,
        notes=_notes(config, n, measured, params.total, defaulted=seq_len is None),
        moe=moe_summary(config, n),
        state=state_figures(config, batch=batch, dtype=dtype) if recurrent else None,
        elementwise=elementwise_flops(config, n, batch=batch) if recurrent else {},
    )


def _notes(
    config: Any, n: int, measured: int | None, closed_form: int, *, defaulted: bool
) -> list[str]:
    """What a reader of the figures should know about this config and length."""
    notes: list[str] = []
    if is_recurrent_config(config):
        if defaulted:
            notes.append(
                f"{type(config).__name__} has no context length: the figures are for "
                f"seq_len={n} (pass --seq-len / seq_len=)"
            )
        notes.append(
            "no attention: no crossover and no KV cache; decoding keeps the constant-size "
            "state above instead (the cache figure is a Transformer decoder's of the same "
            "d_model and n_layers)"
        )
    if getattr(config, "pos_encoding", None) == "learned" and n > config.max_seq_len:
        notes.append(
            f"seq_len={n} exceeds the learned position table (max_seq_len={config.max_seq_len}):"
            " the model cannot run it; the figures are the architecture's"
        )
    costs = family_costs(config, "analysis")
    if costs.notes is not None:  # what the family says of its own figures
        notes += costs.notes(config, n)
    if getattr(config, "n_experts", 0):
        notes.append(
            "MoE: parameters and weight memory count every expert; FLOPs count the k active "
            "experts per token; the activation figures and crossovers assume a dense FFN of d_ff"
        )
    if measured is not None and measured != closed_form:
        notes.append(f"the built model has {measured} parameters, the closed form {closed_form}")
    return notes


__all__ = [
    "Analysis",
    "analyze",
    "plot_sweep",
]
