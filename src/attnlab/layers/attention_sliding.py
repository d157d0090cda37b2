"""Sliding-window (local) attention with optional global tokens, in time and memory linear in n.

The sparse pattern of Longformer (Beltagy et al., 2020) and BigBird (Zaheer et al., 2020), also
Mistral's sliding window: instead of all S keys, the query at position ``p`` attends to

- causal (``is_causal=True``): the ``window`` most recent keys, itself included,
  ``p - window < j <= p``;
- bidirectional: the keys within ``window // 2`` on either side, ``|j - p| <= window // 2``;
- plus *global tokens* (positions given once, e.g. ``[0]`` for a CLS token), which attend to every
  key and are attended to by every query. Causality still holds when ``is_causal``: a global token
  sees only earlier keys, and only later queries see it.

How it stays linear: queries are cut into blocks of ``block`` rows. All queries of block ``b`` need
only keys from one contiguous span of ``W = block + window - 1`` (causal) or
``block + 2·(window // 2)`` keys, so ``Tensor.unfold`` turns the (zero-padded) keys into one span
per block -- a strided view, no copy -- and a single batched matmul gives
``(n / block) x block x W`` scores: O(n·W), never ``n x n``. The band condition, padding and
masks are applied inside the span. Global keys add ``G`` score columns to every row, and the
rows of global queries are computed in full (``G x S``), so the cost is O(n·(W + G)).

Shapes: B batch, H query heads, H_kv key/value heads, T queries, S keys, D head dim, Dv value
dim, N number of query blocks, W span length, G global tokens.
Masks (the whole library): bool True = may attend, float additive (entries at or below
``finfo.min`` count as masked), broadcastable to (B, H, T, S); they are gathered into the band.
Queries are aligned to keys bottom-right: query ``i`` sits at position ``p = i + S - T`` (cached
decoding), in both modes. A query that may attend to nothing returns zeros. Dropout drops the band
weights like the math path drops the full weights.

Deviations from Longformer: one window for all layers and heads (per-layer windows are a model
choice: build one backend per layer), no dilation, and global tokens are given as absolute key
positions, so a KV cache that drops old keys must keep them itself.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import cast

import torch
import torch.nn.functional as F
from torch import Tensor

from attnlab.layers.attention import check_qkv, scaled_dot_product_attention
from attnlab.layers.attention_backends import ATTENTION_BACKEND_FACTORIES, ATTENTION_BACKENDS
from attnlab.layers.masks import check_mask

DEFAULT_WINDOW = 256


def _band_limits(window: int, is_causal: bool) -> tuple[int, int]:
    """Smallest and largest key offset ``j - p`` a query may see inside the band."""
    return (-(window - 1), 0) if is_causal else (-(window // 2), window // 2)


def _global_positions(global_tokens: Sequence[int] | Tensor | None) -> tuple[int, ...]:
    """Sorted unique positions of the global tokens.

    Raises:
        ValueError: for negative or non-integer positions.
    """
    if global_tokens is None:
        return ()
    values = (
        global_tokens.flatten().tolist()
        if isinstance(global_tokens, Tensor)
        else list(global_tokens)
    )
    for g in values:
        if isinstance(g, bool) or int(g) != g or g < 0:
            raise ValueError(f"global_tokens must be non-negative integer positions, got {values}")
    return tuple(sorted({int(g) for g in values}))


def sliding_window_mask(
    T: int,
    S: int | None = None,
    *,
    window: int,
    is_causal: bool = True,
    global_tokens: Sequence[int] | Tensor | None = None,
    device: torch.device | str | None = None,
) -> Tensor:
    """The dense boolean mask equivalent to :func:`sliding_window_attention` (for tests, plots).

    Shapes:
        returns ``(T, S)`` bool, True where query ``i`` (position ``i + S - T``) may attend key
        ``j``. It is O(T·S): for reference only.
    """
    S = T if S is None else S
    if T == 0 or S == 0:
        return torch.zeros(T, S, dtype=torch.bool, device=device)
    lo, hi = _band_limits(window, is_causal)
    p = torch.arange(T, device=device).unsqueeze(1) + (S - T)  # (T, 1) query positions
    j = torch.arange(S, device=device).unsqueeze(0)  # (1, S)
    keep = (j - p >= lo) & (j - p <= hi)  # (T, S)
    glob = torch.zeros(S, dtype=torch.bool, device=device)  # (S,)
    positions = [g for g in _global_positions(global_tokens) if g < S]
    glob[positions] = True
    keep = keep | glob.unsqueeze(0) | glob[p.clamp(0, max(S - 1, 0))] & (p >= 0) & (p < S)
    if is_causal:
        keep = keep & (j <= p)
    return keep


def _shift_keys(x: Tensor, start: int, length: int) -> Tensor:
    """``out[..., t, :] = x[..., start + t, :]`` for ``t < length``, zeros outside ``x``.

    Shapes:
        ``(B, H_kv, S, D)`` -> ``(B, H_kv, length, D)``.
    """
    S = x.shape[2]
    left, right = -start, length - (S - start)
    if start >= S or start + length <= 0:  # no overlap at all
        return x.new_zeros(x.shape[0], x.shape[1], length, x.shape[3])
    return F.pad(x, (0, 0, left, right))  # negative padding crops


def _rows_of(mask4: Tensor, index: Tensor) -> Tensor:
    """Select mask rows (queries) by index, keeping size-1 (broadcast) query dims.

    Shapes:
        ``(b, h, T|1, s)``, index ``(n,)`` -> ``(b, h, n|1, s)``.
    """
    return mask4 if mask4.shape[2] == 1 else mask4.index_select(2, index)


def _heads_split(x: Tensor, H_kv: int, n_rep: int) -> Tensor:
    """View a head dim of size H (or 1) as ``(H_kv, n_rep)`` (or ``(1, 1)``) for GQA broadcasting.

    Shapes:
        ``(b, H|1, *rest)`` -> ``(b, H_kv|1, n_rep|1, *rest)``.
    """
    if x.shape[1] == 1:
        return x.unsqueeze(2)
    return x.view(x.shape[0], H_kv, n_rep, *x.shape[2:])


def _softmax_keep(scores: Tensor, keep: Tensor, biased: bool) -> Tensor:
    """The math path's masked softmax: masked keys get weight 0, so rows with no key are 0.

    ``biased``: an additive mask was added, so scores may have reached -inf (clamped back).
    Without one, a row whose every kept score is -inf (an inf in q or k) is NaN, as on the math
    path: its weights are undefined.
    """
    neg = torch.finfo(scores.dtype).min
    scores = scores.masked_fill(~keep, -math.inf)
    undefined = None
    if not biased and scores.shape[-1]:  # a row max, not a bool .all(): cheap, finds -inf rows
        undefined = torch.isneginf(scores.amax(dim=-1, keepdim=True)) & keep.any(
            dim=-1, keepdim=True
        )
    scores = scores.clamp_min(neg)  # masked keys at finfo.min
    if undefined is not None:  # before the softmax: no second band-sized tensor for autograd
        scores = scores.masked_fill(undefined, math.nan)
    return torch.softmax(scores, dim=-1).masked_fill(~keep, 0.0)


def _split_mask(mask: Tensor | None) -> tuple[Tensor | None, Tensor | None]:
    """A mask as (bool keep, float bias): floats keep entries above ``finfo.min``."""
    if mask is None:
        return None, None
    if mask.dtype == torch.bool:
        return mask, None
    return mask > torch.finfo(mask.dtype).min, mask


def sliding_window_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    *,
    window: int,
    global_tokens: Sequence[int] | Tensor | None = None,
    mask: Tensor | None = None,
    is_causal: bool = False,
    dropout_p: float = 0.0,
    scale: float | None = None,
    block_size: int | None = None,
) -> Tensor:
    """Attention restricted to a sliding window (+ global tokens), computed band by band.

    Args:
        q: queries. k: keys. v: values.
        window: keys per query: the ``window`` most recent (causal) or ``window // 2`` each side.
        global_tokens: key positions that attend everywhere and are attended by all.
        mask: bool (True = may attend) or additive float mask, broadcastable to (B, H, T, S);
            applied on top of the window.
        is_causal: causal window (bottom-right aligned when T != S) instead of a centred one.
        dropout_p: dropout on the attention weights.
        scale: score scale; default ``1 / sqrt(D)``.
        block_size: query rows per block; default ``clamp(window, 16, 64)``.

    Shapes:
        q ``(B, H, T, D)``, k ``(B, H_kv, S, D)``, v ``(B, H_kv, S, Dv)`` -> ``(B, H, T, Dv)``.

    Raises:
        ValueError / TypeError: on bad shapes, dtypes, masks, window, block size, global tokens
            or ``dropout_p``.
    """
    B, H, H_kv, T, S, D = check_qkv(q, k, v, scale=scale)
    block = _check_args(window, dropout_p, block_size, mask, (B, H, T, S))
    n_rep, Dv, offset = H // H_kv, v.shape[-1], S - T
    if T == 0 or S == 0:  # no scores: zeros (S = 0) or an empty output, as the math path gives
        return cast(Tensor, scaled_dot_product_attention(q, k, v))
    scale = 1.0 / math.sqrt(D) if scale is None else scale
    cdt = torch.promote_types(q.dtype, torch.float32)  # scores and softmax in >= float32
    lo, hi = _band_limits(int(window), is_causal)
    glob = [g for g in _global_positions(global_tokens) if g < S]
    mask_keep, mask_bias = _split_mask(None if mask is None else _as_4d(mask))
    dev = q.device

    # Band: query block n holds rows [n·block, (n+1)·block) and sees keys [start + n·block, +W).
    N = -(-T // block)
    W = block + hi - lo
    start = offset + lo  # key index of span slot 0 of block 0
    span_len = (N - 1) * block + W
    k_span = _shift_keys(k.to(cdt), start, span_len).unfold(2, W, block)  # (B, H_kv, N, D, W)
    v_span = _shift_keys(v, start, span_len).unfold(2, W, block)  # (B, H_kv, N, Dv, W)
    q_blk = F.pad(q.to(cdt) * scale, (0, 0, 0, N * block - T))  # scaled once: n·D, not n·W
    q_blk = q_blk.reshape(B, H_kv, n_rep, N, block, D)
    scores = torch.einsum("bgrnqd,bgndw->bgrnqw", q_blk, k_span)  # (B, H_kv, r, N, block, W)

    i = torch.arange(N * block, device=dev).view(N, block, 1)  # (N, block, 1) query index
    j = start + torch.arange(N, device=dev).view(N, 1, 1) * block + torch.arange(W, device=dev)
    rel = j - (i + offset)  # (N, block, W): key position minus query position
    keep = (rel >= lo) & (rel <= hi) & (j >= 0) & (j < S) & (i < T)  # (N, block, W)
    cols = j.clamp(0, S - 1)  # (N, 1, W) key index of each span slot
    if glob:  # global keys are served by their own columns below, not twice
        is_glob = torch.zeros(S, dtype=torch.bool, device=dev)  # (S,)
        is_glob[glob] = True
        keep = keep & ~is_glob[cols]
    rows = i.view(-1).clamp(max=T - 1)  # (N·block,) query index of each padded row
    scores, keep = _apply_mask(scores, keep, mask_keep, mask_bias, rows, cols, N, block, n_rep)

    if glob:  # global keys: G extra score columns for every query
        g_idx = torch.tensor(glob, device=dev)  # (G,)
        v_g = v[:, :, g_idx]  # (B, H_kv, G, Dv)
        g_scores = torch.einsum("bgrnqd,bgkd->bgrnqk", q_blk, k[:, :, g_idx].to(cdt))
        g_keep = (i < T).expand(N, block, len(glob))  # (N, block, G)
        if is_causal:
            g_keep = g_keep & (g_idx <= i + offset)
        g_scores, g_keep = _apply_mask(
            g_scores, g_keep, mask_keep, mask_bias, rows, g_idx.view(1, 1, -1), N, block, n_rep
        )
        scores = torch.cat([scores, g_scores], dim=-1)  # (B, H_kv, r, N, block, W + G)
        keep = _cat_last(keep, g_keep)

    weights = _softmax_keep(scores, keep, mask_bias is not None).to(v.dtype)
    if dropout_p > 0.0:
        weights = F.dropout(weights, p=dropout_p)
    out = torch.einsum("bgrnqw,bgndw->bgrnqd", weights[..., :W], v_span)  # (B,H_kv,r,N,blk,Dv)
    if glob:
        out = out + torch.einsum("bgrnqk,bgkd->bgrnqd", weights[..., W:], v_g)
    out = out.reshape(B, H, N * block, Dv)[:, :, :T]  # (B, H, T, Dv)

    # Global queries attend to every key: their rows are recomputed in full (G x S).
    q_rows = [g - offset for g in glob if 0 <= g - offset < T]
    if q_rows:
        r_idx = torch.tensor(q_rows, device=dev)  # (Gq,)
        full = _full_rows(q, k, r_idx, offset, is_causal, mask_keep, mask_bias, scale, cdt)
        out = out.index_copy(2, r_idx, _weighted_rows(full, v, dropout_p))
    return out


def _weighted_rows(full: Tensor, v: Tensor, dropout_p: float) -> Tensor:
    """The outputs of the global query rows from their full weights.

    Shapes:
        full ``(B, H_kv, r, Gq, S)``, v ``(B, H_kv, S, Dv)`` -> ``(B, H_kv * r, Gq, Dv)``.
    """
    full = full.to(v.dtype)
    if dropout_p > 0.0:
        full = F.dropout(full, p=dropout_p)
    rows_out = full @ v.unsqueeze(2)  # (B, H_kv, r, Gq, Dv)
    B, H_kv, r, Gq, Dv = rows_out.shape
    return rows_out.reshape(B, H_kv * r, Gq, Dv)


def _check_args(
    window: int,
    dropout_p: float,
    block_size: int | None,
    mask: Tensor | None,
    dims: tuple[int, int, int, int],
) -> int:
    """Validate :func:`sliding_window_attention`'s arguments; return the query block size."""
    if isinstance(window, bool) or int(window) != window or window < 1:
        raise ValueError(f"window must be a positive integer, got {window!r}")
    if not 0.0 <= dropout_p < 1.0:
        raise ValueError(f"dropout_p must be in [0, 1), got {dropout_p}")
    if mask is not None:
        check_mask(mask, *dims)
    block = max(16, min(64, int(window))) if block_size is None else int(block_size)
    if block < 1:
        raise ValueError(f"block_size must be positive, got {block_size}")
    return block


