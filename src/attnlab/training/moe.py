"""Mixture-of-Experts in training: the auxiliary loss, the expert statistics, the bias update.

Each :class:`~attnlab.layers.moe.MoEFeedForward` keeps the statistics of its last forward
(:class:`~attnlab.layers.moe.MoEStats`, losses still in the graph), so the model's forward keeps
its signature. From them:

- the objectives add :func:`model_aux_loss` to their :class:`~attnlab.training.objectives.
  LossTerms` (``aux_loss``: Σ over MoE layers of ``aux_loss_weight · balance + z_loss_weight ·
  z``, a mean over the micro-batch's tokens); the trainer adds it to the training loss,
  weighted by the micro-batch's share of the step's loss terms, and never to ``val_loss``;
- :class:`MoEStepStats` sums, over the micro-batches of one step, each layer's tokens per
  expert, the dropped assignments and the unweighted losses; the trainer writes them into the
  step's ``metrics.jsonl`` line (``moe_load``, ``moe_dropped_fraction``, ... — see
  :meth:`MoEStepStats.fields`), summed over the processes of a distributed run;
- after each optimizer step, layers built with ``router_bias_balancing`` get DeepSeek-V3's
  aux-loss-free bias update from the step's counts (summed over the processes, so every process
  keeps the same biases); the biases are buffers, saved with the weights.

Only the logged step's micro-batches are counted (as the line's ``loss`` is that step's), so a
resumed run logs exactly what the uninterrupted run would.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

from attnlab.layers.moe import MoEFeedForward
from attnlab.layers.moe_stats import moe_layers, update_balance_biases
from attnlab.training.distributed import DistributedContext, all_reduce_sum


def model_aux_loss(model: nn.Module) -> Tensor | None:
    """The weighted auxiliary loss of ``model``'s last forward: Σ over its MoE layers of
    ``stats.loss`` (fp32 scalar, in the graph); ``None`` for a model without MoE layers."""
    stats = [m.last_stats for m in model.modules() if isinstance(m, MoEFeedForward)]
    losses = [s.loss for s in stats if s is not None]
    if not losses:
        return None
    return torch.stack(losses).sum()


class MoEStepStats:
    """The MoE statistics of one training step, summed over its micro-batches.

    Args:
        layers: module name -> MoE layer (:func:`~attnlab.layers.moe_stats.moe_layers`).
    """

    def __init__(self, layers: dict[str, MoEFeedForward]) -> None:
        self.layers = layers
        self.balancing = any(m.balance_bias is not None for m in layers.values())
        self.reset()

    @classmethod
    def of(cls, model: nn.Module) -> MoEStepStats | None:
        """The statistics of ``model``'s MoE layers, or ``None`` for a dense model."""
        layers = moe_layers(model)
        return cls(layers) if layers else None

    def reset(self) -> None:
        """Forget the counts (at the start of a step)."""
        self.counts: dict[str, Tensor] = {}
        self.dropped: Tensor | None = None
        self.assignments = 0
        self.balance: Tensor | None = None
        self.z: Tensor | None = None
        self.micro_batches = 0

    def add(self) -> None:
        """Add the layers' last forward (call after each training micro-batch)."""
        balance, z, dropped = [], [], []
        for name, layer in self.layers.items():
            s = layer.last_stats
            if s is None:
                continue
            counts = s.tokens_per_expert.detach()
            self.counts[name] = counts if name not in self.counts else self.counts[name] + counts
            balance.append(s.aux_loss.detach())
            z.append(s.z_loss.detach())
            dropped.append(s.dropped.detach())
            self.assignments += s.n_assignments
        if not balance:
            return
        step = (torch.stack(balance).sum(), torch.stack(z).sum(), torch.stack(dropped).sum())
        if self.balance is None or self.z is None or self.dropped is None:
            self.balance, self.z, self.dropped = step
        else:
            self.balance, self.z = self.balance + step[0], self.z + step[1]
            self.dropped = self.dropped + step[2]
        self.micro_batches += 1

    def _global_counts(self, dist: DistributedContext) -> dict[str, Tensor]:
        """The step's counts per layer, summed over the processes."""
        if not dist.enabled or not self.counts:
            return self.counts
        names = list(self.counts)
        flat = [float(v) for n in names for v in self.counts[n].tolist()]
        summed, out, i = all_reduce_sum(flat, dist), {}, 0
        for n in names:
            k = self.counts[n].numel()
            out[n] = torch.tensor(summed[i : i + k], dtype=torch.long)
            i += k
        return out

    def after_step(self, model: nn.Module, dist: DistributedContext) -> None:
        """The aux-loss-free bias update of the balancing layers, from the step's counts
        (every process calls it)."""
        if self.balancing and self.counts:
            counts = self._global_counts(dist)
            device = next(iter(self.layers.values())).router.weight.device
            update_balance_biases(model, counts={n: c.to(device) for n, c in counts.items()})

    def fields(self, dist: DistributedContext) -> dict[str, Any]:
        """The step's figures for its metrics line (every process calls it):

        - ``moe_balance_loss``, ``moe_z_loss``: the unweighted load-balancing loss
          ``E·Σ f_i·P_i`` (uniform routing gives k) and router z-loss, summed over the MoE
          layers, mean over the micro-batches (and processes);
        - ``moe_dropped_fraction``: assignments dropped by the capacity / routed ones;
        - ``moe_max_load_ratio``: the most loaded expert's count / the mean count, worst layer
          (1.0: perfectly balanced);
        - ``moe_load``: layer name -> assignments routed to each expert (before capacity), summed
          over the step's micro-batches and the processes.
        """
        if self.balance is None or self.z is None or self.dropped is None:
            return {}
        sums = [float(self.balance), float(self.z), float(self.dropped), self.assignments,
                self.micro_batches]  # fmt: skip
        balance, z, dropped, assignments, n = all_reduce_sum(sums, dist)
        counts = self._global_counts(dist)
        ratios = [float(c.max()) / max(float(c.float().mean()), 1e-9) for c in counts.values()]
        return {
            "moe_balance_loss": balance / max(n, 1),
            "moe_z_loss": z / max(n, 1),
            "moe_dropped_fraction": dropped / max(assignments, 1),
            "moe_max_load_ratio": max(ratios, default=0.0),
            "moe_load": {name: [int(v) for v in c.tolist()] for name, c in counts.items()},
        }


__all__ = ["MoEStepStats", "model_aux_loss"]
