"""Mixture-of-Experts feed-forward layer: a router picks k of E expert FFNs per token.

    logits = x W_r                                   (router, no bias, as Mixtral)
    y(x)   = Σ_{i ∈ topk} g_i(x) · FFN_i(x)  [+ σ(x w_s) · FFN_shared(x)]

Routing, in fp32 (Shazeer et al. 2017; GShard, Lepikhin et al. 2020; Switch, Fedus et al. 2021;
Mixtral, Jiang et al. 2024):

- ``"topk_softmax"`` (Mixtral): take the k largest logits, softmax over those k only.
- ``"softmax_topk"`` (Switch / GShard / Qwen2-MoE): softmax over all E, keep the k largest
  probabilities; ``norm_topk_prob`` renormalises them to sum to 1 (Qwen2-MoE's flag; with it
  the two forms give the same weights).

Experts are :class:`~attnlab.layers.feedforward.FeedForward` modules (any activation of the
registry). Shared experts (DeepSeek-MoE, Qwen2-MoE) see every token: ``n`` shared experts of
width F_s are one FFN of width ``n·F_s`` (the same function: hidden units concatenate), with an
optional sigmoid gate ``shared_expert_gate`` (Qwen2-MoE).

Dispatch (no loop over tokens, no dense E-times compute): the ``N·k`` (token, slot) assignments
are listed slot-major (every token's first choice, then every second choice, ...), stably sorted
by expert id and split by the per-expert counts; each expert runs once on its rows and the
weighted outputs are summed back with ``index_add_``. Every expert runs, on a possibly empty
group, so every parameter gets a gradient (zeros when unused: DDP needs no
``find_unused_parameters``).

Capacity (``capacity_factor`` set; ``None`` is dropless): each expert keeps at most
``C = ceil(capacity_factor · N · k / E)`` assignments. Drop rule: within an expert, assignments
are kept in slot-major order, so first choices have priority over second choices, and within a
slot earlier tokens (flattened ``(B, T)`` order) come first; the rest are dropped (they add
nothing: the token keeps its other slots and the residual). Weights are not renormalised after
drops (as Switch and GShard).

Auxiliary losses (fp32, kept in the graph on :attr:`MoEFeedForward.last_stats`):

- load balancing (Switch eq. 4-6, as transformers' ``load_balancing_loss_func`` for top-k):
  ``E · Σ_i f_i · P_i`` with ``f_i`` = (assignments routed to expert i before capacity) / N, so
  ``Σ f_i = k``, and ``P_i`` = mean over the N tokens of softmax(logits)_i over all E experts.
  Uniform routing gives k; only ``P`` carries gradient.
- router z-loss (ST-MoE, Zoph et al. 2022, eq. 5): mean over tokens of logsumexp(logits)².

Aux-loss-free balancing (DeepSeek-V3 §2.1.2, ``bias_balancing=True``): a per-expert bias buffer
``balance_bias`` is added to the routing scores (logits for topk_softmax, probabilities for
softmax_topk) for the *selection* only; the weights use the unbiased scores. It is updated outside
the gradient by :meth:`MoEFeedForward.update_balance_bias` (for a whole model:
:func:`attnlab.layers.moe_stats.update_balance_biases`): ``b_i += rate · sign(mean load -
load_i)``. :mod:`attnlab.layers.moe_stats` gathers the statistics of every MoE layer of a model.

Shapes: B batch, T tokens, N = B·T, E experts, k top-k, D d_model, F expert d_ff.

Deviations: Mixtral's training-time router jitter noise is not implemented; the statistics cover
every token of the batch (padding included: the layer never sees the attention mask).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from attnlab.layers.feedforward import FeedForward

ROUTINGS = ("topk_softmax", "softmax_topk")


def _at_least_fp32(t: Tensor) -> Tensor:
    """``t`` in float32, or as is when already float32/float64 (gradcheck runs in float64)."""
    return t if t.dtype in (torch.float32, torch.float64) else t.float()


@dataclass
class MoEStats:
    """What one forward of a :class:`MoEFeedForward` measured.

    Attributes:
        aux_loss: the load-balancing loss ``E·Σ f_i·P_i`` (fp32 scalar, in the graph).
        z_loss: the router z-loss (fp32 scalar, in the graph).
        loss: ``aux_loss_weight · aux_loss + z_loss_weight · z_loss`` (what a trainer adds).
        tokens_per_expert: ``(E,)`` assignments routed to each expert (before capacity).
        kept_per_expert: ``(E,)`` assignments each expert ran (after capacity).
        dropped: assignments dropped by the capacity (0-dim long).
        tokens_fully_dropped: tokens that lost every one of their k assignments (0-dim long).
        n_assignments: N·k.
        router_logits: ``(N, E)`` when the layer's ``keep_router_logits`` is set.
    """

    aux_loss: Tensor
    z_loss: Tensor
    loss: Tensor
    tokens_per_expert: Tensor
    kept_per_expert: Tensor
    dropped: Tensor
    tokens_fully_dropped: Tensor
    n_assignments: int
    router_logits: Tensor | None = None

    @property
    def dropped_fraction(self) -> float:
        """Fraction of the N·k assignments dropped by the capacity."""
        return float(self.dropped) / max(self.n_assignments, 1)


def load_balancing_loss(logits: Tensor, counts: Tensor) -> Tensor:
    """Switch's ``E · Σ_i f_i · P_i`` (fp32) with ``f_i = counts_i / N`` and ``P_i`` the mean
    router probability; logits ``(N, E)``, counts ``(E,)``."""
    probs = torch.softmax(_at_least_fp32(logits), dim=-1)  # (N, E)
    n_tokens, n_experts = probs.shape
    f = counts.to(probs.dtype) / max(n_tokens, 1)  # (E,)
    return n_experts * (f * probs.mean(dim=0)).sum()


def router_z_loss(logits: Tensor) -> Tensor:
    """ST-MoE's z-loss: mean over tokens of ``logsumexp(logits)²`` (fp32); logits ``(N, E)``."""
    return torch.logsumexp(_at_least_fp32(logits), dim=-1).square().mean()