def _as_4d(mask: Tensor) -> Tensor:
    """Left-pad a mask's shape with ones to 4 dims (a view). Returns ``(b, h, t, s)``."""
    return mask.reshape((1,) * (4 - mask.dim()) + tuple(mask.shape))


def _cat_last(a: Tensor, b: Tensor) -> Tensor:
    """Concatenate along the last dim after broadcasting all other dims."""
    lead = torch.broadcast_shapes(a.shape[:-1], b.shape[:-1])
    return torch.cat([a.expand(*lead, a.shape[-1]), b.expand(*lead, b.shape[-1])], dim=-1)


def _apply_mask(
    scores: Tensor,
    keep: Tensor,
    mask_keep: Tensor | None,
    mask_bias: Tensor | None,
    rows: Tensor,
    cols: Tensor,
    N: int,
    block: int,
    n_rep: int,
) -> tuple[Tensor, Tensor]:
    """Add the user's mask, gathered into the blocked layout, to scores and keep.

    Shapes:
        scores ``(B, H_kv, r, N, block, C)``, keep broadcastable to it; rows ``(N·block,)``;
        cols ``(N|1, 1, C)`` -> the same shapes (keep possibly broadcast wider).
    """
    H_kv = scores.shape[1]
    if mask_keep is not None:
        keep = keep & _heads_split(_band(mask_keep, rows, cols, N, block), H_kv, n_rep)
    if mask_bias is not None:
        scores = scores + _heads_split(_band(mask_bias, rows, cols, N, block), H_kv, n_rep).to(
            scores.dtype
        )
    return scores, keep


