"""Exact attention in blocks with the online softmax: the FlashAttention algorithm, readable.

Eq. (1) of "Attention Is All You Need" (§3.2.1) computed without ever holding the ``T x S`` score
matrix (Dao et al., 2022, "FlashAttention"; Milakov & Gimelshein, 2018, "Online normalizer
calculation for softmax"). Queries are cut into blocks of ``block_q`` rows and keys/values into
blocks of ``block_k``; for one query block we walk over the key blocks keeping, per query row,

    m  the running maximum of the scores seen so far,
    l  the running softmax denominator  sum_j exp(s_j - m),
    acc the running numerator           sum_j exp(s_j - m) v_j,

and when a new block raises the maximum from ``m`` to ``m'`` the old ``l`` and ``acc`` are rescaled
by ``exp(m - m')``. After the last block ``out = acc / l``: exactly softmax(scores) V, up to
floating-point rounding. Extra memory is O(T·D) for the output and the statistics plus one
``block_q x block_k`` tile per (batch, head), instead of the O(T·S) of the math path.

Backward: a custom ``autograd.Function`` saves only q, k, v, the output and the per-row
log-sum-exp ``L = m + log l`` and *recomputes* each tile's probabilities ``P = exp(s - L)`` in the
backward pass (FlashAttention's backward), so training memory is O(T·D) as well. The one exception
is an additive float mask that itself requires grad (a learned bias): then the blocked forward runs
under plain autograd, which is exact but saves every tile, i.e. O(T·S) memory again.

Dropout: the tile's unnormalised probabilities are dropped (and scaled by ``1/(1-p)``) only in the
numerator ``acc``, never in the denominator ``l`` -- the same as dropping the normalised weights,
``dropout(softmax(s)) V``. Each tile's dropout mask is drawn from a generator seeded by
``(seed, query block, key block)``, where ``seed`` comes from the global torch RNG, so the backward
pass regenerates identical masks and ``torch.manual_seed`` makes runs reproducible. The masks
differ from the math path's (same distribution, different draws).

Shapes: B batch, H query heads, H_kv key/value heads, T queries, S keys, D head dim, Dv value dim.
Masks (the whole library): bool True = may attend, float additive (entries at or below
``finfo.min`` count as masked), broadcastable to (B, H, T, S) and sliced per tile; ``is_causal`` is
bottom-right aligned (query i sees keys j <= i + S - T), and key blocks entirely in a query block's
future are skipped. A query that may attend to nothing returns zeros. Non-finite inputs: a NaN or
inf in q, k or v makes the rows that attend to it non-finite, as on the math path (see
:mod:`attnlab.layers.attention`), never zeros.

Deviations from FlashAttention: tiles are PyTorch ops in a Python loop (no fused kernel, no SRAM),
so on a CPU it is a teaching implementation, not a fast one; its point is the memory curve.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import Tensor
from torch.autograd.function import once_differentiable

from attnlab.layers.attention import check_qkv, repeat_kv
from attnlab.layers.attention_backends import ATTENTION_BACKEND_FACTORIES, ATTENTION_BACKENDS
from attnlab.layers.masks import check_mask

DEFAULT_BLOCK_Q = 256
DEFAULT_BLOCK_K = 256


def _as_4d(mask: Tensor) -> Tensor:
    """Left-pad a mask's shape with ones to 4 dims (a view). Returns ``(b, h, t, s)``."""
    return mask.reshape((1,) * (4 - mask.dim()) + tuple(mask.shape))


def _tile_seed(seed: int, qi: int, kj: int) -> int:
    """A distinct, reproducible generator seed per (query block, key block) tile."""
    return (seed * 1_000_003 + qi * 65_537 + kj) % (2**63 - 1)


def _dropout_scale(
    seed: int, qi: int, kj: int, shape: tuple[int, ...], p: float, like: Tensor
) -> Tensor:
    """The tile's dropout multiplier: 0 with probability p, else ``1 / (1 - p)``."""
    gen = torch.Generator(device=like.device)
    gen.manual_seed(_tile_seed(seed, qi, kj))
    keep = torch.rand(shape, generator=gen, device=like.device, dtype=like.dtype) >= p
    return keep.to(like.dtype) / (1.0 - p)


