"""Sentence embeddings: an encoder's token states, mean-pooled over real tokens, L2-normalised.

This is what sentence-transformers models such as all-MiniLM-L6-v2 prescribe (a BERT, then
"mean pooling" over the attention mask, then "normalize"); the cosine similarity of two
embeddings is then their dot product.

Shapes: B sentences, T tokens, E d_model.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from attnlab.models.family import Kind, find_family

if TYPE_CHECKING:
    from tokenizers import Tokenizer


def mean_pool(hidden: Tensor, mask: Tensor) -> Tensor:
    """Mean of the token states over real tokens.

    Shapes:
        hidden ``(B, T, E)``, mask ``(B, T)`` (True/1 = real token) -> ``(B, E)``.
    """
    m = mask.to(hidden.dtype).unsqueeze(-1)  # (B, T, 1)
    return (hidden * m).sum(dim=1) / m.sum(dim=1).clamp(min=1e-9)  # (B, E)


def _hidden(model: Any, ids: Tensor, mask: Tensor, type_ids: Tensor) -> Tensor:
    """The token states ``(B, T, E)`` of an encoder or a causal LM (their kinds' protocols,
    :mod:`attnlab.models.family`)."""
    family = find_family(model)
    kind = family.kind if family is not None else None
    if kind is Kind.ENCODER:
        return model(ids, mask=mask, token_type_ids=type_ids).hidden
    if kind is Kind.CAUSAL_LM:
        return model.hidden_states(ids, mask=mask)
    raise TypeError(
        f"embed needs an encoder (e.g. BERT) or a causal LM (e.g. GPT), got {type(model).__name__}"
    )


@torch.no_grad()
def embed(
    texts: str | Sequence[str],
    model: str | os.PathLike[str] | nn.Module,
    *,
    tokenizer: Tokenizer | None = None,
    batch_size: int = 32,
    normalize: bool = True,
    max_length: int | None = None,
) -> Tensor:
    """Sentence embeddings of ``texts``.

    Args:
        texts: one sentence or a list of them.
        model: a checkpoint directory (loaded with :func:`attnlab.from_pretrained`, its
            ``tokenizer.json`` with :func:`~attnlab.interop.tokenizer.load_tokenizer`), or a
            loaded BERT/GPT model, then with ``tokenizer``. Load once and pass the model when
            embedding repeatedly.
        tokenizer: a ``tokenizers.Tokenizer`` (required with a model object).
        batch_size: sentences per forward pass.
        normalize: L2-normalise each embedding (cosine similarity = dot product).
        max_length: truncate longer inputs (default: ``sentence_bert_config.json``'s
            ``max_seq_length`` for a directory, and at most the model's ``max_seq_len``).

    Shapes:
        returns ``(B, E)`` float, on the model's device (``(E,)`` for a single string).

    Raises:
        ValueError: for a model object without a tokenizer or ``batch_size < 1``.
        TypeError: for a model that is neither BERT nor GPT.
    """
    from attnlab.interop.tokenizer import load_tokenizer, sentence_max_length
    from attnlab.pretrained import from_pretrained

    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    if isinstance(model, (str, os.PathLike)):
        directory = model
        model = from_pretrained(directory)
        tokenizer = tokenizer or load_tokenizer(directory)
        max_length = max_length or sentence_max_length(directory)
    if tokenizer is None:
        raise ValueError("pass the tokenizer that goes with the model (see load_tokenizer)")
    config = getattr(model, "config", None)
    limit = getattr(config, "max_seq_len", None)
    if max_length is None or (limit is not None and max_length > limit):
        max_length = limit
    single = isinstance(texts, str)
    batch = [texts] if isinstance(texts, str) else list(texts)
    pad = getattr(config, "pad_id", None) or 0
    device = next(model.parameters()).device
    was_training = model.training
    model.eval()
    out = []
    try:
        for start in range(0, len(batch), batch_size):
            encodings = tokenizer.encode_batch(batch[start : start + batch_size])
            rows = [(e.ids[:max_length], e.type_ids[:max_length]) for e in encodings]
            T = max(len(ids) for ids, _ in rows)
            ids = torch.full((len(rows), T), pad, dtype=torch.long)  # (B, T)
            type_ids = torch.zeros_like(ids)  # (B, T)
            mask = torch.zeros_like(ids, dtype=torch.bool)  # (B, T)
            for b, (row, types) in enumerate(rows):
                ids[b, : len(row)] = torch.tensor(row)
                type_ids[b, : len(row)] = torch.tensor(types)
                mask[b, : len(row)] = True
            ids, type_ids, mask = ids.to(device), type_ids.to(device), mask.to(device)
            pooled = mean_pool(_hidden(model, ids, mask, type_ids), mask)  # (B, E)
            out.append(F.normalize(pooled, p=2, dim=-1) if normalize else pooled)
    finally:
        model.train(was_training)
    result = torch.cat(out) if out else torch.empty(0)
    return result[0] if single else result


__all__ = ["embed", "mean_pool"]
