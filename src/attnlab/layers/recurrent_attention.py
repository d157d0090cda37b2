"""Attention of a recurrent decoder over its encoder's vectors: Bahdanau's additive score and
Luong's multiplicative ("general") score, and the masked softmax + weighted sum they share.

- Bahdanau, Cho & Bengio (2015), "Neural Machine Translation by Jointly Learning to Align and
  Translate", §3.1 and appendix A.1.2: ``e_tj = v^T tanh(W_s s + W_h h_j + b)``;
- Luong, Pham & Manning (2015), "Effective Approaches to Attention-based Neural Machine
  Translation", §3.1, the "general" score: ``e_tj = s^T W_a h_j``;
- both: ``α_t = softmax_j(e_t)`` over the real source tokens, ``c_t = Σ_j α_tj h_j``
  (:func:`attend`).

Each scorer projects the source vectors once (:meth:`keys`), so a decoder caches them as a
Transformer caches its cross-attention keys, and scores any number of queries against them.

Shapes: B batch, T queries (decoder steps), S source tokens, Q query width (the decoder state),
M source vector width, A Bahdanau's hidden size.
Masks: ``src_mask`` ``(B, S)`` bool, True = real token (may attend), as everywhere in attnlab.

Deviations: none (Bahdanau's ``b`` is the bias of ``W_h``).
"""

from __future__ import annotations

import torch
from torch import Tensor, nn


class AdditiveAttention(nn.Module):
    """Bahdanau's score ``e_tj = v^T tanh(W_s s_t + W_h h_j + b)``.

    Args:
        d_query: Q (decoder state). d_memory: M (source vector). d_attn: A.
    """

    def __init__(self, d_query: int, d_memory: int, d_attn: int, bias: bool = True) -> None:
        super().__init__()
        self.query_proj = nn.Linear(d_query, d_attn, bias=False)  # W_s
        self.key_proj = nn.Linear(d_memory, d_attn, bias=bias)  # W_h, b
        self.score_proj = nn.Linear(d_attn, 1, bias=False)  # v

    def keys(self, memory: Tensor) -> Tensor:
        """``W_h h_j + b``: memory ``(B, S, M)`` -> ``(B, S, A)`` (once per source)."""
        return self.key_proj(memory)

    def scores(self, query: Tensor, keys: Tensor) -> Tensor:
        """query ``(B, T, Q)``, keys ``(B, S, A)`` -> scores ``(B, T, S)``."""
        hidden = torch.tanh(self.query_proj(query)[:, :, None] + keys[:, None])  # (B, T, S, A)
        return self.score_proj(hidden).squeeze(-1)  # (B, T, S)


class BilinearAttention(nn.Module):
    """Luong's "general" score ``e_tj = s_t^T W_a h_j``.

    Args:
        d_query: Q (decoder state). d_memory: M (source vector).
    """

    def __init__(self, d_query: int, d_memory: int) -> None:
        super().__init__()
        self.key_proj = nn.Linear(d_memory, d_query, bias=False)  # W_a

    def keys(self, memory: Tensor) -> Tensor:
        """``W_a h_j``: memory ``(B, S, M)`` -> ``(B, S, Q)`` (once per source)."""
        return self.key_proj(memory)

    def scores(self, query: Tensor, keys: Tensor) -> Tensor:
        """query ``(B, T, Q)``, keys ``(B, S, Q)`` -> scores ``(B, T, S)``."""
        return query @ keys.transpose(1, 2)  # (B, T, S)


def attend(scores: Tensor, memory: Tensor, src_mask: Tensor | None) -> tuple[Tensor, Tensor]:
    """Softmax over the real source tokens and the weighted sum of their vectors.

    Args:
        scores: ``(B, T, S)``. memory: ``(B, S, M)``. src_mask: ``(B, S)`` True = real token
            (may attend); ``None``: every token.

    Returns:
        ``(context (B, T, M), weights (B, T, S))``; weights are exactly 0 on masked tokens and a
        row with no real token is all zeros (never NaN).
    """
    if src_mask is not None:
        scores = scores.masked_fill(~src_mask[:, None], torch.finfo(scores.dtype).min)
    weights = torch.softmax(scores, dim=-1)  # (B, T, S)
    if src_mask is not None:
        weights = weights * src_mask[:, None]  # exact zeros, also for an all-padding row
    return weights @ memory, weights  # (B, T, M), (B, T, S)


__all__ = ["AdditiveAttention", "BilinearAttention", "attend"]