def _band(mask: Tensor, rows: Tensor, cols: Tensor, N: int, block: int) -> Tensor:
    """Gather a ``(b, h, T|1, S|1)`` mask into the blocked band layout.

    Args:
        rows: ``(N·block,)`` query index of each padded row. cols: ``(N|1, 1, C)`` key indices.

    Shapes:
        returns ``(b, h, N|1, block|1, C|1)``.
    """
    b, h, t, s = mask.shape
    m = mask.view(b, h, 1, 1, s) if t == 1 else mask.index_select(2, rows).view(b, h, N, block, s)
    if s == 1:
        return m
    n_out = max(m.shape[2], cols.shape[0])
    idx = cols.expand(n_out, m.shape[3], cols.shape[-1]).expand(b, h, -1, -1, -1)
    return torch.gather(m.expand(b, h, n_out, m.shape[3], s), 4, idx)  # (b, h, N|1, blk|1, C)


def _full_rows(
    q: Tensor,
    k: Tensor,
    r_idx: Tensor,
    offset: int,
    is_causal: bool,
    mask_keep: Tensor | None,
    mask_bias: Tensor | None,
    scale: float,
    cdt: torch.dtype,
) -> Tensor:
    """Softmax weights of the selected query rows over all keys.

    Shapes:
        q ``(B, H, T, D)``, k ``(B, H_kv, S, D)``, r_idx ``(Gq,)`` -> ``(B, H_kv, r, Gq, S)``.
    """
    B, H, _, D = q.shape
    H_kv, S = k.shape[1], k.shape[2]
    n_rep = H // H_kv
    q_r = q[:, :, r_idx].to(cdt).reshape(B, H_kv, n_rep, len(r_idx), D)  # (B, H_kv, r, Gq, D)
    scores = (q_r @ k.to(cdt).unsqueeze(2).transpose(-2, -1)) * scale  # (B, H_kv, r, Gq, S)
    keep = torch.ones(len(r_idx), S, dtype=torch.bool, device=q.device)  # (Gq, S)
    if is_causal:
        keep = torch.arange(S, device=q.device) <= (r_idx + offset).unsqueeze(1)
    if mask_keep is not None:
        keep = keep & _heads_split(_rows_of(mask_keep, r_idx), H_kv, n_rep)
    if mask_bias is not None:
        scores = scores + _heads_split(_rows_of(mask_bias, r_idx), H_kv, n_rep).to(cdt)
    return _softmax_keep(scores, keep, mask_bias is not None)


