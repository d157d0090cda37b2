"""Greedy decoding for the encoder-decoder Transformer (§3, auto-regressive generation).

"At each step the model is auto-regressive, consuming the previously generated symbols as
additional input when generating the next." The source is encoded once; the decoder then runs one
token per step, reusing every earlier position's keys/values from a :class:`KVCache` (and the
memory's cross-attention keys/values, computed at the first step), and picks the arg-max token.

Shapes: B batch, S source length, L generated length (<= max_len), V target vocabulary.

Deviations from the paper: greedy instead of beam search (§6.1 uses beam size 4, length penalty
α = 0.6); beam search comes later in this package.
"""

from __future__ import annotations

import torch
from torch import Tensor

from attnlab.models.transformer import EncoderDecoderTransformer


@torch.no_grad()
def greedy_decode(
    model: EncoderDecoderTransformer,
    src: Tensor,
    *,
    max_len: int,
    src_mask: Tensor | None = None,
) -> Tensor:
    """Generate the arg-max target for each source sequence, with the KV cache.

    Runs the model in eval mode (its previous mode is restored) and stops as soon as every row has
    produced EOS. The output excludes BOS, includes each row's EOS, and is padded after it with
    the config's ``pad_id`` (``eos_id`` when the config has none).

    Args:
        model: an :class:`EncoderDecoderTransformer`.
        src: source ids, padded with ``pad_id``.
        max_len: the most tokens to generate per row (EOS included).
        src_mask: ``(B, S)``, True for real source tokens; default ``src != pad_id``.

    Shapes:
        src ``(B, S)`` -> ``(B, L)`` int64 with ``L <= max_len``.

    Raises:
        ValueError: if ``max_len < 1`` or ``src`` is not ``(B, S)``.
    """
    if max_len < 1:
        raise ValueError(f"max_len must be positive, got {max_len}")
    if src.dim() != 2:
        raise ValueError(f"src must be (B, S) token ids, got shape {tuple(src.shape)}")
    config = model.config
    pad = config.pad_id if config.pad_id is not None else config.eos_id
    was_training = model.training
    model.eval()
    try:
        src_mask = model.default_src_mask(src) if src_mask is None else src_mask
        memory = model.encode(src, src_mask=src_mask)  # (B, S, E)
        cache = model.new_cache(max_len)
        B = src.shape[0]
        out = torch.full((B, max_len), pad, dtype=torch.long, device=src.device)  # (B, max_len)
        finished = torch.zeros(B, dtype=torch.bool, device=src.device)  # (B,)
        step_ids = torch.full((B, 1), config.bos_id, dtype=torch.long, device=src.device)
        for t in range(max_len):
            logits = model.decode(step_ids, memory, src_mask=src_mask, cache=cache)  # (B, 1, V)
            next_ids = logits[:, -1].argmax(dim=-1).masked_fill(finished, pad)  # (B,)
            out[:, t] = next_ids
            finished |= next_ids == config.eos_id
            if bool(finished.all()):
                return out[:, : t + 1]
            step_ids = next_ids.unsqueeze(1)  # (B, 1)
        return out
    finally:
        model.train(was_training)


__all__ = ["greedy_decode"]
