"""Attention masks: one convention for the whole library.

A boolean mask is **True where a query may attend to a key** (the polarity of
``torch.nn.functional.scaled_dot_product_attention``) and broadcasts to ``(B, H, T, S)``.
A floating-point mask is *additive*: it is added to the scores (0 keeps a key, a very negative
value removes it; ALiBi biases travel this way too).

Causal masks for ``T != S`` (a query block at the end of a longer key sequence, as in cached
decoding) are aligned to the bottom-right: query ``i`` sees keys ``j <= i + (S - T)``.

Shapes: B batch, H heads, T query length, S key length.

Deviations from the paper: the paper describes masking "by setting to -inf"; we fill with
``torch.finfo(dtype).min`` so fp16/bf16 never overflow, and return zeros for a query that may
attend to nothing (instead of the NaN that ``softmax`` of all ``-inf`` gives).
"""

from __future__ import annotations

import torch
from torch import Tensor


def causal_mask(
    T: int, S: int | None = None, *, device: torch.device | str | None = None
) -> Tensor:
    """Boolean causal mask, bottom-right aligned.

    Args:
        T: number of queries.
        S: number of keys (defaults to ``T``); must be ``>= T`` for every query to see a key.
        device: where to build it.

    Shapes:
        returns ``(T, S)`` bool, ``True`` where query ``i`` may attend key ``j``, i.e.
        ``j <= i + (S - T)``.

    Raises:
        ValueError: if ``T`` or ``S`` is negative.
    """
    S = T if S is None else S
    if T < 0 or S < 0:
        raise ValueError(f"causal_mask needs non-negative lengths, got T={T}, S={S}")
    i = torch.arange(T, device=device).unsqueeze(1)  # (T, 1)
    j = torch.arange(S, device=device).unsqueeze(0)  # (1, S)
    return j <= i + (S - T)  # (T, S)


def padding_mask_from_lengths(
    lengths: Tensor, max_len: int | None = None, *, device: torch.device | str | None = None
) -> Tensor:
    """Key padding mask from sequence lengths (real tokens first, padding after).

    Args:
        lengths: ``(B,)`` integer lengths.
        max_len: padded length ``S``; defaults to ``lengths.max()``.

    Shapes:
        returns ``(B, 1, 1, S)`` bool, ``True`` for real tokens (broadcasts over heads/queries).

    Raises:
        ValueError: if ``lengths`` is not 1-D integer, negative, or longer than ``max_len``.
    """
    if lengths.dim() != 1 or lengths.is_floating_point():
        raise ValueError(
            f"lengths must be a 1-D integer tensor, got shape {tuple(lengths.shape)} "
            f"dtype {lengths.dtype}"
        )
    S = int(lengths.max().item()) if max_len is None and lengths.numel() else (max_len or 0)
    if lengths.numel() and (int(lengths.min()) < 0 or int(lengths.max()) > S):
        raise ValueError(f"lengths must lie in [0, {S}], got {lengths.tolist()}")
    device = lengths.device if device is None else device
    pos = torch.arange(S, device=device)  # (S,)
    return (pos.unsqueeze(0) < lengths.to(device).unsqueeze(1))[:, None, None, :]  # (B,1,1,S)


def padding_mask_from_ids(ids: Tensor, pad_id: int) -> Tensor:
    """Key padding mask from token ids: ``True`` where ``ids != pad_id``.

    Shapes:
        ids ``(B, S)`` -> ``(B, 1, 1, S)`` bool.

    Raises:
        ValueError: if ``ids`` is not 2-D.
    """
    if ids.dim() != 2:
        raise ValueError(f"ids must be (B, S), got shape {tuple(ids.shape)}")
    return (ids != pad_id)[:, None, None, :]  # (B, 1, 1, S)


def as_attention_mask(mask: Tensor) -> Tensor:
    """Lift a ``(B, S)`` key mask (True = real token, as in HF's ``attention_mask``) to 4-D.

    Masks that already have 4 dims (or are 2-D ``(T, S)`` masks meant for every batch) must not
    go through this function; it is for per-sequence key masks only.

    Shapes:
        ``(B, S)`` -> ``(B, 1, 1, S)``.
    """
    if mask.dim() != 2:
        raise ValueError(f"expected a (B, S) key mask, got shape {tuple(mask.shape)}")
    if mask.dtype != torch.bool:
        mask = mask != 0
    return mask[:, None, None, :]  # (B, 1, 1, S)


def combine_masks(*masks: Tensor | None) -> Tensor | None:
    """Combine masks that must all allow a position.

    Boolean masks are AND-ed. If any mask is floating point (additive), boolean ones are turned
    into additive masks (``0`` / ``finfo.min``) and everything is summed (clamped at ``finfo.min``
    so the sum never reaches ``-inf``).

    Shapes:
        each broadcastable to a common shape; returns that broadcast shape (or ``None`` if all
        inputs are ``None``).

    Raises:
        ValueError: if the shapes do not broadcast together.
    """
    present = [m for m in masks if m is not None]
    if not present:
        return None
    try:
        torch.broadcast_shapes(*(m.shape for m in present))
    except RuntimeError:
        shapes = [tuple(m.shape) for m in present]
        raise ValueError(f"masks of shapes {shapes} do not broadcast together") from None
    float_masks = [m for m in present if m.is_floating_point()]
    if not float_masks:
        out = present[0]
        for m in present[1:]:
            out = out & m
        return out
    dtype = float_masks[0].dtype
    out_f = to_additive(present[0], dtype)
    for m in present[1:]:
        out_f = out_f + to_additive(m, dtype)
    return out_f.clamp_min(torch.finfo(dtype).min)


def to_additive(mask: Tensor, dtype: torch.dtype) -> Tensor:
    """Convert a mask to additive form in ``dtype``.

    Boolean ``True`` (may attend) -> ``0``; ``False`` -> ``torch.finfo(dtype).min``.
    Floating masks are cast to ``dtype`` unchanged.

    Raises:
        TypeError: if ``dtype`` is not a floating-point dtype.
    """
    if not dtype.is_floating_point:
        raise TypeError(f"an additive mask needs a floating-point dtype, got {dtype}")
    if mask.dtype == torch.bool:
        zero = torch.zeros((), dtype=dtype, device=mask.device)
        neg = torch.full((), torch.finfo(dtype).min, dtype=dtype, device=mask.device)
        return torch.where(mask, zero, neg)
    return mask.to(dtype)


def check_mask(mask: Tensor, B: int, H: int, T: int, S: int) -> None:
    """Raise ``ValueError``/``TypeError`` unless ``mask`` is usable for ``(B, H, T, S)`` scores.

    A usable mask is boolean (True = may attend) or floating point (additive) and broadcasts to
    ``(B, H, T, S)``.
    """
    if mask.dtype != torch.bool and not mask.is_floating_point():
        raise TypeError(
            f"attention mask must be bool (True = may attend) or floating (additive), "
            f"got dtype {mask.dtype}"
        )
    if mask.dim() > 4:
        raise ValueError(f"attention mask has {mask.dim()} dims; at most 4 (B, H, T, S) allowed")
    target = (B, H, T, S)
    shape = (1,) * (4 - mask.dim()) + tuple(mask.shape)
    for got, want in zip(shape, target, strict=True):
        if got not in (1, want):
            raise ValueError(
                f"attention mask of shape {tuple(mask.shape)} does not broadcast to "
                f"(B, H, T, S) = {target}"
            )
