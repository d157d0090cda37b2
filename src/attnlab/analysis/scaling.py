"""Rules of thumb and the bottleneck: the 6·N·tokens estimate next to the exact training FLOPs,
the crossover lengths where attention's n²·d products overtake the n·d² ones, and how the FLOP
shares move with the sequence length. Built on :mod:`attnlab.analysis.flops` (same conventions).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from attnlab.analysis.flops import FlopBreakdown, default_seq_len, flop_formula, forward_flops
from attnlab.analysis.params import count_params
from attnlab.layers.feedforward import GATED


@dataclass(frozen=True)
class Approximation:
    """A rule-of-thumb training-FLOP estimate next to the exact count."""

    name: str
    flops: float
    exact: int

    @property
    def relative_error(self) -> float:
        """``(approximation - exact) / exact``."""
        return (self.flops - self.exact) / self.exact


def approximations(config: Any, flops: FlopBreakdown) -> list[Approximation]:
    """The classic estimates of one training step's FLOPs, against ``flops.training``.

    - ``6·N·tokens`` (Kaplan et al. 2020): N = all parameters (tied weights once).
    - ``6·N_non-emb·tokens``: N without the embedding tables.
    - ``6·N·tokens + 12·L·n·d·tokens`` (PaLM, Chowdhery et al. 2022, App. B): adds the score
      and weighted-sum products, ``L`` = all attention blocks (cross-attention included).
    """
    N = count_params(config)
    N_ne = count_params(config, exclude_embeddings=True)
    tokens = flops.tokens
    # 12·L·n·d per token is 3x (fwd + bwd) the 4·n·d of QKᵀ and AV per query and block; summed
    # over the blocks it is 6x the forward FLOPs of the score products (cross-attention too).
    attention = 6 * sum(t.flops for t in flops.terms if t.name.endswith(".scores"))
    exact = flops.training
    return [
        Approximation("6·N·tokens", 6 * N * tokens, exact),
        Approximation("6·N_non-emb·tokens", 6 * N_ne * tokens, exact),
        Approximation("6·N·tokens + 12·L·n·d·tokens", 6 * N * tokens + attention, exact),
    ]


@dataclass(frozen=True)
class Crossover:
    """Sequence lengths where the ``n²·d`` attention products overtake the ``n·d²`` ones.

    Attributes:
        block: one attention block, against its q/k/v/out projections: ``d + H_kv·D``
            (``2d`` without GQA, the lesson's "attention dominates once n passes 2d").
        layer: one layer (self-attention + FFN): ``d + H_kv·D + g·F/2`` with ``g`` = 2 (3 gated);
            ``6d`` for the paper's ``F = 4d``.
        model: the whole forward, embeddings and heads included (solved numerically; for an
            encoder-decoder, source = target length).
    """

    block: float
    layer: float
    model: float


def crossover(config: Any) -> Crossover:
    """The crossover lengths of ``config`` (matmul FLOPs; batch-independent).

    Raises:
        ValueError: for an unknown config type.
    """
    build = flop_formula(config)
    d = config.d_model
    kv = (config.n_kv_heads or config.n_heads) * config.d_head
    gates = 3 if config.activation in GATED else 2
    block = d + kv
    layer = block + gates * config.d_ff / 2

    def split(n: int) -> tuple[int, int]:
        terms, _ = build(config, 1, n, None)
        attn = sum(t.flops for t in terms if t.group == "attention")
        return attn, sum(t.flops for t in terms) - attn

    # attention = c·n² exactly; the rest = a·n + b (heads on pooled vectors give b).
    c = split(2)[0] / 4
    r2, r4 = split(2)[1], split(4)[1]
    a = (r4 - r2) / 2
    b = r2 - 2 * a
    model = (a + math.sqrt(a * a + 4 * c * b)) / (2 * c)
    return Crossover(block=float(block), layer=float(layer), model=model)


def sweep_seq_len(
    config: Any, lengths: Iterable[int] | None = None, *, batch: int = 1
) -> list[dict[str, float]]:
    """FLOP shares of projections, attention, FFN and the rest as the length grows.

    Args:
        lengths: sequence lengths (default powers of two from 64 to 8·``crossover.layer``
            rounded up, at least up to 4·``max_seq_len``; 64 to 4096 for a model without
            attention and context length, whose shares do not move).

    Returns:
        One row per length: ``seq_len``, ``forward`` (matmul FLOPs), ``softmax`` and the
        share of each group in :data:`FLOP_GROUPS`.
    """
    if lengths is None and not hasattr(config, "max_seq_len"):  # recurrent: no crossover
        lengths = [2**k for k in range(6, 13)]
    if lengths is None:
        top = max(8 * crossover(config).layer, 4 * default_seq_len(config))
        lengths = [2**k for k in range(6, max(7, math.ceil(math.log2(top))) + 1)]
    rows: list[dict[str, float]] = []
    for n in lengths:
        f = forward_flops(config, n, batch=batch)
        row: dict[str, float] = {"seq_len": n, "forward": f.forward, "softmax": f.softmax}
        row.update(f.shares())
        rows.append(row)
    return rows


__all__ = ["Approximation", "Crossover", "approximations", "crossover", "sweep_seq_len"]
