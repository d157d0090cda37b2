"""The engine of the block-sparse attention backends: a query grid, key *parts*, one softmax.

Used by :mod:`attnlab.layers.attention_sparse` (Sparse Transformer), :mod:`.attention_bigbird`
and :mod:`.attention_lsh`. Queries are laid on a grid of blocks of ``l`` rows aligned to key
positions that are multiples of ``l`` (query ``i`` sits at position ``p = i + S - T``, bottom-right
aligned). The keys a pattern gives each query come as *parts*, each a small dense tensor of scores
``(B, H_kv, r, N, l, K)``: a band of neighbouring keys (:func:`band_part`, ``Tensor.unfold``, a
view), a list of keys shared by all blocks or one list per block (:func:`list_part`, a gather), or
any other layout a backend builds (the strided pattern's residue classes). A pattern is the
*disjoint* union of its parts' masks; :func:`attend_parts` adds the user's mask (gathered into
each part), runs one softmax over the concatenated parts with the math path's rules (masked keys
weigh 0, a query with no key returns zeros, a row whose every kept score is -inf is NaN) and sums
the parts' weighted values. Nothing of size ``T x S`` is built.

Shapes: B batch, H query heads, H_kv key/value heads, r = H / H_kv, T queries, S keys, D head dim,
Dv value dim, N query blocks, l block size, K keys of a part.
Masks (the whole library): bool True = may attend, float additive (entries at or below
``finfo.min`` count as masked), broadcastable to (B, H, T, S).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, cast

import torch
import torch.nn.functional as F
from torch import Tensor

from attnlab.layers.attention import check_qkv, scaled_dot_product_attention
from attnlab.layers.masks import check_mask

# -- checks -------------------------------------------------------------------------------------


def check_int(name: str, value: Any, *, low: int, expected: str = "") -> int:
    """``value`` as an int if it is an integer ``>= low``; else ``ValueError`` naming it."""
    ok = not isinstance(value, bool) and isinstance(value, int | float) and int(value) == value
    if not ok or value < low:
        what = expected or ("a positive integer" if low == 1 else f"an integer >= {low}")
        raise ValueError(f"{name} must be {what}, got {value!r}")
    return int(value)


def check_call(
    q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, dropout_p: float, scale: float | None
) -> tuple[int, int, int, int, int, int]:
    """check_qkv, dropout and mask checks shared by the sparse backends."""
    B, H, H_kv, T, S, D = check_qkv(q, k, v, scale=scale)
    if not 0.0 <= dropout_p < 1.0:
        raise ValueError(f"dropout_p must be in [0, 1), got {dropout_p}")
    if mask is not None:
        check_mask(mask, B, H, T, S)
    return B, H, H_kv, T, S, D


# -- the engine: query grid, parts, one softmax -------------------------------------------------


@dataclass(frozen=True)
class Grid:
    """Queries laid on blocks of ``l`` rows aligned to key positions that are multiples of ``l``.

    ``pos`` ``(N, l)``: position of each grid row; ``rows`` ``(N, l)``: its query index (clamped);
    ``valid`` ``(N, l)``: a real query; ``front``: padding rows before query 0.
    """

    l: int
    N: int
    front: int
    p0: int  # position of grid row 0 (a multiple of l)
    pos: Tensor
    rows: Tensor
    valid: Tensor


def make_grid(T: int, S: int, l: int, device: torch.device) -> Grid:
    """The query grid of T queries at positions ``S - T .. S - 1`` in blocks of ``l``."""
    off = S - T
    front = off % l
    N = -(-(front + T) // l)
    pos = off - front + torch.arange(N * l, device=device).view(N, l)  # (N, l)
    idx = pos - off
    return Grid(l, N, front, off - front, pos, idx.clamp(0, T - 1), (idx >= 0) & (idx < T))


def query_grid(q: Tensor, g: Grid, H_kv: int, scale: float, cdt: torch.dtype) -> Tensor:
    """Scaled queries on the grid. Shapes: ``(B, H, T, D)`` -> ``(B, H_kv, r, N, l, D)``."""
    B, H, T, D = q.shape
    q = F.pad(q.to(cdt) * scale, (0, 0, g.front, g.N * g.l - g.front - T))  # (B, H, N·l, D)
    return q.view(B, H_kv, H // H_kv, g.N, g.l, D)


@dataclass
class Part:
    """One group of keys per query: ``scores`` ``(B, H_kv, r, N, l, K)``, the pattern's ``keep``
    (bool, broadcastable to it), ``cols`` the key index of each slot (``(N|1, l|1, K)``, clamped
    into ``[0, S)``) and ``combine``: weights of the part -> its ``(B, H_kv, r, N, l, Dv)`` output.
    """

    scores: Tensor
    keep: Tensor
    cols: Tensor
    combine: Callable[[Tensor], Tensor]


def shift_keys(x: Tensor, start: int, length: int) -> Tensor:
    """``out[..., t, :] = x[..., start + t, :]`` for ``t < length``, zeros outside ``x``.

    Shapes: ``(B, H_kv, S, D)`` -> ``(B, H_kv, length, D)``.
    """
    S = x.shape[2]
    if start >= S or start + length <= 0:
        return x.new_zeros(x.shape[0], x.shape[1], length, x.shape[3])
    return F.pad(x, (0, 0, -start, length - (S - start)))  # negative padding crops


def band_part(
    qg: Tensor,
    k: Tensor,
    v: Tensor,
    g: Grid,
    start: int,
    W: int,
    keep_fn: Callable[[Tensor, Tensor], Tensor],
) -> Part:
    """Keys ``[start + a·l, start + a·l + W)`` for query block ``a`` (a strided view, no copy).

    ``keep_fn(pos (N, l, 1), j (N, 1, W)) -> bool`` is the pattern inside the band.
    """
    S, N, l = k.shape[2], g.N, g.l
    length = (N - 1) * l + W
    k_span = shift_keys(k.to(qg.dtype), start, length).unfold(2, W, l)  # (B, H_kv, N, D, W)
    v_span = shift_keys(v, start, length).unfold(2, W, l)  # (B, H_kv, N, Dv, W)
    j = (
        start
        + torch.arange(N, device=k.device).view(N, 1, 1) * l
        + torch.arange(W, device=k.device)
    )
    keep = keep_fn(g.pos.unsqueeze(-1), j) & (j >= 0) & (j < S) & g.valid.unsqueeze(-1)
    scores = torch.einsum("bgrnqd,bgndw->bgrnqw", qg, k_span)  # (B, H_kv, r, N, l, W)
    return Part(
        scores, keep, j.clamp(0, S - 1), lambda w: torch.einsum("bgrnqw,bgndw->bgrnqd", w, v_span)
    )


def list_part(
    qg: Tensor,
    k: Tensor,
    v: Tensor,
    g: Grid,
    idx: Tensor,
    ok: Tensor,
    keep_fn: Callable[[Tensor, Tensor], Tensor],
) -> Part:
    """Keys listed by index: one list shared by all blocks (``idx`` ``(K,)``) or one per query
    block (``(N, K)``); ``ok`` marks real slots (same shape). ``keep_fn`` as for the band."""
    S = k.shape[2]
    cols = idx.clamp(0, S - 1)
    k_l, v_l = k[:, :, cols].to(qg.dtype), v[:, :, cols]  # (B, H_kv, [N,] K, D)
    shared = idx.dim() == 1
    j = idx.view(1, 1, -1) if shared else idx.unsqueeze(1)  # (1|N, 1, K)
    keep = keep_fn(g.pos.unsqueeze(-1), j) & ok.view(j.shape) & g.valid.unsqueeze(-1)
    if shared:
        scores = torch.einsum("bgrnqd,bgkd->bgrnqk", qg, k_l)  # (B, H_kv, r, N, l, K)
        return Part(
            scores, keep, cols.view(1, 1, -1), lambda w: torch.einsum("bgrnqk,bgkd->bgrnqd", w, v_l)
        )
    scores = torch.einsum("bgrnqd,bgnkd->bgrnqk", qg, k_l)  # (B, H_kv, r, N, l, K)
    return Part(
        scores, keep, cols.unsqueeze(1), lambda w: torch.einsum("bgrnqk,bgnkd->bgrnqd", w, v_l)
    )


def split_mask(mask: Tensor | None) -> tuple[Tensor | None, Tensor | None]:
    """A mask as (bool keep, float bias), 4-d: floats keep entries above ``finfo.min``."""
    if mask is None:
        return None, None
    mask = mask.reshape((1,) * (4 - mask.dim()) + tuple(mask.shape))  # (b, h, t, s)
    if mask.dtype == torch.bool:
        return mask, None
    return mask > torch.finfo(mask.dtype).min, mask


def gather_mask(m4: Tensor, rows: Tensor, cols: Tensor, H_kv: int) -> Tensor:
    """The entries ``m4[:, :, rows, cols]`` of a ``(b, h, t, s)`` mask, heads split for GQA.

    Shapes: rows ``(N, l)``, cols ``(N|1, l|1, K)`` -> ``(b, H_kv|1, r|1, N, l, K)``.
    """
    b, h, t, s = m4.shape
    R = rows.unsqueeze(-1) if t > 1 else torch.zeros(1, 1, 1, dtype=torch.long, device=m4.device)
    C = cols if s > 1 else torch.zeros(1, 1, 1, dtype=torch.long, device=m4.device)
    out = m4[:, :, R, C]  # (b, h, N|1, l|1, K|1)
    return out.unsqueeze(2) if h == 1 else out.view(b, H_kv, h // H_kv, *out.shape[2:])


def softmax_keep(scores: Tensor, keep: Tensor, biased: bool) -> Tensor:
    """The math path's masked softmax over the last dim: masked keys weigh 0, rows with no key
    are 0, and a row whose every kept score is -inf (an inf in q or k) is NaN."""
    scores = scores.masked_fill(~keep, -math.inf)
    undefined = None
    if not biased and scores.shape[-1]:
        top = scores.amax(dim=-1, keepdim=True)
        undefined = torch.isneginf(top) & keep.any(dim=-1, keepdim=True)
    scores = scores.clamp_min(torch.finfo(scores.dtype).min)
    if undefined is not None:
        scores = scores.masked_fill(undefined, math.nan)
    return torch.softmax(scores, dim=-1).masked_fill(~keep, 0.0)


def _cat_last(ts: list[Tensor]) -> Tensor:
    """Concatenate along the last dim after broadcasting all other dims."""
    lead = torch.broadcast_shapes(*(t.shape[:-1] for t in ts))
    return torch.cat([t.expand(*lead, t.shape[-1]) for t in ts], dim=-1)


def attend_parts(
    parts: list[Part],
    g: Grid,
    mask: Tensor | None,
    dropout_p: float,
    dtype: torch.dtype,
    H: int,
    T: int,
) -> Tensor:
    """One softmax over the parts' keys (plus the user's mask), then their weighted values.

    Shapes: returns ``(B, H, T, Dv)``.
    """
    H_kv = parts[0].scores.shape[1]
    mask_keep, mask_bias = split_mask(mask)
    scores, keeps = [], []
    for part in parts:
        s, keep = part.scores, part.keep
        if mask_keep is not None:
            keep = keep & gather_mask(mask_keep, g.rows, part.cols, H_kv)
        if mask_bias is not None:
            s = s + gather_mask(mask_bias, g.rows, part.cols, H_kv).to(s.dtype)
        scores.append(s)
        keeps.append(keep)
    weights = softmax_keep(torch.cat(scores, dim=-1), _cat_last(keeps), mask_bias is not None)
    weights = weights.to(dtype)
    if dropout_p > 0.0:
        weights = F.dropout(weights, p=dropout_p)
    outs, at = [], 0
    for part in parts:
        K = part.scores.shape[-1]
        outs.append(part.combine(weights[..., at : at + K]))
        at += K
    out = outs[0]
    for o in outs[1:]:  # the parts' contributions, summed in order
        out = out + o
    B, Dv = out.shape[0], out.shape[-1]
    return out.reshape(B, H, g.N * g.l, Dv)[:, :, g.front : g.front + T]  # (B, H, T, Dv)


def full_rows(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    idx: Tensor,
    *,
    mask: Tensor | None,
    is_causal: bool,
    dropout_p: float,
    scale: float,
) -> Tensor:
    """The outputs of the query rows ``idx`` attending to every key (BigBird's global queries).

    Shapes: q ``(B, H, T, D)``, idx ``(G,)`` -> ``(B, H, G, Dv)``.
    """
    T, S = q.shape[2], k.shape[2]
    m = None if mask is None else mask.reshape((1,) * (4 - mask.dim()) + tuple(mask.shape))
    if m is not None and m.shape[2] > 1:
        m = m[:, :, idx]
    if is_causal:  # bottom-right aligned: row idx sits at position idx + S - T
        cm = torch.arange(S, device=q.device) <= (idx + S - T).unsqueeze(1)  # (G, S)
        m = (
            cm
            if m is None
            else (m & cm if m.dtype == torch.bool else m.masked_fill(~cm, torch.finfo(m.dtype).min))
        )
    out = scaled_dot_product_attention(q[:, :, idx], k, v, mask=m, dropout_p=dropout_p, scale=scale)
    return cast(Tensor, out)


def empty_attention(q: Tensor, k: Tensor, v: Tensor) -> Tensor:
    """T = 0 or S = 0: the math path's answer (empty, or zeros)."""
    return cast(Tensor, scaled_dot_product_attention(q, k, v))


class SparseBackend:
    """Shared ``__call__`` plumbing: subclasses set ``_fn`` and ``_options()``."""

    __name__ = "sparse"

    def _options(self) -> dict[str, Any]:
        raise NotImplementedError

    def _fn(self, q: Tensor, k: Tensor, v: Tensor, **kw: Any) -> Tensor:
        raise NotImplementedError

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
        return self._fn(
            q,
            k,
            v,
            mask=mask,
            is_causal=is_causal,
            dropout_p=dropout_p,
            scale=scale,
            **self._options(),
        )

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in self._options().items())
        return f"{type(self).__name__}({args})"


__all__ = [
    "Grid",
    "Part",
    "SparseBackend",
    "attend_parts",
    "band_part",
    "check_call",
    "check_int",
    "empty_attention",
    "full_rows",
    "gather_mask",
    "list_part",
    "make_grid",
    "query_grid",
    "shift_keys",
    "softmax_keep",
    "split_mask",
]
