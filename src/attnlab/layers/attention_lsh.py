"""Reformer-style LSH attention: hash, sort by bucket, attend within chunks (Kitaev et al., 2020).

Softmax attention is dominated by the keys closest to the query, so find those first: hash every
vector with an angular locality-sensitive hash and attend only within a hash bucket.

1. **Shared QK.** The keys are the unit-normalised queries, ``k_j = q_j / |q_j|`` (the Reformer
   ties the query and key projections so that a query and its key land in the same bucket). The
   ``k`` argument of the backend signature is therefore *not used* (only its shape is checked):
   a model given ``attn_backend="lsh"`` computes its key projection for nothing. The backend
   object (:class:`LSHAttention`, what models call) still ties ``k`` into the graph with a zero
   weight, so that projection gets a zero gradient rather than none: data-parallel training
   (DDP) needs every parameter to receive one, as the mixture of experts does for idle experts.
   Self-attention only: ``S`` must equal ``T`` (no KV cache).
2. **Hash.** One random rotation ``R`` ``(D, n_buckets / 2)`` drawn from ``seed`` (the same for
   every head and call); the bucket of ``x`` is ``argmax([xR; -xR])``.
3. **Sort** the positions by (bucket, position); cut the sorted sequence into chunks of ``c``.
4. **Attend**: each query sees the keys of its own chunk and of the chunk before (no wrap
   around), of its own bucket, and -- when causal -- not later than itself. A query does not
   attend to itself (its own key has the largest possible score) unless it has nothing else.
5. **Un-sort** the outputs.

Causality: with ``is_causal`` a query attends only to keys at or before it, but *which* of them
share its chunk depends on the sort, i.e. on the buckets of every token, later ones included: a
later token can move the chunk boundaries and so change an earlier output (the Reformer has the
same property). The pattern is still a function of the hashes alone, never of the values.

Cost: O(n·c) scores plus an O(n log n) sort; no ``T x T`` tensor. :func:`lsh_mask` returns the
``(B, H, T, T)`` boolean pattern that the buckets define, and :func:`lsh_keys` the keys: the math
path on ``(q, lsh_keys(q), v)`` under that mask gives the same output. Attention weights
(``need_weights``, hooks on the scores) are refused: no ``(T, S)`` mask on the model's own keys
reproduces this backend.

Shapes: B batch, H query heads, H_kv value heads, T = S sequence, D head dim, Dv value dim,
N chunks, c chunk size.
Masks (the whole library): bool True = may attend, float additive, broadcastable to (B, H, T, S),
applied on top of the pattern. A query with nothing to attend returns zeros. Non-finite inputs
follow :mod:`attnlab.layers.attention`.

Deviations from the Reformer: one hash round (no multi-round union), no wrap-around of the first
chunk to the last, the self-exclusion is a hard rule (the Reformer's large negative score does the
same up to rounding), and the rotation is shared by all heads.
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from attnlab.layers.attention import repeat_kv
from attnlab.layers.attention_backends import ATTENTION_BACKEND_FACTORIES, ATTENTION_BACKENDS
from attnlab.layers.attention_blocksparse import (
    SparseBackend,
    check_call,
    check_int,
    empty_attention,
    softmax_keep,
    split_mask,
)


def _check_options(n_buckets: Any, chunk_size: Any, seed: Any) -> tuple[int, int, int]:
    nb = check_int("n_buckets", n_buckets, low=2, expected="an even integer >= 2")
    if nb % 2:
        raise ValueError(f"n_buckets must be an even integer >= 2, got {n_buckets!r}")
    return nb, check_int("chunk_size", chunk_size, low=1), check_int("seed", seed, low=0)


def lsh_keys(q: Tensor) -> Tensor:
    """The shared-QK keys: unit-normalised queries (a zero query gives a zero key).

    Shapes: ``(B, H, T, D)`` -> the same.
    """
    return F.normalize(q, dim=-1)


def lsh_buckets(q: Tensor, *, n_buckets: int, seed: int = 0) -> Tensor:
    """Angular LSH: ``argmax([qR; -qR])`` for a seeded random rotation ``R``.

    Shapes: ``(B, H, T, D)`` -> ``(B, H, T)`` long in ``[0, n_buckets)``.
    """
    n_buckets, _, seed = _check_options(n_buckets, 1, seed)
    gen = torch.Generator().manual_seed(seed)
    cdt = torch.promote_types(q.dtype, torch.float32)
    R = torch.randn(q.shape[-1], n_buckets // 2, generator=gen, dtype=torch.float64)
    x = q.to(cdt) @ R.to(device=q.device, dtype=cdt)  # (B, H, T, n_buckets / 2)
    return torch.cat([x, -x], dim=-1).argmax(dim=-1)


def _sorted(q: Tensor, n_buckets: int, seed: int) -> tuple[Tensor, Tensor]:
    """Buckets and the sort order by (bucket, position). Shapes: ``(B, H, T)`` twice."""
    T = q.shape[2]
    buckets = lsh_buckets(q, n_buckets=n_buckets, seed=seed)
    perm = torch.argsort(buckets * T + torch.arange(T, device=q.device), dim=-1)
    return buckets, perm


def _pattern(
    qb: Tensor, kb: Tensor, qp: Tensor, kp: Tensor, is_causal: bool, near: Tensor | None = None
) -> Tensor:
    """Same bucket (and causal, and ``near``), self only when alone; negative positions are
    padding.

    Shapes: query bucket/position ``(..., c, 1)``, key ``(..., 1, K)`` -> ``(..., c, K)``.
    """
    base = (qb == kb) & (qp >= 0) & (kp >= 0)
    if near is not None:
        base = base & near
    if is_causal:
        base = base & (kp <= qp)
    own = kp == qp
    other = base & ~own
    return other | (base & own & ~other.any(dim=-1, keepdim=True))


def lsh_mask(
    q: Tensor, *, n_buckets: int = 8, chunk_size: int = 64, seed: int = 0, is_causal: bool = False
) -> Tensor:
    """The dense pattern the buckets of ``q`` define (True = may attend). O(T²): reference only.

    Shapes: q ``(B, H, T, D)`` -> ``(B, H, T, T)`` bool.
    """
    n_buckets, c, seed = _check_options(n_buckets, chunk_size, seed)
    T = q.shape[2]
    buckets, perm = _sorted(q, n_buckets, seed)
    chunk = torch.argsort(perm, dim=-1) // c  # (B, H, T) chunk of each position
    gap = chunk.unsqueeze(-2) - chunk.unsqueeze(-1)  # (B, H, T, T): key chunk - query chunk
    pos = torch.arange(T, device=q.device)
    return _pattern(
        buckets.unsqueeze(-1),
        buckets.unsqueeze(-2),
        pos.view(T, 1),
        pos.view(1, T),
        is_causal,
        (gap == 0) | (gap == -1),
    )


def _chunks_with_previous(x: Tensor, N: int, c: int, fill: float | int) -> Tensor:
    """``(B, H, N·c, *rest)`` -> queries' chunks ``(B, H, N, c, *rest)`` and each chunk's keys
    (the previous chunk, then its own) ``(B, H, N, 2c, *rest)``; returns the latter."""
    xc = x.view(*x.shape[:2], N, c, *x.shape[3:])
    pad = [0, 0] * (x.dim() - 3) + [0, 0, 1, 0]
    prev = F.pad(xc, pad, value=fill)[:, :, :N]  # (B, H, N, c, *rest): chunk n - 1
    return torch.cat([prev, xc], dim=3)


def _gather_mask(m4: Tensor, qp: Tensor, kp: Tensor) -> Tensor:
    """``m4[b, h, qp, kp]`` for a ``(b, h, t, s)`` mask. Shapes: qp ``(B, H, N, c, 1)``, kp
    ``(B, H, N, 1, K)`` (positions, clamped) -> ``(B, H, N, c, K)``."""
    b, h, t, s = m4.shape
    B, H = qp.shape[:2]
    zero = torch.zeros((), dtype=torch.long, device=m4.device)
    bi = torch.arange(B, device=m4.device).view(B, 1, 1, 1, 1) if b > 1 else zero
    hi = torch.arange(H, device=m4.device).view(1, H, 1, 1, 1) if h > 1 else zero
    return m4[bi, hi, qp if t > 1 else zero, kp if s > 1 else zero]


def lsh_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    *,
    n_buckets: int = 8,
    chunk_size: int = 64,
    seed: int = 0,
    mask: Tensor | None = None,
    is_causal: bool = False,
    dropout_p: float = 0.0,
    scale: float | None = None,
) -> Tensor:
    """Reformer LSH self-attention with shared QK (``k`` is not used, see the module docstring).

    Args:
        n_buckets: hash buckets (even). chunk_size: ``c``, sorted positions per chunk.
        seed: the rotation's seed. mask: bool (True = may attend) or additive float,
            broadcastable to (B, H, T, S). is_causal: keys at or before the query only.
        dropout_p, scale: as for every backend.

    Shapes:
        q ``(B, H, T, D)``, k ``(B, H_kv, T, D)``, v ``(B, H_kv, T, Dv)`` -> ``(B, H, T, Dv)``.

    Raises:
        ValueError / TypeError: bad shapes, dtypes, masks, options, ``dropout_p``, or S != T.
    """
    n_buckets, c, seed = _check_options(n_buckets, chunk_size, seed)
    B, H, H_kv, T, S, D = check_call(q, k, v, mask, dropout_p, scale)
    if S != T:
        raise ValueError(
            f"lsh attention is self-attention with shared queries and keys: it needs S == T, "
            f"got T={T}, S={S} (no KV-cache decoding; use another backend there)"
        )
    if T == 0:
        return empty_attention(q, k, v)
    scale = 1.0 / math.sqrt(D) if scale is None else scale
    cdt = torch.promote_types(q.dtype, torch.float32)
    buckets, perm = _sorted(q, n_buckets, seed)
    N = -(-T // c)
    L = N * c

    def sort(x: Tensor, fill: float | int = 0) -> Tensor:  # (B, H, T, *r) -> (B, H, L, *r)
        idx = perm.view(*perm.shape, *([1] * (x.dim() - 3))).expand(*perm.shape, *x.shape[3:])
        x = x.gather(2, idx)
        return F.pad(x, [0, 0] * (x.dim() - 3) + [0, L - T], value=fill)

    qs = sort(q.to(cdt) * scale).view(B, H, N, c, D)
    ks = _chunks_with_previous(sort(lsh_keys(q.to(cdt))), N, c, 0.0)  # (B, H, N, 2c, D)
    vs = _chunks_with_previous(sort(repeat_kv(v, H // H_kv)), N, c, 0.0)  # (B, H, N, 2c, Dv)
    pos = sort(torch.arange(T, device=q.device).expand(B, H, T), -1)  # (B, H, L), -1: padding
    bk = sort(buckets, -1)
    qp, kp = pos.view(B, H, N, c, 1), _chunks_with_previous(pos, N, c, -1).unsqueeze(-2)
    keep = _pattern(
        bk.view(B, H, N, c, 1), _chunks_with_previous(bk, N, c, -1).unsqueeze(-2), qp, kp, is_causal
    )  # (B, H, N, c, 2c)
    scores = torch.einsum("bhncd,bhnkd->bhnck", qs, ks)  # (B, H, N, c, 2c)
    mask_keep, mask_bias = split_mask(mask)
    qpc, kpc = qp.clamp(min=0), kp.clamp(min=0)
    if mask_keep is not None:
        keep = keep & _gather_mask(mask_keep, qpc, kpc)
    if mask_bias is not None:
        scores = scores + _gather_mask(mask_bias, qpc, kpc).to(cdt)
    weights = softmax_keep(scores, keep, mask_bias is not None).to(v.dtype)
    if dropout_p > 0.0:
        weights = F.dropout(weights, p=dropout_p)
    out = torch.einsum("bhnck,bhnkd->bhncd", weights, vs).reshape(B, H, L, -1)[:, :, :T]
    rank = torch.argsort(perm, dim=-1).unsqueeze(-1).expand(B, H, T, out.shape[-1])
    return out.gather(2, rank)  # (B, H, T, Dv) back in position order


def lsh_score_count(T: int, *, chunk_size: int) -> int:
    """Scores :func:`lsh_attention` builds per (batch, head): ``N·c·2c``."""
    N = -(-T // chunk_size)
    return N * chunk_size * 2 * chunk_size


class LSHAttention(SparseBackend):
    """The ``"lsh"`` backend (see :func:`lsh_attention`; ``k`` is not used: shared QK).

    Args:
        n_buckets: even, default 8. chunk_size: default 64. seed: the rotation's (default 0).

    Raises:
        ValueError: for an odd or too small ``n_buckets``, a non-positive chunk size, a
            negative seed.
    """

    __name__ = "lsh"

    def __init__(self, n_buckets: int = 8, chunk_size: int = 64, seed: int = 0) -> None:
        self.n_buckets, self.chunk_size, self.seed = _check_options(n_buckets, chunk_size, seed)

    def _options(self) -> dict[str, Any]:
        return {"n_buckets": self.n_buckets, "chunk_size": self.chunk_size, "seed": self.seed}

    def _fn(self, q: Tensor, k: Tensor, v: Tensor, **kw: Any) -> Tensor:
        out = lsh_attention(q, k, v, **kw)
        if k.requires_grad and k.numel():  # a zero gradient for the unused key projection
            out = out + 0.0 * k.flatten()[0].to(out.dtype)  # adds exactly 0 to every entry
        return out

    def pattern(self, q: Tensor, *, is_causal: bool) -> Tensor:
        """The ``(B, H, T, T)`` pattern of ``q``'s buckets (:func:`lsh_mask`)."""
        return lsh_mask(q, is_causal=is_causal, **self._options())

    def dense_mask(
        self,
        T: int,
        S: int | None = None,
        *,
        is_causal: bool,
        device: torch.device | str | None = None,
    ) -> Tensor:
        """Refused: the pattern depends on the queries (use :meth:`pattern`).

        Raises:
            ValueError: always; the math path with the model's keys and a ``(T, S)`` mask cannot
                reproduce LSH attention (its keys are the normalised queries, its buckets come
                from q), so attention weights of this backend are not available.
        """
        raise ValueError(
            "the lsh backend's pattern depends on the queries' hash buckets and its keys are the "
            "normalised queries: no (T, S) mask reproduces it, so it cannot return attention "
            "weights; use lsh_mask(q) with lsh_keys(q) on the math path, or a backend with a "
            "fixed pattern"
        )

    def score_count(self, T: int, S: int | None = None, *, is_causal: bool) -> int:
        """Scores built per (batch, head) (:func:`lsh_score_count`)."""
        return lsh_score_count(T, chunk_size=self.chunk_size)


ATTENTION_BACKENDS.add("lsh", LSHAttention())
ATTENTION_BACKEND_FACTORIES.add("lsh", LSHAttention)

__all__ = [
    "LSHAttention",
    "lsh_attention",
    "lsh_buckets",
    "lsh_keys",
    "lsh_mask",
    "lsh_score_count",
]