def _tile_scores(
    q_blk: Tensor,
    k_blk: Tensor,
    mask4: Tensor | None,
    is_causal: bool,
    offset: int,
    rows: tuple[int, int],
    cols: tuple[int, int],
    scale: float,
) -> tuple[Tensor, Tensor | None]:
    """Scores of one tile, ``-inf`` where masked, and the tile's keep mask (``None``: all kept).

    Shapes:
        q_blk ``(B, H, tq, D)``, k_blk ``(B, H, tk, D)`` -> ``(B, H, tq, tk)`` in q_blk's dtype;
        keep ``(tq, tk)`` or ``(b, h, tq, tk)`` bool.
    """
    (qs, qe), (ks, ke) = rows, cols
    s = (q_blk @ k_blk.transpose(-2, -1)) * scale  # (B, H, tq, tk)
    keep: Tensor | None = None
    if is_causal:
        i = torch.arange(qs, qe, device=s.device).unsqueeze(1)  # (tq, 1)
        j = torch.arange(ks, ke, device=s.device).unsqueeze(0)  # (1, tk)
        keep = j <= i + offset  # (tq, tk)
    if mask4 is not None:
        m = mask4 if mask4.shape[2] == 1 else mask4[:, :, qs:qe]
        m = m if m.shape[3] == 1 else m[:, :, :, ks:ke]  # (b, h, tq|1, tk|1)
        if m.dtype == torch.bool:
            keep = m if keep is None else keep & m
        else:
            s = (s + m.to(s.dtype)).clamp_min(torch.finfo(s.dtype).min)
            finite = m > torch.finfo(m.dtype).min
            keep = finite if keep is None else keep & finite
    if keep is not None:
        s = s.masked_fill(~keep, -math.inf)
    return s, keep


def _key_blocks(
    qs: int, qe: int, S: int, block_k: int, is_causal: bool, offset: int
) -> list[tuple[int, int, int]]:
    """``(index, start, end)`` of the key blocks a query block must visit (causal: no future)."""
    last = S if not is_causal else max(0, min(S, qe - 1 + offset + 1))
    return [(kj, ks, min(ks + block_k, S)) for kj, ks in enumerate(range(0, last, block_k))]


def _forward(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    mask4: Tensor | None,
    is_causal: bool,
    dropout_p: float,
    scale: float,
    seed: int,
    block_q: int,
    block_k: int,
) -> tuple[Tensor, Tensor]:
    """The online-softmax forward. Differentiable by plain autograd (then it saves every tile).

    Shapes:
        q ``(B, H, T, D)``, k ``(B, H_kv, S, D)``, v ``(B, H_kv, S, Dv)`` ->
        out ``(B, H, T, Dv)`` (q's dtype) and log-sum-exp ``(B, H, T, 1)`` (float32 or wider;
        ``+inf`` for rows that may attend to nothing).
    """
    B, H, T, _ = q.shape
    H_kv, S, Dv = k.shape[1], k.shape[2], v.shape[-1]
    n_rep, offset = H // H_kv, S - T
    cdt = torch.promote_types(q.dtype, torch.float32)  # statistics in at least float32
    outs, lses = [], []
    for qi, qs in enumerate(range(0, T, block_q)):
        qe = min(qs + block_q, T)
        q_blk = q[:, :, qs:qe].to(cdt)  # (B, H, tq, D)
        m = q_blk.new_full((B, H, qe - qs, 1), -math.inf)  # running max
        l = q_blk.new_zeros((B, H, qe - qs, 1))  # running denominator
        acc = q_blk.new_zeros((B, H, qe - qs, Dv))  # running numerator
        alive: Tensor | bool = False  # rows the masks let attend to at least one key
        for kj, ks, ke in _key_blocks(qs, qe, S, block_k, is_causal, offset):
            k_blk = repeat_kv(k[:, :, ks:ke], n_rep).to(cdt)  # (B, H, tk, D)
            v_blk = repeat_kv(v[:, :, ks:ke], n_rep).to(cdt)  # (B, H, tk, Dv)
            tile = (qs, qe), (ks, ke)
            s, keep = _tile_scores(q_blk, k_blk, mask4, is_causal, offset, *tile, scale)
            if alive is not True:
                alive = True if keep is None else keep.any(dim=-1, keepdim=True) | alive
            # The shift by the max cancels in acc / l, so it needs no gradient.
            m_new = torch.maximum(m, s.detach().amax(dim=-1, keepdim=True))  # (B, H, tq, 1)
            m_safe = torch.where(torch.isneginf(m_new), 0.0, m_new)  # rows with no key yet
            p = torch.exp(s - m_safe)  # (B, H, tq, tk); 0 where masked
            alpha = torch.exp(m - m_safe)  # rescales what was accumulated under the old max
            l = alpha * l + p.sum(dim=-1, keepdim=True)
            if dropout_p > 0.0:
                p = p * _dropout_scale(seed, qi, kj, tuple(p.shape), dropout_p, p)
            acc = alpha * acc + p @ v_blk  # (B, H, tq, Dv)
            m = m_new
        # Rows the masks leave without keys are zeros. Every other row is acc / l, so a NaN or
        # inf in q, k or v that reached a row stays visible there (0 / 0 included: a row whose
        # every score is -inf), as on the math path; it is never turned into a finite number.
        seen = alive if isinstance(alive, Tensor) else torch.tensor(alive, device=l.device)
        outs.append(torch.where(seen, acc / torch.where(seen, l, 1.0), 0.0))
        lses.append(torch.where(seen, m + torch.log(torch.where(seen, l, 1.0)), math.inf))
    if not outs:  # T == 0
        return q.new_zeros((B, H, 0, Dv)), q.new_zeros((B, H, 0, 1), dtype=cdt)
    return torch.cat(outs, dim=2).to(q.dtype), torch.cat(lses, dim=2)