class MoEFeedForward(nn.Module):
    """A router over ``n_experts`` FFNs, top-k per token, plus optional shared experts.

    Args:
        d_model: D. d_ff: F, each routed expert's hidden width.
        n_experts: E (>= 1). top_k: k (1 <= k <= E).
        activation, dropout, bias: of every expert FFN (as :class:`FeedForward`).
        routing: ``"topk_softmax"`` or ``"softmax_topk"`` (see the module docstring).
        norm_topk_prob: with ``softmax_topk``, renormalise the k weights to sum to 1.
        capacity_factor: ``None`` (dropless) or > 0: C = ceil(factor · N · k / E) per expert.
        aux_loss_weight, z_loss_weight: the weights in :attr:`MoEStats.loss`.
        n_shared_experts: always-on experts (0: none). shared_expert_d_ff: each one's width
            (default ``d_ff``). shared_expert_gate: a sigmoid gate on their sum (Qwen2-MoE).
        bias_balancing: DeepSeek-V3's selection bias (buffer ``balance_bias``).
        bias_update_rate: its update speed γ (DeepSeek-V3: 0.001), the default of
            :meth:`update_balance_bias`.

    Raises:
        ValueError: for a bad size, routing, capacity factor or weight (naming it).
    """

    def __init__(
        self,
        d_model: int,
        d_ff: int,
        n_experts: int,
        top_k: int = 2,
        *,
        activation: str = "swiglu",
        dropout: float = 0.0,
        bias: bool = False,
        routing: str = "topk_softmax",
        norm_topk_prob: bool = True,
        capacity_factor: float | None = None,
        aux_loss_weight: float = 0.0,
        z_loss_weight: float = 0.0,
        n_shared_experts: int = 0,
        shared_expert_d_ff: int | None = None,
        shared_expert_gate: bool = False,
        bias_balancing: bool = False,
        bias_update_rate: float = 1e-3,
    ) -> None:
        super().__init__()
        if n_experts < 1 or not 1 <= top_k <= n_experts:
            raise ValueError(
                f"need n_experts >= 1 and 1 <= top_k <= n_experts, got {n_experts}, {top_k}"
            )
        if routing not in ROUTINGS:
            raise ValueError(f"routing={routing!r} is not valid; choose one of {list(ROUTINGS)}")
        if capacity_factor is not None and not (
            math.isfinite(capacity_factor) and capacity_factor > 0
        ):
            raise ValueError(
                f"capacity_factor must be None or a finite number > 0, got {capacity_factor}"
            )
        for name, w in (("aux_loss_weight", aux_loss_weight), ("z_loss_weight", z_loss_weight),
                        ("bias_update_rate", bias_update_rate)):  # fmt: skip
            if not (math.isfinite(w) and w >= 0):
                raise ValueError(f"{name} must be a finite number >= 0, got {w}")
        if n_shared_experts < 0:
            raise ValueError(f"n_shared_experts must be >= 0, got {n_shared_experts}")
        if shared_expert_gate and not n_shared_experts:
            raise ValueError("shared_expert_gate needs n_shared_experts >= 1")
        self.d_model, self.n_experts, self.top_k = d_model, n_experts, top_k
        self.routing, self.norm_topk_prob = routing, norm_topk_prob
        self.capacity_factor = capacity_factor
        self.aux_loss_weight, self.z_loss_weight = aux_loss_weight, z_loss_weight
        self.bias_update_rate = bias_update_rate
        self.router = nn.Linear(d_model, n_experts, bias=False)

        def ffn(width: int) -> FeedForward:
            return FeedForward(d_model, width, activation=activation, dropout=dropout, bias=bias)

        self.experts = nn.ModuleList(ffn(d_ff) for _ in range(n_experts))
        shared_width = n_shared_experts * (shared_expert_d_ff or d_ff)
        self.shared_expert = ffn(shared_width) if n_shared_experts else None
        self.shared_expert_gate = nn.Linear(d_model, 1, bias=False) if shared_expert_gate else None
        self.balance_bias: Tensor | None
        if bias_balancing:
            self.register_buffer("balance_bias", torch.zeros(n_experts))
        else:
            self.balance_bias = None
        self.keep_router_logits = False  # store (N, E) router logits in last_stats
        self.last_stats: MoEStats | None = None

    def capacity(self, n_tokens: int) -> int | None:
        """Assignments each expert may keep for ``n_tokens`` tokens (``None``: dropless)."""
        if self.capacity_factor is None:
            return None
        return math.ceil(self.capacity_factor * n_tokens * self.top_k / self.n_experts)

    def route(self, logits: Tensor) -> tuple[Tensor, Tensor]:
        """Routing weights ``(N, k)`` (fp32) and expert ids ``(N, k)`` (best first) from logits
        ``(N, E)``."""
        z = _at_least_fp32(logits)
        probs = torch.softmax(z, dim=-1) if self.routing == "softmax_topk" else None
        scores = z if probs is None else probs
        select = scores if self.balance_bias is None else scores + self.balance_bias
        idx = select.topk(self.top_k, dim=-1).indices  # (N, k)
        chosen = scores.gather(-1, idx)  # (N, k)
        if probs is None:
            weights = torch.softmax(chosen, dim=-1)
        elif self.norm_topk_prob:
            weights = chosen / chosen.sum(dim=-1, keepdim=True)
        else:
            weights = chosen
        return weights, idx

    def forward(self, x: Tensor) -> Tensor:
        """x ``(..., D)`` -> ``(..., D)``; records :attr:`last_stats`."""
        shape = x.shape
        h = x.reshape(-1, shape[-1])  # (N, D)
        logits = self.router(h)  # (N, E)
        weights, idx = self.route(logits)
        out, counts, kept, fully_dropped = self._dispatch(h, weights, idx)
        if self.shared_expert is not None:
            shared = self.shared_expert(h)  # (N, D)
            if self.shared_expert_gate is not None:
                shared = torch.sigmoid(self.shared_expert_gate(h)) * shared
            out = out + shared
        aux, z = load_balancing_loss(logits, counts), router_z_loss(logits)
        self.last_stats = MoEStats(
            aux_loss=aux,
            z_loss=z,
            loss=self.aux_loss_weight * aux + self.z_loss_weight * z,
            tokens_per_expert=counts,
            kept_per_expert=kept,
            dropped=counts.sum() - kept.sum(),
            tokens_fully_dropped=fully_dropped,
            n_assignments=idx.numel(),
            router_logits=logits.detach() if self.keep_router_logits else None,
        )
        return out.view(shape)

    def _dispatch(
        self, h: Tensor, weights: Tensor, idx: Tensor
    ) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """Run each expert once on its assignments; returns ``(output (N, D), routed (E,),
        kept (E,), tokens fully dropped)``."""
        N = idx.shape[0]
        flat = idx.t().reshape(-1)  # (k·N,) slot-major: assignment a is token a % N, slot a // N
        order = torch.argsort(flat, stable=True)  # grouped by expert, slot-major inside
        counts = torch.bincount(flat, minlength=self.n_experts)  # (E,)
        token = order % N  # (k·N,) token of each sorted assignment
        w = weights.t().reshape(-1).index_select(0, order)  # (k·N,)
        kept = counts
        fully_dropped = counts.new_zeros(())
        cap = self.capacity(N)
        if cap is not None:
            starts = torch.cumsum(counts, 0) - counts  # (E,) first sorted position of each expert
            rank = torch.arange(order.numel(), device=h.device) - starts[flat[order]]  # (k·N,)
            keep = rank < cap
            token, w = token[keep], w[keep]
            kept = counts.clamp(max=cap)
            fully_dropped = (torch.bincount(token, minlength=N) == 0).sum()
        # index_select, not h[token]: its backward is an index_add_, where indexing's is an
        # accumulating index_put_ that sorts the indices again (8% of the layer's step on CPU)
        rows = h.index_select(0, token)  # (M, D) the kept assignments' inputs, grouped by expert
        outs = [
            expert(part)
            for expert, part in zip(self.experts, rows.split(kept.tolist()), strict=True)
        ]
        y = torch.cat(outs) * w.to(h.dtype).unsqueeze(-1)  # (M, D)
        out = h.new_zeros(N, h.shape[-1]).index_add_(0, token, y)  # (N, D)
        return out, counts, kept, fully_dropped

    @torch.no_grad()
    def update_balance_bias(self, rate: float | None = None, counts: Tensor | None = None) -> None:
        """DeepSeek-V3's update ``b_i += rate · sign(mean(load) - load_i)`` from ``counts``
        ``(E,)`` (default: the last forward's routed counts; ``rate`` default
        ``bias_update_rate``).

        Raises:
            RuntimeError: without ``bias_balancing`` or before any forward.
        """
        if self.balance_bias is None:
            raise RuntimeError("this MoE layer was built without bias_balancing")
        if counts is None:
            if self.last_stats is None:
                raise RuntimeError("no forward yet: nothing to balance")
            counts = self.last_stats.tokens_per_expert
        load = counts.float()
        step = self.bias_update_rate if rate is None else rate
        self.balance_bias += step * torch.sign(load.mean() - load)

    def extra_repr(self) -> str:
        cap = (
            "dropless"
            if self.capacity_factor is None
            else f"capacity_factor={self.capacity_factor}"
        )
        return f"n_experts={self.n_experts}, top_k={self.top_k}, routing={self.routing!r}, {cap}"


__all__ = [
    "ROUTINGS",
    "MoEFeedForward",
    "MoEStats",
    "load_balancing_loss",
    "router_z_loss",
]
