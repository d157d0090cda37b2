"""Sentence embeddings: an encoder's token states, mean-pooled over real tokens, L2-normalised.

This is what sentence-transformers models such as all-MiniLM-L6-v2 prescribe (a BERT, then
"mean pooling" over the attention mask, then "normalize"); the cosine similarity of two
embeddings is then their dot product.

A checkpoint directory's ``tokenizer.json`` may be a ``tokenizers``-library file or attnlab's
character tokenizer (a ``shakespeare-char`` run: a character-level GPT embeds too). Texts longer
than the model (or ``max_length``, or the tokenizer file's truncation) allow are embedded from
their first tokens, and a logged warning says how many were cut and to what length.

Shapes: B sentences, T tokens, E d_model.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from attnlab.models.family import Kind, find_family

if TYPE_CHECKING:
    from tokenizers import Tokenizer

    from attnlab.tokenizers import CharTokenizer

logger = logging.getLogger(__name__)


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
    tokenizer: Tokenizer | CharTokenizer | None = None,
    batch_size: int = 32,
    normalize: bool = True,
    max_length: int | None = None,
) -> Tensor:
    """Sentence embeddings of ``texts``.

    Args:
        texts: one sentence or a list of them.
        model: a checkpoint directory (loaded with :func:`attnlab.from_pretrained`, its
            ``tokenizer.json`` with :func:`~attnlab.interop.tokenizer.load_tokenizer`, or
            attnlab's character tokenizer), or a loaded BERT/GPT model, then with
            ``tokenizer``. Load once and pass the model when embedding repeatedly.
        tokenizer: a ``tokenizers.Tokenizer`` or attnlab's
            :class:`~attnlab.tokenizers.CharTokenizer` (required with a model object).
        batch_size: sentences per forward pass.
        normalize: L2-normalise each embedding (cosine similarity = dot product).
        max_length: truncate longer inputs (default: ``sentence_bert_config.json``'s
            ``max_seq_length`` for a directory, and at most the model's ``max_seq_len``); a
            warning is logged when a text is cut, with its length and the kept length.

    Shapes:
        returns ``(B, E)`` float, on the model's device (``(E,)`` for a single string).

    Raises:
        ValueError: for a model object without a tokenizer or ``batch_size < 1``.
        TypeError: for a model that is neither BERT nor GPT.
    """
    from attnlab.interop.tokenizer import sentence_max_length
    from attnlab.pretrained import from_pretrained

    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    if isinstance(model, (str, os.PathLike)):
        directory = model
        model = from_pretrained(directory)
        tokenizer = tokenizer or load_embed_tokenizer(directory)
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
    cut: list[tuple[int, int]] = []  # (tokens, tokens kept) of each text cut
    try:
        for start in range(0, len(batch), batch_size):
            texts = batch[start : start + batch_size]
            rows = _encode(tokenizer, texts, max_length, cut)
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
    if cut:
        longest = max(cut)
        logger.warning(
            "embed: %d of %d texts were cut to the tokens the model takes (the longest from %d "
            "to %d tokens): their embeddings cover their beginnings only",
            len(cut), len(batch), *longest,
        )  # fmt: skip
    result = torch.cat(out) if out else torch.empty(0)
    return result[0] if single else result


def load_embed_tokenizer(path: str | os.PathLike[str]) -> Tokenizer | CharTokenizer:
    """The tokenizer :func:`embed` reads from ``path`` (a ``tokenizer.json``, or a directory
    holding one): attnlab's character tokenizer as it is, else the ``tokenizers``-library file
    (:func:`~attnlab.interop.tokenizer.load_tokenizer`, padding off).

    Raises:
        FileNotFoundError: without the file. ValueError: for a damaged (or newer attnlab's)
            file, naming it. ImportError: for a library file without ``tokenizers``.
    """
    from attnlab.interop.tokenizer import load_tokenizer
    from attnlab.tokenizers import TOKENIZER_NAME, CharTokenizer
    from attnlab.tokenizers import load_tokenizer as load_any

    file = Path(path)
    if file.is_dir():
        file = file / TOKENIZER_NAME
    if file.is_file():
        tok = load_any(file)  # either format
        if isinstance(tok, CharTokenizer):
            return tok
    return load_tokenizer(path)


def _encode(
    tokenizer: Any, texts: list[str], max_length: int | None, cut: list[tuple[int, int]]
) -> list[tuple[list[int], list[int]]]:
    """``(ids, type ids)`` of each text, at most ``max_length`` tokens; ``(full length, kept
    length)`` of each text that loses tokens (here, or to the tokenizer file's own truncation)
    goes in ``cut``."""
    from attnlab.tokenizers import CharTokenizer

    if isinstance(tokenizer, CharTokenizer):
        encoded = [tokenizer.encode(t) for t in texts]
        full = [len(ids) for ids in encoded]
        rows = [(ids[:max_length], [0] * len(ids[:max_length])) for ids in encoded]
    else:
        encodings = tokenizer.encode_batch(texts)
        full = [len(e.ids) for e in encodings]
        if any(e.overflowing for e in encodings):  # the file truncates: count what it dropped
            from attnlab.interop.tokenizer import untruncated_lengths

            full = untruncated_lengths(tokenizer, texts)
        rows = [(e.ids[:max_length], e.type_ids[:max_length]) for e in encodings]
    cut.extend((n, len(ids)) for n, (ids, _) in zip(full, rows, strict=True) if n > len(ids))
    return rows


__all__ = ["embed", "load_embed_tokenizer", "mean_pool"]