class _ChunkedAttentionFn(torch.autograd.Function):
    """Blocked forward + recomputing backward (FlashAttention's backward pass)."""

    @staticmethod
    def forward(
        ctx: Any,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        mask4: Tensor | None,
        is_causal: bool,
        dropout_p: float,
        scale: float,
        seed: int,
        block_q: int,
        block_k: int,
    ) -> Tensor:
        out, lse = _forward(q, k, v, mask4, is_causal, dropout_p, scale, seed, block_q, block_k)
        ctx.save_for_backward(q, k, v, out, lse, mask4)
        ctx.options = (is_causal, dropout_p, scale, seed, block_q, block_k)
        return out

    @staticmethod
    @once_differentiable  # no double backward: a clear error instead of wrong second grads
    def backward(ctx: Any, dout: Tensor) -> tuple[Tensor | None, ...]:
        q, k, v, out, lse, mask4 = ctx.saved_tensors
        is_causal, dropout_p, scale, seed, block_q, block_k = ctx.options
        B, H, T, D = q.shape
        H_kv, S, Dv = k.shape[1], k.shape[2], v.shape[-1]
        n_rep, offset = H // H_kv, S - T
        cdt = lse.dtype
        dq = torch.zeros(q.shape, dtype=cdt, device=q.device)
        dk = torch.zeros(k.shape, dtype=cdt, device=k.device)
        dv = torch.zeros(v.shape, dtype=cdt, device=v.device)
        # delta_i = sum_j P_ij dP_ij = dO_i . O_i (holds with dropout too, as O has it built in)
        delta = (dout.to(cdt) * out.to(cdt)).sum(dim=-1, keepdim=True)  # (B, H, T, 1)
        for qi, qs in enumerate(range(0, T, block_q)):
            qe = min(qs + block_q, T)
            q_blk, do_blk = q[:, :, qs:qe].to(cdt), dout[:, :, qs:qe].to(cdt)  # (B, H, tq, ·)
            lse_blk, delta_blk = lse[:, :, qs:qe], delta[:, :, qs:qe]  # (B, H, tq, 1)
            for kj, ks, ke in _key_blocks(qs, qe, S, block_k, is_causal, offset):
                k_blk = repeat_kv(k[:, :, ks:ke], n_rep).to(cdt)  # (B, H, tk, D)
                v_blk = repeat_kv(v[:, :, ks:ke], n_rep).to(cdt)  # (B, H, tk, Dv)
                tile = (qs, qe), (ks, ke)
                s, _ = _tile_scores(q_blk, k_blk, mask4, is_causal, offset, *tile, scale)
                p = torch.exp(s - lse_blk)  # (B, H, tq, tk): the normalised weights
                dp = do_blk @ v_blk.transpose(-2, -1)  # (B, H, tq, tk)
                p_used = p
                if dropout_p > 0.0:
                    z = _dropout_scale(seed, qi, kj, tuple(p.shape), dropout_p, p)
                    p_used, dp = p * z, dp * z
                ds = p * (dp - delta_blk) * scale  # (B, H, tq, tk): softmax backward
                dq[:, :, qs:qe] += ds @ k_blk  # (B, H, tq, D)
                dk_blk = ds.transpose(-2, -1) @ q_blk  # (B, H, tk, D)
                dv_blk = p_used.transpose(-2, -1) @ do_blk  # (B, H, tk, Dv)
                # Query heads sharing a kv head (GQA) add their gradients.
                dk[:, :, ks:ke] += dk_blk.view(B, H_kv, n_rep, ke - ks, D).sum(dim=2)
                dv[:, :, ks:ke] += dv_blk.view(B, H_kv, n_rep, ke - ks, Dv).sum(dim=2)
        grads = (dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype))
        return (*grads, None, None, None, None, None, None, None)


