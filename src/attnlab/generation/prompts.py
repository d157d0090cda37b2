"""Prompt batches for generation: ragged prompts packed to one padded tensor and its mask.

Decoder-only models need **left** padding: every row's next token is then produced at the same
column, so one decode step serves the batch; the padding is masked out of attention, and each
row's positions start at 0 on its first real token (``positions = cumsum(mask) - 1``), so a
left-padded row computes exactly what it would alone. The encoder of an encoder-decoder model
numbers source positions from column 0, so sources are packed with **right** padding instead.

Shapes: B prompts, P padded prompt length.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from numbers import Integral
from typing import Literal

import torch
from torch import Tensor

# A (B, T) or (T,) tensor, or a list of 1-D tensors / int lists of different lengths.
PromptInput = Tensor | Sequence[Sequence[int]] | Sequence[Tensor]


@dataclass(frozen=True)
class Prompts:
    """A packed batch of prompts.

    Attributes:
        ids: ``(B, P)`` int64, padded on ``side``.
        mask: ``(B, P)`` bool, True for real tokens; ``None`` when no row is padded.
        lengths: ``(B,)`` int64, real tokens per row.
    """

    ids: Tensor
    mask: Tensor | None
    lengths: Tensor

    @property
    def batch_size(self) -> int:
        return int(self.ids.shape[0])

    @property
    def width(self) -> int:
        return int(self.ids.shape[1])


def _rows(input_ids: PromptInput, attention_mask: Tensor | None, vocab_size: int) -> list[Tensor]:
    """Split the input into a list of 1-D tensors of real tokens (a list's ids are checked
    against the vocabulary here, before a tensor is made of them: an int64 holds no id of
    ``2**63`` or more)."""
    if isinstance(input_ids, Tensor):
        ids = input_ids.unsqueeze(0) if input_ids.dim() == 1 else input_ids
        if ids.dim() != 2:
            raise ValueError(f"input_ids must be (B, T) or (T,), got shape {tuple(ids.shape)}")
        if ids.is_floating_point() or ids.is_complex() or ids.dtype == torch.bool:
            raise ValueError(f"input_ids must hold integer token ids, got dtype {ids.dtype}")
        if ids.device.type == "meta":
            raise ValueError("input_ids is on the meta device: it has shapes but no token ids")
        if attention_mask is None:
            return list(ids)
        mask = attention_mask.unsqueeze(0) if attention_mask.dim() == 1 else attention_mask
        if mask.shape != ids.shape:
            raise ValueError(
                f"attention_mask {tuple(mask.shape)} must match input_ids {tuple(ids.shape)}"
            )
        if mask.device.type == "meta":
            raise ValueError("attention_mask is on the meta device: it has shapes but no values")
        if mask.is_complex():
            raise TypeError(f"attention_mask must be bool, integer or float, got {mask.dtype}")
        if mask.dtype != torch.bool and bool(((mask != 0) & (mask != 1)).any()):
            bad = mask[(mask != 0) & (mask != 1)][0].item()
            raise ValueError(
                f"attention_mask values must be 0 (padding) or 1 (a real token), got {bad}"
            )
        mask = mask.to(device=ids.device) != 0
        return [row[m] for row, m in zip(ids, mask, strict=True)]
    if attention_mask is not None:
        raise ValueError("attention_mask is only accepted with a tensor of input_ids")
    if isinstance(input_ids, (str, bytes)) or not isinstance(input_ids, Sequence):
        raise ValueError(
            "input_ids must be a tensor or a list of token id sequences, "
            f"got {type(input_ids).__name__}"
        )
    rows = []
    for i, row in enumerate(input_ids):
        if isinstance(row, Tensor):
            if row.is_floating_point() or row.is_complex() or row.dtype == torch.bool:
                raise ValueError(f"prompt {i} must hold integer token ids, got dtype {row.dtype}")
            t = row
        else:
            values = list(row) if isinstance(row, Sequence) and not isinstance(row, str) else None
            if values is None:
                raise ValueError(f"prompt {i} must be a sequence of token ids, got {row!r}")
            wrong = [v for v in values if isinstance(v, bool) or not isinstance(v, Integral)]
            if wrong:
                raise ValueError(
                    f"prompt {i} must hold integer token ids, got {wrong[0]!r} "
                    f"({type(wrong[0]).__name__})"
                )
            if values:
                lo, hi = min(values), max(values)
                if lo < 0 or hi >= vocab_size:
                    bad = lo if lo < 0 else hi
                    raise ValueError(f"token id {bad} is outside the vocabulary [0, {vocab_size})")
            t = torch.as_tensor(values, dtype=torch.long)
        if t.dim() != 1:
            raise ValueError(f"prompt {i} must be 1-D, got shape {tuple(t.shape)}")
        rows.append(t)
    return rows


def pack_prompts(
    input_ids: PromptInput,
    attention_mask: Tensor | None = None,
    *,
    pad_id: int,
    vocab_size: int,
    side: Literal["left", "right"] = "left",
    device: torch.device | str | None = None,
) -> Prompts:
    """Pack prompts into a ``side``-padded batch.

    Args:
        input_ids: ``(B, T)``/``(T,)`` tensor (with ``attention_mask`` ``(B, T)``, 1 = real
            token, any padding layout), or a list of 1-D token sequences of any lengths.
        attention_mask: which tokens of a tensor input are real (default: all of them).
        pad_id: the id written into padding (masked out, so any valid id).
        vocab_size: ids must lie in ``[0, vocab_size)``.
        side: ``"left"`` (decoder-only prompts) or ``"right"`` (encoder sources).
        device: where the packed tensors go (default: the input's device).

    Raises:
        ValueError: for no prompts, an empty prompt, ids outside the vocabulary, or shapes that
            do not fit.
    """
    rows = _rows(input_ids, attention_mask, vocab_size)
    if not rows:
        raise ValueError("no prompts given (an empty batch)")
    lengths = [int(r.numel()) for r in rows]
    for i, n in enumerate(lengths):
        if n == 0:
            raise ValueError(f"prompt {i} is empty: generation needs at least one token")
    device = device if device is not None else rows[0].device
    P = max(lengths)
    ids = torch.full((len(rows), P), pad_id, dtype=torch.long, device=device)  # (B, P)
    mask = torch.zeros(len(rows), P, dtype=torch.bool, device=device)  # (B, P)
    for i, (row, n) in enumerate(zip(rows, lengths, strict=True)):
        cols = slice(P - n, P) if side == "left" else slice(0, n)
        ids[i, cols] = row.to(device=device, dtype=torch.long)
        mask[i, cols] = True
    lo, hi = int(ids[mask].min()), int(ids[mask].max())
    if lo < 0 or hi >= vocab_size:
        bad = lo if lo < 0 else hi
        raise ValueError(f"token id {bad} is outside the vocabulary [0, {vocab_size})")
    padded = min(lengths) != P
    lengths_t = torch.tensor(lengths, dtype=torch.long, device=device)
    return Prompts(ids=ids, mask=mask if padded else None, lengths=lengths_t)


__all__ = ["PromptInput", "Prompts", "pack_prompts"]
