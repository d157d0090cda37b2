"""Scaled dot-product attention, eq. (1) of "Attention Is All You Need" (§3.2.1).

    Attention(Q, K, V) = softmax(Q Kᵀ / sqrt(d_k)) V

written plainly: this is the readable "math" path, the reference every other backend is tested
against, and the only one that can return the attention weights.

Shapes: B batch, H query heads, H_kv key/value heads (H % H_kv == 0; grouped-query attention when
H_kv < H), T queries, S keys, D head dim (Dv the value head dim, usually D).

Mask convention (the whole library): boolean True = may attend; floating masks are additive;
both broadcast to (B, H, T, S). ``is_causal`` is bottom-right aligned when T != S.

Deviations from the paper: masked scores are filled with ``torch.finfo(dtype).min`` rather than
-inf, the softmax runs in float32 for half-precision inputs, and a query row with nothing to attend
to returns zeros (finite gradients) instead of NaN.

Non-finite inputs (every backend, tested in tests/hardening/test_nonfinite_attention.py): a NaN or
inf in q, k or v is never turned into a finite number. Every output row that may attend to the
bad key or value, or whose query is bad, is non-finite (NaN, or inf for an inf value) unless the
bad entry's score is -inf, which weighs that key 0 exactly as a mask would; a row whose every
score is -inf has undefined weights and is NaN. Rows that cannot see the bad entry are exact, or
non-finite on some backends (the math path multiplies masked weights of 0 by the values, and
0·inf is NaN; block backends skip masked blocks), as between PyTorch's own kernels. The one
exception is ``"sdpa"`` for a row whose every visible *key* is infinite (PyTorch's kernel returns
zeros; checking would cost a pass over all keys, the whole KV cache in every decoding step).
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor

from attnlab.layers.masks import causal_mask, check_mask


def check_scale(scale: object) -> None:
    """Refuse a score ``scale`` that is not ``None`` (``1 / sqrt(D)``) or a finite positive
    number: NaN or inf would make every backend's output NaN or zeros (or, on the linear
    backend's ``"elu"`` features, be ignored), and 0 or a negative scale is no softmax
    temperature any paper uses.

    Raises:
        TypeError: for a scale that is not a real number (a tensor, a string, a bool).
        ValueError: for NaN, an infinity, 0 or a negative number.
    """
    if scale is None:
        return
    expected = "a finite positive number, or None for 1/sqrt(D)"
    if isinstance(scale, bool) or not isinstance(scale, numbers.Real):
        raise TypeError(f"scale must be {expected}; got {scale!r} ({type(scale).__name__})")
    value = float(scale)
    if not (math.isfinite(value) and value > 0):
        raise ValueError(f"scale must be {expected}; got {scale!r}")


def check_qkv(
    q: Tensor, k: Tensor, v: Tensor, *, scale: object = None
) -> tuple[int, int, int, int, int, int]:
    """Validate q/k/v shapes (and the score ``scale``, :func:`check_scale`) for attention and
    return ``(B, H, H_kv, T, S, D)``. Every backend calls it first: it is the one boundary they
    share.

    Raises:
        ValueError: on wrong ranks, mismatched batch/head-dim/key lengths, a head dim of 0,
            ``H % H_kv != 0``, tensors on different devices, or a bad ``scale``.
        TypeError: if the dtypes differ or are not floating point, or ``scale`` is no number.
    """
    for name, t in (("q", q), ("k", k), ("v", v)):
        if t.dim() != 4:
            raise ValueError(f"{name} must have 4 dims (B, H, L, D), got shape {tuple(t.shape)}")
        if not t.is_floating_point():
            raise TypeError(f"{name} must be floating point, got dtype {t.dtype}")
    if not (q.dtype == k.dtype == v.dtype):
        raise TypeError(f"q, k, v dtypes differ: {q.dtype}, {k.dtype}, {v.dtype}")
    if not (q.device == k.device == v.device):
        raise ValueError(f"q, k, v are on different devices: {q.device}, {k.device}, {v.device}")
    B, H, T, D = q.shape
    Bk, H_kv, S, Dk = k.shape
    if Bk != B or v.shape[0] != B:
        raise ValueError(
            f"batch sizes differ: q {B}, k {Bk}, v {v.shape[0]} (shapes {tuple(q.shape)}, "
            f"{tuple(k.shape)}, {tuple(v.shape)})"
        )
    if Dk != D:
        raise ValueError(f"q and k head dims differ: {D} vs {Dk}")
    if v.shape[1] != H_kv or v.shape[2] != S:
        raise ValueError(f"k and v must share (H_kv, S): k {tuple(k.shape)}, v {tuple(v.shape)}")
    if H_kv == 0 or H % H_kv != 0:
        raise ValueError(f"query heads H={H} must be a multiple of key/value heads H_kv={H_kv}")
    if D == 0 or v.shape[-1] == 0:  # 1/sqrt(0), and reductions over an empty head dim
        raise ValueError(
            f"the head dims must be positive, got D={D} (q {tuple(q.shape)}, k {tuple(k.shape)})"
            f" and Dv={v.shape[-1]} (v {tuple(v.shape)})"
        )
    check_scale(scale)
    return B, H, H_kv, T, S, D


def repeat_kv(x: Tensor, n_rep: int) -> Tensor:
    """Repeat key/value heads for grouped-query attention.

    Shapes:
        ``(B, H_kv, S, D)`` -> ``(B, H_kv * n_rep, S, D)``; query head ``h`` uses kv head
        ``h // n_rep``.
    """
    if n_rep == 1:
        return x
    B, H_kv, S, D = x.shape
    x = x[:, :, None].expand(B, H_kv, n_rep, S, D)  # (B, H_kv, n_rep, S, D)
    return x.reshape(B, H_kv * n_rep, S, D)  # (B, H, S, D)


def _autocasting(device_type: str) -> bool:
    """Whether autocast is on for ``device_type`` (False for types autocast does not know, such
    as ``meta``)."""
    try:
        return torch.is_autocast_enabled(device_type)
    except RuntimeError:  # "unknown device type for autocast"
        return False


def scaled_dot_product_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    *,
    mask: Tensor | None = None,
    is_causal: bool = False,
    dropout_p: float = 0.0,
    scale: float | None = None,
    return_weights: bool = False,
    hook: Callable[[str, Tensor], Tensor] | None = None,
) -> Tensor | tuple[Tensor, Tensor]:
    """Eq. (1): ``softmax(q kᵀ · scale + mask) v``, the readable reference path.

    Args:
        q: queries. k: keys. v: values.
        mask: bool (True = may attend) or additive float mask, broadcastable to (B, H, T, S).
            Float entries at -inf or ``finfo(mask.dtype).min`` count as masked keys.
        is_causal: also apply a causal mask, bottom-right aligned when T != S
            (query i sees keys j <= i + S - T). May be combined with ``mask``.
        dropout_p: dropout on the attention weights (pass 0.0 in eval).
        scale: score scale, a finite positive number; default ``1 / sqrt(D)``.
        return_weights: also return the attention weights (before dropout).
        hook: called as ``hook("scores", scores)`` (scaled and masked, before the softmax, in at
            least float32) and ``hook("weights", weights)`` (after it); each may return a
            replacement, which the rest of the computation uses (:mod:`attnlab.inspect`).

    Shapes:
        q ``(B, H, T, D)``, k ``(B, H_kv, S, D)``, v ``(B, H_kv, S, Dv)`` ->
        out ``(B, H, T, Dv)`` and weights ``(B, H, T, S)``.

    Raises:
        ValueError / TypeError: on bad shapes, dtypes, masks, or ``dropout_p`` outside [0, 1).
    """
    B, H, H_kv, T, S, D = check_qkv(q, k, v, scale=scale)
    if not 0.0 <= dropout_p < 1.0:
        raise ValueError(f"dropout_p must be in [0, 1), got {dropout_p}")
    if mask is not None:
        check_mask(mask, B, H, T, S)
    k = repeat_kv(k, H // H_kv)  # (B, H, S, D)
    v = repeat_kv(v, H // H_kv)  # (B, H, S, Dv)
    scale = 1.0 / math.sqrt(D) if scale is None else scale

    # Scores in at least float32: half-precision scores overflow for large logits. Under
    # autocast the product itself runs in 16 bits (casting q and k up first would only be cast
    # back) and its result is cast up, so the masking and the softmax are float32 there too.
    compute_dtype = torch.promote_types(q.dtype, torch.float32)
    if _autocasting(q.device.type):
        scores = (q @ k.transpose(-2, -1)).to(compute_dtype) * scale  # (B, H, T, S)
    else:
        scores = (q.to(compute_dtype) @ k.to(compute_dtype).transpose(-2, -1)) * scale

    keep: Tensor | None = None  # bool, broadcastable to (B, H, T, S): True = may attend
    if is_causal:
        keep = causal_mask(T, S, device=q.device)  # (T, S)
    if mask is not None:
        if mask.dtype == torch.bool:
            keep = mask if keep is None else keep & mask
        else:
            # Additive mask: keys at -inf or at the fill value finfo(mask.dtype).min (what
            # to_additive/combine_masks write) count as masked, everything else is a bias.
            scores = scores + mask.to(compute_dtype)
            finite = mask > torch.finfo(mask.dtype).min
            keep = finite if keep is None else keep & finite
    # the scores' own dtype: CPU autocast runs the matmul above in bfloat16 whatever its inputs
    neg = torch.finfo(scores.dtype).min
    if keep is not None:
        scores = scores.masked_fill(~keep, -math.inf)
    # A row whose every key it may see scores -inf (an inf in q or k; masked keys are -inf here
    # too) has undefined weights: NaN, not the uniform row the clamp below would make. Rows the
    # masks leave without any key are zeros below. (A row max: a bool .all() cost 6% of a step.)
    if S:
        undefined = torch.isneginf(scores.amax(dim=-1, keepdim=True))  # (B, H, T, 1)
    else:  # no keys: amax has nothing to reduce, and every row is zeros below
        undefined = scores.new_zeros((*scores.shape[:-1], 1), dtype=torch.bool)
    if keep is not None:
        undefined = undefined & keep.any(dim=-1, keepdim=True)
    scores = scores.clamp_min(neg)  # masked keys at finfo.min, so the softmax never sees -inf
    # NaN scores, so NaN weights; done before the softmax, whose output autograd keeps anyway
    # (filling the weights after it would keep a second (B, H, T, S) tensor for the backward)
    scores = scores.masked_fill(undefined, math.nan)
    if hook is not None:
        scores = hook("scores", scores)

    weights = torch.softmax(scores, dim=-1)  # (B, H, T, S)
    if keep is not None:
        # A query that may attend to nothing gets all-zero weights (output 0), not a uniform row.
        weights = weights.masked_fill(~keep.any(dim=-1, keepdim=True), 0.0)
        # Masked keys get exactly zero weight even when a whole row sits at finfo.min.
        weights = weights.masked_fill(~keep, 0.0)
    weights = weights.to(q.dtype)
    if hook is not None:
        weights = hook("weights", weights)
    attn = F.dropout(weights, p=dropout_p) if dropout_p > 0.0 else weights
    out = attn @ v  # (B, H, T, Dv)
    if return_weights:
        return out, weights
    return out
