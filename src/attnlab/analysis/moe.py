"""Mixture-of-Experts figures: total vs active parameters per token, active FLOPs, weight bytes.

The closed forms themselves are those of every stack (:func:`~attnlab.analysis.params.
ffn_stack_params`, :func:`~attnlab.analysis.flops.ffn_stack_terms`): parameters count the
router ``D·E``, every expert and the shared experts (+ their gate ``D``); FLOPs count the router
and the k experts each token is routed to (dropless dispatch runs each (token, slot) assignment
once, so this is exactly what ``FlopCounterMode`` sees; a capacity factor drops some, making
the formula an upper bound). This module adds what only an MoE model has:

- :func:`active_params`: the parameters one token touches, the total minus the ``E - k`` idle
  experts of every MoE layer of every stack (embeddings and head included, as Mixtral's
  published 12.9B of 46.7B);
- :func:`moe_summary` / :func:`format_moe`: the section ``attnlab analyze`` prints.

Shapes: N tokens, D d_model, E experts, k top-k, F expert width.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from attnlab.analysis.flops import forward_flops
from attnlab.analysis.params import (
    count_params,
    expert_params,
    moe_layer_params,
    param_breakdown,
)
from attnlab.models.common import moe_layer_indices


def moe_layers_by_stack(config: Any) -> dict[str, tuple[int, ...]]:
    """Stack name (``"layers"``, ``"encoder"``, ``"decoder"``) -> its MoE layer indices (stacks
    without any left out; ``{}`` for a dense model or a config without MoE fields).

    Raises:
        ValueError: for a config without a closed form.
    """
    if not getattr(config, "n_experts", 0):
        return {}
    stacks = param_breakdown(config).n_layers
    found = {name: moe_layer_indices(config, n) for name, n in stacks.items()}
    return {name: layers for name, layers in found.items() if layers}


def active_params(config: Any, exclude_embeddings: bool = False) -> int:
    """Parameters one token uses: the total minus the ``E - k`` idle experts of each MoE layer.

    Raises:
        ValueError: for a config without a closed form.
    """
    total = count_params(config, exclude_embeddings=exclude_embeddings)
    n_moe = sum(len(v) for v in moe_layers_by_stack(config).values())
    if not n_moe:
        return total
    return total - n_moe * (config.n_experts - config.top_k) * expert_params(config)


@dataclass(frozen=True)
class MoESummary:
    """Total vs active figures of an MoE model (what ``attnlab analyze`` prints).

    Attributes:
        n_experts, top_k, n_shared_experts: the routing.
        moe_layers: stack name -> indices of its MoE layers.
        total_params: every parameter. active_params: those one token uses.
        expert_params: one routed expert. layer_params: one MoE layer's FFN (router included).
        forward_flops_per_token: active forward matmul FLOPs per token (the k chosen experts).
        training_flops_per_token: forward + backward, per token.
    """

    n_experts: int
    top_k: int
    n_shared_experts: int
    moe_layers: dict[str, tuple[int, ...]]
    total_params: int
    active_params: int
    expert_params: int
    layer_params: int
    forward_flops_per_token: float
    training_flops_per_token: float

    @property
    def active_fraction(self) -> float:
        """Active / total parameters."""
        return self.active_params / self.total_params

    @property
    def n_moe_layers(self) -> int:
        """MoE layers over all stacks."""
        return sum(len(v) for v in self.moe_layers.values())


def moe_summary(config: Any, seq_len: int | None = None) -> MoESummary | None:
    """The :class:`MoESummary` of ``config`` at ``seq_len`` (default the config's), or ``None``
    for a dense model (or a config without MoE fields).

    Raises:
        ValueError: for a config without a closed form or a bad ``seq_len``.
    """
    layers = moe_layers_by_stack(config)
    if not layers:
        return None
    f = forward_flops(config, seq_len)
    return MoESummary(
        n_experts=config.n_experts,
        top_k=config.top_k,
        n_shared_experts=config.n_shared_experts,
        moe_layers=layers,
        total_params=count_params(config),
        active_params=active_params(config),
        expert_params=expert_params(config),
        layer_params=moe_layer_params(config),
        forward_flops_per_token=f.forward_per_token,
        training_flops_per_token=f.training_per_token,
    )


def format_moe(s: MoESummary, resident: str, touched: str) -> list[str]:
    """Report lines for an :class:`MoESummary`; ``resident``/``touched``: the formatted bytes of
    all the weights and of those one token uses."""
    shared = f" + {s.n_shared_experts} shared" if s.n_shared_experts else ""
    return [
        f"Mixture of experts ({s.n_experts} experts{shared}, top-{s.top_k}, "
        f"{s.n_moe_layers} MoE layers)",
        f"  {'total parameters':<32}{s.total_params:>16,}",
        f"  {'active per token':<32}{s.active_params:>16,}{s.active_fraction:>8.1%}",
        f"  {'one expert':<32}{s.expert_params:>16,}",
        f"  {'one MoE layer (router incl.)':<32}{s.layer_params:>16,}",
        f"  weights resident: {resident}; touched per token: {touched}",
        f"  forward FLOPs per token (active): {s.forward_flops_per_token:,.0f}",
        f"  6·N_active per token: {6 * s.active_params:,} "
        f"(error {6 * s.active_params / s.training_flops_per_token - 1:+.2%} vs the exact "
        "training FLOPs; the 6·N rules above use the total N)",
    ]


__all__ = [
    "MoESummary",
    "active_params",
    "expert_params",
    "format_moe",
    "moe_layer_params",
    "moe_layers_by_stack",
    "moe_summary",
]
