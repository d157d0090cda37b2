"""Sparse Transformer attention: the strided and fixed patterns (Child et al., 2019).

"Generating Long Sequences with Sparse Transformers" factorises attention: each query attends to
a fixed subset of the keys, chosen by position alone, and the softmax of eq. (1) runs over that
subset. Query ``i`` sits at position ``p = i + S - T`` (bottom-right aligned, as cached decoding
needs); blocks are ``[m·l, (m+1)·l)`` of key positions.

- ``"sparse_strided"``: query ``p`` sees the ``l`` most recent keys, ``p - l < j <= p``, and
  every ``l``-th key before them, ``(p - j) mod l = 0``. Bidirectional: ``|p - j| < l`` or
  ``(p - j) mod l = 0``. With ``l ≈ sqrt(n)`` each query sees about ``2·sqrt(n)`` keys:
  ``O(n·sqrt(n))`` scores instead of ``n²``.
- ``"sparse_fixed"``: query ``p`` sees its own block, ``j // l = p // l``, and the last ``c``
  positions of every block, ``j mod l >= l - c`` (the "summary" columns through which
  information crosses blocks). Causal: only ``j <= p`` of both.

Computed block-sparsely with :mod:`attnlab.layers.attention_blocksparse`: the local keys are a band
of ``2l`` (causal) or ``3l`` keys per query block (a view), the strided keys one residue class per
query row (the keys viewed as ``(l, S / l)``: the query rows of residue ``ρ`` meet the ``S / l``
keys of residue ``ρ``), the summary columns one shared list. ``*_score_count`` gives the number of
scores built per (batch, head), ``*_mask`` the pattern as a dense ``(T, S)`` bool mask (the math
path under it gives the same output; for tests and pictures).

Shapes: B batch, H query heads, H_kv key/value heads, T queries, S keys, D head dim, Dv value dim,
l block (stride) size.
Masks (the whole library): bool True = may attend, float additive, broadcastable to (B, H, T, S),
applied on top of the pattern. A query with nothing to attend returns zeros; a NaN or inf in q, k
or v makes the rows that see it non-finite (the rule of :mod:`attnlab.layers.attention`).

Deviations from the paper: one pattern for all heads and layers (the paper splits the strided
pattern's two sets over heads or interleaved layers; here their union is every head's pattern),
and no custom GPU kernel: the parts are ordinary PyTorch ops.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from attnlab.layers.attention_backends import ATTENTION_BACKEND_FACTORIES, ATTENTION_BACKENDS
from attnlab.layers.attention_blocksparse import (
    Part,
    SparseBackend,
    attend_parts,
    band_part,
    check_call,
    check_int,
    empty_attention,
    list_part,
    make_grid,
    query_grid,
)

DEFAULT_BLOCK = 64


# -- Sparse Transformer: strided ----------------------------------------------------------------


def strided_mask(
    T: int,
    S: int | None = None,
    *,
    block: int,
    is_causal: bool = True,
    device: torch.device | str | None = None,
) -> Tensor:
    """The strided pattern as a dense ``(T, S)`` bool mask (True = may attend). O(T·S)."""
    S = T if S is None else S
    p = torch.arange(T, device=device).unsqueeze(1) + (S - T)  # (T, 1)
    j = torch.arange(S, device=device).unsqueeze(0)  # (1, S)
    keep = ((p - j).abs() < block) | ((p - j) % block == 0)
    return keep & (j <= p) if is_causal else keep


def strided_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    *,
    block: int = DEFAULT_BLOCK,
    mask: Tensor | None = None,
    is_causal: bool = False,
    dropout_p: float = 0.0,
    scale: float | None = None,
) -> Tensor:
    """Sparse Transformer strided attention: the ``block`` latest keys and every ``block``-th.

    Args:
        block: the stride ``l``; ``l ≈ sqrt(n)`` gives ``O(n·sqrt(n))`` scores.
        mask: bool (True = may attend) or additive float, broadcastable to (B, H, T, S).
        is_causal: keys ``j <= p`` only (bottom-right aligned); else both sides.
        dropout_p, scale: as for every backend.

    Shapes:
        q ``(B, H, T, D)``, k ``(B, H_kv, S, D)``, v ``(B, H_kv, S, Dv)`` -> ``(B, H, T, Dv)``.

    Raises:
        ValueError / TypeError: bad shapes, dtypes, masks, ``block`` or ``dropout_p``.
    """
    l = check_int("block", block, low=1)
    B, H, H_kv, T, S, D = check_call(q, k, v, mask, dropout_p, scale)
    if T == 0 or S == 0:
        return empty_attention(q, k, v)
    cdt = torch.promote_types(q.dtype, torch.float32)
    g = make_grid(T, S, l, q.device)
    qg = query_grid(q, g, H_kv, 1.0 / math.sqrt(D) if scale is None else scale, cdt)
    p0 = g.p0
    if is_causal:  # p - l < j <= p lies in [a·l - l, a·l + l)
        band = band_part(qg, k, v, g, p0 - l, 2 * l, lambda p, j: (j <= p) & (j > p - l))
    else:  # |p - j| < l lies in [a·l - l, a·l + 2l)
        band = band_part(qg, k, v, g, p0 - l, 3 * l, lambda p, j: (p - j).abs() < l)
    # every l-th key: keys viewed as (l residues, Nk), query row ρ of each block meets residue ρ
    Nk = -(-S // l)
    k_res = F.pad(k.to(cdt), (0, 0, 0, Nk * l - S)).view(B, H_kv, Nk, l, D)
    k_res = k_res.transpose(2, 3).contiguous()  # (B, H_kv, l, Nk, D)
    v_res = F.pad(v, (0, 0, 0, Nk * l - S)).view(B, H_kv, Nk, l, -1)
    v_res = v_res.transpose(2, 3).contiguous()  # (B, H_kv, l, Nk, Dv)
    j = torch.arange(Nk, device=q.device) * l + torch.arange(l, device=q.device).view(l, 1)
    j = j.unsqueeze(0)  # (1, l, Nk) key position of residue ρ, column m
    gap = g.pos.unsqueeze(-1) - j  # (N, l, Nk)
    keep = (j < S) & g.valid.unsqueeze(-1) & ((gap >= l) if is_causal else (gap.abs() >= l))
    scores = torch.einsum("bgrnqd,bgqmd->bgrnqm", qg, k_res)  # (B, H_kv, r, N, l, Nk)
    stride = Part(
        scores, keep, j.clamp(max=S - 1), lambda w: torch.einsum("bgrnqm,bgqmd->bgrnqd", w, v_res)
    )
    return attend_parts([band, stride], g, mask, dropout_p, v.dtype, H, T)


def strided_score_count(T: int, S: int | None = None, *, block: int, is_causal: bool) -> int:
    """Scores :func:`strided_attention` builds per (batch, head): ``N·l·(2l or 3l + S/l)``."""
    S = T if S is None else S
    N = -(-((S - T) % block + T) // block)
    return N * block * ((2 if is_causal else 3) * block + -(-S // block))


# -- Sparse Transformer: fixed ------------------------------------------------------------------


def fixed_mask(
    T: int,
    S: int | None = None,
    *,
    block: int,
    summary: int = 1,
    is_causal: bool = True,
    device: torch.device | str | None = None,
) -> Tensor:
    """The fixed pattern as a dense ``(T, S)`` bool mask (True = may attend). O(T·S)."""
    S = T if S is None else S
    p = torch.arange(T, device=device).unsqueeze(1) + (S - T)  # (T, 1)
    j = torch.arange(S, device=device).unsqueeze(0)  # (1, S)
    keep = (j // block == p // block) | (j % block >= block - summary)
    return keep & (j <= p) if is_causal else keep


def _summary_columns(S: int, l: int, c: int, device: torch.device) -> Tensor:
    """Key positions ``j < S`` with ``j mod l >= l - c``. Shapes: ``(K,)``."""
    j = torch.arange(-(-S // l), device=device).view(-1, 1) * l + torch.arange(
        l - c, l, device=device
    )
    j = j.flatten()
    return j[j < S]


def fixed_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    *,
    block: int = DEFAULT_BLOCK,
    summary: int = 1,
    mask: Tensor | None = None,
    is_causal: bool = False,
    dropout_p: float = 0.0,
    scale: float | None = None,
) -> Tensor:
    """Sparse Transformer fixed attention: the own block plus ``summary`` columns per block.

    Args:
        block: the block length ``l``. summary: ``c``, the last ``c`` positions of each block
            that every query sees (``1 <= c <= l``).
        mask, is_causal, dropout_p, scale: as for :func:`strided_attention`.

    Shapes:
        q ``(B, H, T, D)``, k ``(B, H_kv, S, D)``, v ``(B, H_kv, S, Dv)`` -> ``(B, H, T, Dv)``.

    Raises:
        ValueError / TypeError: bad shapes, dtypes, masks, ``block``, ``summary``, ``dropout_p``.
    """
    l = check_int("block", block, low=1)
    c = check_int("summary", summary, low=1)
    if c > l:
        raise ValueError(f"summary must be at most block={l}, got {summary!r}")
    _, H, H_kv, T, S, D = check_call(q, k, v, mask, dropout_p, scale)
    if T == 0 or S == 0:
        return empty_attention(q, k, v)
    cdt = torch.promote_types(q.dtype, torch.float32)
    g = make_grid(T, S, l, q.device)
    qg = query_grid(q, g, H_kv, 1.0 / math.sqrt(D) if scale is None else scale, cdt)
    causal: Callable[[Tensor, Tensor], Tensor] = (
        (lambda p, j: j <= p) if is_causal else (lambda p, j: torch.ones_like(j, dtype=torch.bool))
    )
    own = band_part(qg, k, v, g, g.p0, l, causal)  # the own block
    cols = _summary_columns(S, l, c, q.device)  # (K,)
    summ = list_part(
        qg,
        k,
        v,
        g,
        cols,
        torch.ones_like(cols, dtype=torch.bool),
        lambda p, j: causal(p, j) & (j // l != p // l),
    )
    return attend_parts([own, summ], g, mask, dropout_p, v.dtype, H, T)


def fixed_score_count(T: int, S: int | None = None, *, block: int, summary: int = 1) -> int:
    """Scores :func:`fixed_attention` builds per (batch, head): ``N·l·(l + K)``."""
    S = T if S is None else S
    N = -(-((S - T) % block + T) // block)
    K = (S // block) * summary + max(0, S % block - (block - summary))
    return N * block * (block + K)


class StridedAttention(SparseBackend):
    """The ``"sparse_strided"`` backend (see :func:`strided_attention`).

    Args:
        block: the stride ``l`` (default 64).

    Raises:
        ValueError: for a block that is not a positive integer.
    """

    __name__ = "sparse_strided"

    def __init__(self, block: int = DEFAULT_BLOCK) -> None:
        self.block = check_int("block", block, low=1)

    def _options(self) -> dict[str, Any]:
        return {"block": self.block}

    def _fn(self, q: Tensor, k: Tensor, v: Tensor, **kw: Any) -> Tensor:
        return strided_attention(q, k, v, **kw)

    def dense_mask(
        self,
        T: int,
        S: int | None = None,
        *,
        is_causal: bool,
        device: torch.device | str | None = None,
    ) -> Tensor:
        """This pattern as a dense ``(T, S)`` bool mask (:func:`strided_mask`)."""
        return strided_mask(T, S, block=self.block, is_causal=is_causal, device=device)

    def score_count(self, T: int, S: int | None = None, *, is_causal: bool) -> int:
        """Scores built per (batch, head) (:func:`strided_score_count`)."""
        return strided_score_count(T, S, block=self.block, is_causal=is_causal)


class FixedAttention(SparseBackend):
    """The ``"sparse_fixed"`` backend (see :func:`fixed_attention`).

    Args:
        block: the block length ``l`` (default 64). summary: ``c``, summary columns per block.

    Raises:
        ValueError: for a block or summary that is not a positive integer, or ``summary > block``.
    """

    __name__ = "sparse_fixed"

    def __init__(self, block: int = DEFAULT_BLOCK, summary: int = 1) -> None:
        self.block = check_int("block", block, low=1)
        self.summary = check_int("summary", summary, low=1)
        if self.summary > self.block:
            raise ValueError(f"summary must be at most block={self.block}, got {summary!r}")

    def _options(self) -> dict[str, Any]:
        return {"block": self.block, "summary": self.summary}

    def _fn(self, q: Tensor, k: Tensor, v: Tensor, **kw: Any) -> Tensor:
        return fixed_attention(q, k, v, **kw)

    def dense_mask(
        self,
        T: int,
        S: int | None = None,
        *,
        is_causal: bool,
        device: torch.device | str | None = None,
    ) -> Tensor:
        """This pattern as a dense ``(T, S)`` bool mask (:func:`fixed_mask`)."""
        return fixed_mask(
            T, S, block=self.block, summary=self.summary, is_causal=is_causal, device=device
        )

    def score_count(self, T: int, S: int | None = None, *, is_causal: bool) -> int:
        """Scores built per (batch, head) (:func:`fixed_score_count`; the same either way)."""
        return fixed_score_count(T, S, block=self.block, summary=self.summary)


ATTENTION_BACKENDS.add("sparse_strided", StridedAttention())
ATTENTION_BACKEND_FACTORIES.add("sparse_strided", StridedAttention)
ATTENTION_BACKENDS.add("sparse_fixed", FixedAttention())
ATTENTION_BACKEND_FACTORIES.add("sparse_fixed", FixedAttention)

__all__ = [
    "DEFAULT_BLOCK",
    "FixedAttention",
    "StridedAttention",
    "fixed_attention",
    "fixed_mask",
    "fixed_score_count",
    "strided_attention",
    "strided_mask",
    "strided_score_count",
]