def chunked_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    *,
    mask: Tensor | None = None,
    is_causal: bool = False,
    dropout_p: float = 0.0,
    scale: float | None = None,
    block_q: int = DEFAULT_BLOCK_Q,
    block_k: int = DEFAULT_BLOCK_K,
) -> Tensor:
    """Exact eq. (1) attention computed tile by tile with the online softmax.

    Args:
        q: queries. k: keys. v: values.
        mask: bool (True = may attend) or additive float mask, broadcastable to (B, H, T, S).
        is_causal: causal mask, bottom-right aligned when T != S; may be combined with ``mask``.
        dropout_p: dropout on the attention weights (see the module docstring for how).
        scale: score scale; default ``1 / sqrt(D)``.
        block_q: query rows per tile. block_k: keys per tile.

    Shapes:
        q ``(B, H, T, D)``, k ``(B, H_kv, S, D)``, v ``(B, H_kv, S, Dv)`` -> ``(B, H, T, Dv)``.

    Raises:
        ValueError / TypeError: on bad shapes, dtypes, masks, block sizes or ``dropout_p``.
    """
    B, H, _, T, S, D = check_qkv(q, k, v, scale=scale)
    if not 0.0 <= dropout_p < 1.0:
        raise ValueError(f"dropout_p must be in [0, 1), got {dropout_p}")
    if block_q < 1 or block_k < 1:
        raise ValueError(f"block sizes must be positive, got block_q={block_q}, block_k={block_k}")
    if mask is not None:
        check_mask(mask, B, H, T, S)
    mask4 = None if mask is None else _as_4d(mask)
    scale = 1.0 / math.sqrt(D) if scale is None else scale
    seed = int(torch.randint(0, 2**31 - 1, ()).item()) if dropout_p > 0.0 else 0
    if mask4 is not None and mask4.requires_grad:
        # A learned additive bias: let autograd differentiate the blocked forward (O(T·S) saved).
        out, _ = _forward(q, k, v, mask4, is_causal, dropout_p, scale, seed, block_q, block_k)
        return out
    out = _ChunkedAttentionFn.apply(
        q, k, v, mask4, is_causal, dropout_p, scale, seed, block_q, block_k
    )
    return out


class ChunkedAttention:
    """The ``"chunked"`` backend with chosen tile sizes (a callable with the backend signature).

    Args:
        block_q: query rows per tile. block_k: keys per tile. Larger tiles mean fewer Python
            iterations and more memory: ``B·H·block_q·block_k`` floats per live tile.

    Raises:
        ValueError: if a block size is not a positive integer.
    """

    __name__ = "chunked"

    def __init__(self, block_q: int = DEFAULT_BLOCK_Q, block_k: int = DEFAULT_BLOCK_K) -> None:
        if int(block_q) != block_q or int(block_k) != block_k or block_q < 1 or block_k < 1:
            raise ValueError(
                f"block sizes must be positive integers, got block_q={block_q}, block_k={block_k}"
            )
        self.block_q, self.block_k = int(block_q), int(block_k)

    def __call__(
        self,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        *,
        mask: Tensor | None = None,
        is_causal: bool = False,
        dropout_p: float = 0.0,
        scale: float | None = None,
    ) -> Tensor:
        return chunked_attention(
            q,
            k,
            v,
            mask=mask,
            is_causal=is_causal,
            dropout_p=dropout_p,
            scale=scale,
            block_q=self.block_q,
            block_k=self.block_k,
        )

    def __repr__(self) -> str:
        return f"ChunkedAttention(block_q={self.block_q}, block_k={self.block_k})"


ATTENTION_BACKENDS.add("chunked", ChunkedAttention())
ATTENTION_BACKEND_FACTORIES.add("chunked", ChunkedAttention)

__all__ = ["DEFAULT_BLOCK_K", "DEFAULT_BLOCK_Q", "ChunkedAttention", "chunked_attention"]
