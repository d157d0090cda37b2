"""The explorer's first view: which head, query and key the page opens on, and how its numbers
are written.

A page that opens on layer 0, head 0, ``[CLS]`` -> ``[CLS]`` shows the least telling thing a
BERT has: most heads park their weight on ``[CLS]``/``[SEP]`` (the "no-op" sink), and the
strongest weights of the early layers belong to positional heads (previous token, next token,
two back), which draw the same pattern for every input. :func:`first_view` picks instead:

1. **the link**: the (query, key) pair, both content tokens (a letter or digit in the token;
   not a special token such as ``[CLS]``, ``[SEP]``, ``<s>``; not punctuation), more than
   :data:`NEAR` tokens apart, along which some head moves the most: the largest
   ``weight · ||v_key||`` over every layer and head. Weighting by the value norm follows
   Kobayashi et al. (2020), "Attention is not only a weight": a weight on a token whose value
   vector is tiny (the sink tokens' are) moves almost nothing into the query;
2. **the head**: of every layer and head, the one with the largest attention weight along that
   link (the ranking of ``attnlab viz attention --query Q --key K``).

When no pair qualifies (a short or all-punctuation input) the rule drops the distance
condition, then the content condition; a one-token input opens on ``(0, 0, 0, 0)``.
For the README's sentence on all-MiniLM-L6-v2, "The animal didn't cross the street because it
was too tired.", the link is "it" -> "animal" (layer 5 head 11 moves the most along it) and
the head layer 3, head 1 (weight 0.677), the view of the README's pictures.

:func:`display_number` writes a number for display: fixed decimals, never ``-0.0000``.

Shapes: L layers, H heads, H_kv kv heads, T queries, S keys (= T: self-attention), D head dim.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Sequence
from typing import Any

import torch
from torch import Tensor

NEAR = 2  # links this close are what positional heads draw for any input (MiniLM: +-1, -2)
_SPECIAL = re.compile(r"\[[A-Za-z_]+\]|<[^<>\s]*>|<\|[^|]*\|>")
_WORD_MARKS = ("##", "Ġ", "▁", "Ċ")  # WordPiece continuation, byte-level BPE, SentencePiece


def display_number(x: float | None, digits: int = 4) -> str:
    """``x`` with ``digits`` decimals for display; ``"—"`` for ``None``; a value that rounds to
    zero is written without a minus sign (``-0.00001`` -> ``"0.0000"``, never ``"-0.0000"``).

    Raises:
        ValueError: for ``digits`` that is not an integer in ``[0, 20]``.
    """
    if isinstance(digits, bool) or not isinstance(digits, int) or not 0 <= digits <= 20:
        raise ValueError(f"digits must be an integer in [0, 20], got {digits!r}")
    if x is None:
        return "—"
    text = f"{float(x):.{digits}f}"
    if text.startswith("-") and not any(c in "123456789" for c in text):
        return text[1:]  # -0.0000 and the like: zero has no sign on the page
    return text


def is_content(text: str) -> bool:
    """Whether a token's text is a content token: it holds a letter or digit (after a word
    marker such as ``##`` or ``Ġ``) and is not a special token (``[CLS]``, ``<s>``, ...)."""
    if _SPECIAL.fullmatch(text.strip()):
        return False
    for mark in _WORD_MARKS:
        if text.startswith(mark):
            text = text[len(mark) :]
            break
    return any(c.isalnum() for c in text)


def special_positions(config: Any, ids: Sequence[int]) -> set[int]:
    """Positions of ``ids`` that hold one of the config's special ids (``pad_id``, ``cls_id``,
    ``sep_id``, ``mask_id``, ``bos_id``, ``eos_id``: those it has and sets)."""
    names = ("pad_id", "cls_id", "sep_id", "mask_id", "bos_id", "eos_id")
    known = {getattr(config, n) for n in names if getattr(config, n, None) is not None}
    return {i for i, t in enumerate(ids) if int(t) in known}


