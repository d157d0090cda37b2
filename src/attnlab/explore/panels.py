"""The explorer's positional-encoding and mask panels, from :mod:`attnlab.viz`'s data functions.

- :func:`positional_view`: :func:`attnlab.viz.positional_data` for a kind, ``d_model`` and a
  length: sinusoidal (§3.5: the table and ``PE_m · PE_n``), the loaded model's learned table
  (and its cosine similarities), RoPE (the score of two all-ones vectors rotated to positions m
  and n), ALiBi (the bias of every head);
- :func:`mask_view`: :func:`attnlab.viz.mask_data`: causal, padding, sliding-window, combined
  and cached-decoding masks (True = may attend).

Sizes are bounded (``length`` and ``seq_len`` <= 256, ``d_model`` <= 1024, heads <= 64).
Shapes: L positions, E d_model, H heads, T queries, S keys.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from torch import nn

from attnlab.explore.common import check_int, pack
from attnlab.viz.masks import MASK_KINDS, mask_data
from attnlab.viz.positional import POSITIONAL_KINDS, positional_data

MAX_LENGTH, MAX_D_MODEL, MAX_HEADS = 256, 1024, 64
# kind -> (the square picture, the table beside it or None)
SHOWN = {
    "sinusoidal": ("similarity", "table"),
    "learned": ("similarity", "table"),
    "rope": ("scores", "cos"),
    "alibi": ("bias", None),
}


def positional_view(
    kind: object, *, d_model: object = 64, length: object = 64, n_heads: object = 8,
    model: nn.Module | None = None,
) -> dict[str, Any]:  # fmt: skip
    """The arrays of one positional encoding, packed.

    Returns:
        ``{"kind", "matrix": (L, L) or ALiBi's (H, L, L), "table": (L, E) or RoPE's cos
        (L, E/2) or None, "names": the viz keys shown}``.

    Raises:
        ValueError: for an unknown kind (listing the valid ones), sizes out of range, an odd
            ``d_model`` for RoPE, or ``learned`` for a model without a learned table.
    """
    if kind not in POSITIONAL_KINDS:
        raise ValueError(f"unknown positional kind {kind!r}; valid: {', '.join(POSITIONAL_KINDS)}")
    E = check_int("d_model", d_model, 2, MAX_D_MODEL + 1)
    L = check_int("length", length, 1, MAX_LENGTH + 1)
    H = check_int("n_heads", n_heads, 1, MAX_HEADS + 1)
    if kind == "rope" and E % 2:
        raise ValueError(f"RoPE rotates pairs of dimensions: d_model must be even, got {E}")
    try:
        data = positional_data(kind, d_model=E, max_len=L, n_heads=H, model=model)
    except (TypeError, AttributeError) as e:  # a model without a learned table
        raise ValueError(f"kind 'learned' needs a model with a learned table: {e}") from None
    square, side = SHOWN[str(kind)]
    return {
        "kind": kind,
        "matrix": pack(data[square]),
        "table": pack(data[side]) if side is not None else None,
        "names": [square, side],
    }


def mask_view(body: Mapping[str, Any]) -> dict[str, Any]:
    """The masks ``body["kinds"]`` (default all) for ``seq_len``, ``window``, ``length`` (real
    tokens of ``padding``/``combined``) and ``query_len`` (``cached``), as 0/1 lists.

    Raises:
        ValueError: for unknown kinds or sizes out of range.
    """
    kinds = body.get("kinds", list(MASK_KINDS))
    if not isinstance(kinds, list) or not all(isinstance(k, str) for k in kinds):
        raise ValueError(f"kinds must be a list of mask names ({', '.join(MASK_KINDS)})")
    T = check_int("seq_len", body.get("seq_len", 12), 1, MAX_LENGTH + 1)
    window = check_int("window", body.get("window", 4), 1, MAX_LENGTH + 1)
    length = body.get("length")
    query_len = body.get("query_len")
    if length is not None:
        check_int("length", length, 0, T + 1)
    if query_len is not None:
        check_int("query_len", query_len, 1, T + 1)
    masks = mask_data(kinds, seq_len=T, window=window, length=length, query_len=query_len)
    return {k: m.int().tolist() for k, m in masks.items()}


__all__ = ["MASK_KINDS", "POSITIONAL_KINDS", "mask_view", "positional_view"]
