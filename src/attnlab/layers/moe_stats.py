"""The statistics of every MoE layer of a model, gathered after a forward, and model-wide helpers.

Each :class:`~attnlab.layers.moe.MoEFeedForward` keeps the :class:`~attnlab.layers.moe.MoEStats`
of its last forward; :func:`collect_moe_stats` sums their losses (still in the graph: a trainer
adds ``stats.loss`` to its loss) and gathers the per-expert loads, so the model's forward
signature stays ``(logits, loss)``. :func:`update_balance_biases` applies DeepSeek-V3's
aux-loss-free bias update to every layer that balances that way, outside the gradient.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from attnlab.layers.moe import MoEFeedForward


@dataclass
class MoEModelStats:
    """:class:`MoEStats` of every MoE layer of a model, gathered by :func:`collect_moe_stats`.

    Attributes:
        loss: Σ over layers of each layer's weighted aux + z loss (in the graph; 0 without MoE).
        aux_loss, z_loss: Σ over layers, unweighted.
        tokens_per_expert: layer module name -> ``(E,)`` routed counts.
        dropped_fraction: dropped / routed assignments over all layers.
        router_logits: layer name -> ``(N, E)`` for layers that keep them.
    """

    loss: Tensor
    aux_loss: Tensor
    z_loss: Tensor
    tokens_per_expert: dict[str, Tensor]
    dropped_fraction: float
    router_logits: dict[str, Tensor]

    def log_dict(self) -> dict[str, float]:
        """Scalars for a metrics log: losses, dropped fraction, worst layer's max/mean load."""
        imbalance = [
            float(c.max()) / max(float(c.float().mean()), 1e-9)
            for c in self.tokens_per_expert.values()
        ]
        return {
            "moe_aux_loss": float(self.aux_loss.detach()),
            "moe_z_loss": float(self.z_loss.detach()),
            "moe_dropped_fraction": self.dropped_fraction,
            "moe_max_load_ratio": max(imbalance, default=0.0),
        }


def moe_layers(model: nn.Module) -> dict[str, MoEFeedForward]:
    """Module name -> every :class:`MoEFeedForward` of ``model``, in model order."""
    return {name: m for name, m in model.named_modules() if isinstance(m, MoEFeedForward)}


def collect_moe_stats(model: nn.Module) -> MoEModelStats:
    """Sum / gather the :attr:`~MoEFeedForward.last_stats` of every MoE layer of ``model``.

    Layers that have not run yet are skipped; a model without MoE layers gives zero losses.
    """
    device = next((p.device for p in model.parameters()), torch.device("cpu"))
    zero = torch.zeros((), device=device)
    loss, aux, z = zero, zero, zero
    counts: dict[str, Tensor] = {}
    logits: dict[str, Tensor] = {}
    dropped, routed = 0, 0
    for name, layer in moe_layers(model).items():
        s = layer.last_stats
        if s is None:
            continue
        loss, aux, z = loss + s.loss, aux + s.aux_loss, z + s.z_loss
        counts[name] = s.tokens_per_expert
        dropped, routed = dropped + int(s.dropped), routed + s.n_assignments
        if s.router_logits is not None:
            logits[name] = s.router_logits
    return MoEModelStats(loss, aux, z, counts, dropped / max(routed, 1), logits)


def keep_router_logits(model: nn.Module, keep: bool = True) -> None:
    """Make every MoE layer of ``model`` store (or stop storing) its router logits."""
    for layer in moe_layers(model).values():
        layer.keep_router_logits = keep


def update_balance_biases(
    model: nn.Module,
    rate: float | None = None,
    *,
    counts: Mapping[str, Tensor] | None = None,
    reduce: Callable[[Tensor], Tensor] | None = None,
) -> None:
    """Apply DeepSeek-V3's bias update to every bias-balancing MoE layer of ``model`` (call it
    after each optimizer step).

    Args:
        rate: the update speed γ (default: each layer's ``bias_update_rate``).
        counts: layer name -> ``(E,)`` routed counts of the step (the trainer sums them over
            its micro-batches); default: each layer's last forward.
        reduce: applied to each layer's counts first, e.g. a sum over data-parallel processes
            (without it, processes that saw different tokens would drift apart).
    """
    for name, layer in moe_layers(model).items():
        if layer.balance_bias is None:
            continue
        if counts is not None and name in counts:
            c = counts[name]
        elif layer.last_stats is not None:
            c = layer.last_stats.tokens_per_expert
        else:
            continue
        layer.update_balance_bias(rate, reduce(c) if reduce is not None else c)


__all__ = [
    "MoEModelStats",
    "collect_moe_stats",
    "keep_router_logits",
    "moe_layers",
    "update_balance_biases",
]