def _pick(score: Tensor, allowed: Tensor) -> tuple[int, int] | None:
    """The (query, key) of the largest positive ``score`` where ``allowed``; None if none."""
    masked = torch.where(allowed, score, torch.zeros((), dtype=score.dtype))  # (T, S)
    if not bool((masked > 0).any()):
        return None
    flat = int(masked.flatten().argmax())
    return divmod(flat, masked.shape[1])


def first_view(
    weights: Tensor, values: Tensor, texts: Sequence[str], *,
    special: Collection[int] = (), stack: str = "self",
) -> dict[str, Any]:  # fmt: skip
    """The head, query and key the explorer opens on (the rule of this module's docstring).

    Args:
        weights: one self-attention stack's weights.
        values: that stack's value vectors (the ``layers.L.attn.v`` hook points).
        texts: the token texts, as the page shows them.
        special: positions of special tokens known by id (``[CLS]``, BOS, ...), besides those
            recognised by their text.
        stack: the stack's name, returned for the page.

    Returns:
        ``{"stack", "layer", "head", "query", "key", "weight", "moved", "rule", "reason"}``:
        ``weight`` the chosen head's weight along the link, ``moved`` the largest
        ``weight · ||v_key||`` along it, ``rule`` which condition held (``"content, far"``,
        ``"content"``, ``"any"``, ``"single token"``), ``reason`` one sentence for the page.

    Shapes:
        weights ``(L, H, T, T)``; values ``(L, H_kv, T, D)``; ``len(texts) == T``.

    Raises:
        ValueError: for shapes that disagree (naming them).
    """
    if weights.dim() != 4 or weights.shape[-1] != weights.shape[-2]:
        raise ValueError(f"weights must be (L, H, T, T), got {tuple(weights.shape)}")
    L, H, T, _ = weights.shape
    if values.dim() != 4 or values.shape[:1] != (L,) or values.shape[2] != T:
        raise ValueError(f"values must be (L, H_kv, T, D) = ({L}, ., {T}, .), got "
                         f"{tuple(values.shape)}")  # fmt: skip
    if len(texts) != T or H % values.shape[1]:
        raise ValueError(f"{len(texts)} token texts and {values.shape[1]} kv heads for "
                         f"{T} tokens and {H} heads")  # fmt: skip
    w = weights.detach().float()
    norms = values.detach().float().norm(dim=-1)  # (L, H_kv, T)
    norms = norms.repeat_interleave(H // values.shape[1], dim=1)  # (L, H, T): head h reads h // rep
    moved = (w * norms[:, :, None, :]).amax(dim=(0, 1))  # (T, S): the most any head moves
    content = torch.tensor([is_content(t) and i not in special for i, t in enumerate(texts)])
    pos = torch.arange(T)
    other = pos[:, None] != pos[None, :]  # (T, S)
    both = content[:, None] & content[None, :]  # (T, S)
    far = (pos[:, None] - pos[None, :]).abs() > NEAR  # (T, S)
    tiers = (("content, far", both & far & other), ("content", both & other), ("any", other))
    rule, pair = "single token", (0, 0)
    for name, allowed in tiers:
        found = _pick(moved, allowed)
        if found is not None:
            rule, pair = name, found
            break
    q, k = pair
    along = w[:, :, q, k]  # (L, H)
    layer, head = divmod(int(along.flatten().argmax()), H)
    weight = float(along[layer, head])
    why = {
        "content, far": f"the strongest link between content tokens more than {NEAR} apart",
        "content": f"no two content tokens are more than {NEAR} apart",
        "any": "the input has fewer than two content tokens",
        "single token": "the input has one token",
    }[rule]
    reason = (
        f"opened on “{texts[q]}” → “{texts[k]}”, layer {layer}, head {head} "
        f"(weight {display_number(weight, 3)}): {why}"
    )
    return {
        "stack": stack, "layer": layer, "head": head, "query": q, "key": k,
        "weight": weight, "moved": float(moved[q, k]), "rule": rule, "reason": reason,
    }  # fmt: skip


__all__ = ["NEAR", "display_number", "first_view", "is_content", "special_positions"]