class SlidingWindowAttention:
    """The ``"sliding_window"`` backend for one window (a callable with the backend signature).

    Args:
        window: keys per query (see :func:`sliding_window_attention`).
        global_tokens: key positions that attend everywhere and are attended by all.
        block_size: query rows per block (default ``clamp(window, 16, 64)``).

    Attributes:
        window: exposed so a KV cache can keep only the last ``window`` keys.

    Raises:
        ValueError: for a non-positive window or block size, or bad global tokens.
    """

    __name__ = "sliding_window"

    def __init__(
        self,
        window: int = DEFAULT_WINDOW,
        global_tokens: Sequence[int] | Tensor | None = None,
        block_size: int | None = None,
    ) -> None:
        if isinstance(window, bool) or int(window) != window or window < 1:
            raise ValueError(f"window must be a positive integer, got {window!r}")
        if block_size is not None and (int(block_size) != block_size or block_size < 1):
            raise ValueError(f"block_size must be a positive integer, got {block_size!r}")
        self.window = int(window)
        self.global_tokens = _global_positions(global_tokens)
        self.block_size = block_size

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
        return sliding_window_attention(
            q,
            k,
            v,
            window=self.window,
            global_tokens=self.global_tokens,
            mask=mask,
            is_causal=is_causal,
            dropout_p=dropout_p,
            scale=scale,
            block_size=self.block_size,
        )

    def dense_mask(
        self, T: int, S: int | None = None, *, is_causal: bool, device: torch.device | None = None
    ) -> Tensor:
        """This backend's pattern as a dense ``(T, S)`` bool mask, e.g. for the math path when
        attention weights are needed (see :func:`sliding_window_mask`)."""
        return sliding_window_mask(
            T,
            S,
            window=self.window,
            is_causal=is_causal,
            global_tokens=self.global_tokens,
            device=device,
        )

    def __repr__(self) -> str:
        return (
            f"SlidingWindowAttention(window={self.window}, "
            f"global_tokens={list(self.global_tokens)}, block_size={self.block_size})"
        )


ATTENTION_BACKENDS.add("sliding_window", SlidingWindowAttention())
ATTENTION_BACKEND_FACTORIES.add("sliding_window", SlidingWindowAttention)

__all__ = [
    "DEFAULT_WINDOW",
    "SlidingWindowAttention",
    "sliding_window_attention",
    "sliding_window_mask",
]
