"""Pictures of attention masks: causal, padding, sliding window, combined, cached decoding.

Every mask is built by the library's own functions (:mod:`attnlab.layers.masks`,
:func:`attnlab.layers.attention_sliding.sliding_window_mask`) and drawn as a ``T x S`` grid, rows
are queries and columns keys. The library's convention: a boolean mask is **True where a query
may attend to a key**; filled cells are True.

- ``causal``: query ``i`` sees keys ``j <= i`` (the decoder's masked self-attention, §3.2.3);
- ``padding``: a key mask for a sequence of ``length`` real tokens padded to ``T`` (every query
  row alike: padding is never attended to);
- ``sliding_window``: causal, the ``window`` most recent keys only (plus global tokens);
- ``combined``: causal AND padding (a decoder on a padded batch), by :func:`combine_masks`;
- ``cached``: causal with ``T' < S`` queries, bottom-right aligned as in cached decoding
  (query ``i`` sees keys ``j <= i + S - T'``).

Shapes: T queries, S keys.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch
from torch import Tensor

from attnlab.layers.attention_sliding import sliding_window_mask
from attnlab.layers.masks import causal_mask, combine_masks, padding_mask_from_lengths
from attnlab.viz._mpl import new_figure, require_matplotlib, save_figure

if TYPE_CHECKING:
    from matplotlib.figure import Figure

MASK_KINDS = ("causal", "padding", "sliding_window", "combined", "cached")
DEFAULT_MASKS = ("causal", "padding", "sliding_window", "combined")


def mask_data(
    kinds: Sequence[str] = DEFAULT_MASKS,
    *,
    seq_len: int = 12,
    length: int | None = None,
    window: int = 4,
    global_tokens: Sequence[int] = (),
    query_len: int | None = None,
) -> dict[str, Tensor]:
    """The boolean masks (True = may attend) behind :func:`plot_masks`, by kind.

    Args:
        kinds: which of :data:`MASK_KINDS`, in order.
        seq_len: T (= S). length: real tokens for ``padding``/``combined`` (default T - 3).
        window: the sliding window. global_tokens: positions attending / attended everywhere.
        query_len: queries T' of ``cached`` (default T // 3).

    Shapes:
        each ``(T, S)`` bool; ``cached`` is ``(T', S)``.

    Raises:
        ValueError: for an unknown kind (listing the valid ones) or sizes out of range.
    """
    bad = [k for k in kinds if k not in MASK_KINDS]
    if bad or not kinds:
        raise ValueError(f"unknown mask kind(s) {bad}; valid: {', '.join(MASK_KINDS)}")
    T = seq_len
    if T <= 0:
        raise ValueError(f"seq_len must be positive, got {T}")
    length = max(1, T - 3) if length is None else length
    if not 0 <= length <= T:
        raise ValueError(f"length must be in 0..{T} (the sequence length), got {length}")
    if window <= 0:
        raise ValueError(f"window must be positive, got {window}")
    q = max(1, T // 3) if query_len is None else query_len
    if not 1 <= q <= T:
        raise ValueError(f"query_len must be in 1..{T}, got {q}")
    key_mask = padding_mask_from_lengths(torch.tensor([length]), T)[0, 0]  # (1, S)
    out: dict[str, Tensor] = {}
    for kind in kinds:
        if kind == "causal":
            out[kind] = causal_mask(T)
        elif kind == "padding":
            out[kind] = key_mask.expand(T, T).clone()
        elif kind == "sliding_window":
            out[kind] = sliding_window_mask(
                T, window=window, is_causal=True, global_tokens=list(global_tokens)
            )
        elif kind == "combined":
            combined = combine_masks(causal_mask(T), key_mask)
            out[kind] = torch.broadcast_to(combined, (T, T)).clone()  # type: ignore[arg-type]
        else:
            out[kind] = causal_mask(q, T)
    return out


def _describe(kind: str, length: int, window: int, glob: Sequence[int], q: int, T: int) -> str:
    return {
        "causal": "causal: j <= i",
        "padding": f"padding: {length} real tokens of {T}",
        "sliding_window": f"sliding window {window}"
        + (f", global {list(glob)}" if glob else "")
        + ", causal",
        "combined": "combined: causal AND padding",
        "cached": f"cached decoding: {q} new queries,\n{T} keys (bottom-right aligned)",
    }[kind]


def plot_masks(
    kinds: Sequence[str] = DEFAULT_MASKS,
    *,
    seq_len: int = 12,
    length: int | None = None,
    window: int = 4,
    global_tokens: Sequence[int] = (),
    query_len: int | None = None,
    path: str | os.PathLike[str] | None = None,
) -> Figure:
    """Draw :func:`mask_data` (same arguments): one axes per mask kind, filled = may attend."""
    require_matplotlib()
    from matplotlib.colors import ListedColormap
    from matplotlib.patches import Patch

    masks = mask_data(
        kinds,
        seq_len=seq_len,
        length=length,
        window=window,
        global_tokens=global_tokens,
        query_len=query_len,
    )
    T = seq_len
    length = max(1, T - 3) if length is None else length
    q = max(1, T // 3) if query_len is None else query_len
    n = len(masks)
    fig = new_figure(3.2 * n + 0.4, 4.0)
    axes = fig.subplots(1, n, squeeze=False)[0]
    cmap = ListedColormap(["#f2f2f2", "#2b6cb0"])
    ticks = list(range(0, T, max(1, T // 12)))
    for ax, (kind, mask) in zip(axes, masks.items(), strict=True):
        rows, cols = mask.shape
        ax.imshow(mask.int().numpy(), cmap=cmap, vmin=0, vmax=1, interpolation="nearest")
        ax.set_xticks([x - 0.5 for x in range(cols + 1)], minor=True)
        ax.set_yticks([y - 0.5 for y in range(rows + 1)], minor=True)
        ax.grid(which="minor", color="white", lw=0.8)
        ax.tick_params(which="minor", length=0)
        ax.set_xticks(ticks)
        ax.set_yticks([y for y in range(rows) if rows <= 12 or y in ticks])
        ax.set(xlabel="key j", ylabel="query i")
        ax.set_title(_describe(kind, length, window, global_tokens, q, T), fontsize=9)
    fig.legend(
        handles=[
            Patch(color="#2b6cb0", label="True: may attend"),
            Patch(color="#f2f2f2", label="False: masked (weight 0)"),
        ],
        loc="lower center",
        ncol=2,
        fontsize=8,
        frameon=False,
    )
    fig.suptitle(
        "Attention masks (bool, True = may attend; rows: queries, columns: keys)", fontsize=11
    )
    fig.get_layout_engine().set(rect=(0, 0.08, 1, 0.92))  # type: ignore[union-attr, call-arg]
    if path is not None:
        save_figure(fig, path)
    return fig


__all__ = ["DEFAULT_MASKS", "MASK_KINDS", "mask_data", "plot_masks"]
