"""Attention weights of a whole model for one text: tokenise, run, keep every layer and head.

:func:`attention_for_text` takes a loaded model (BERT, GPT or the encoder-decoder Transformer) and
a text, or token ids, runs one forward pass with :func:`~attnlab.viz.capture.collect_attention`
(every layer on the math path, ``need_weights=True``) and returns an :class:`AttentionMaps`: the
token labels and, per stack, per layer, the ``(H, T, S)`` weights. For an encoder-decoder model the
target is the given target text/ids, or else the model's own greedy translation of the source, so
that cross-attention (target queries x source keys) shows what the model attends to when it
writes. :func:`load_for_viz` loads a checkpoint directory (attnlab's or Hugging Face's, or a run
directory) and its ``tokenizer.json`` when there is one: a ``tokenizers``-library file, or
attnlab's character tokenizer (a ``shakespeare-char`` run's), whose tokens are its characters. A
text the tokenizer file truncates is mapped as cut, with a logged warning giving both lengths.

Shapes: H heads, T queries, S keys (T = S for self-attention).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import torch
from torch import Tensor, nn

from attnlab.models.family import Kind, find_family
from attnlab.viz.capture import collect_attention

if TYPE_CHECKING:
    from tokenizers import Tokenizer

    from attnlab.tokenizers import CharTokenizer

logger = logging.getLogger(__name__)

STACK_TITLES = {
    "self": "self-attention",
    "encoder": "encoder self-attention",
    "decoder": "decoder masked self-attention",
    "cross": "cross-attention (target queries x source keys)",
}


@dataclass
class AttentionMaps:
    """Every attention weight of one forward pass over one sequence (batch dim dropped).

    Attributes:
        tokens: labels of the input sequence (the source of an encoder-decoder model).
        target_tokens: labels of the decoder input (encoder-decoder only), else ``None``.
        stacks: stack name (``"self"`` | ``"encoder"`` | ``"decoder"`` | ``"cross"``) -> per
            layer ``(H, T, S)`` weights.
        model_name: the model class, for titles.
    """

    tokens: list[str]
    target_tokens: list[str] | None
    stacks: dict[str, list[Tensor]]
    model_name: str = ""

    def check_stack(self, stack: str) -> list[Tensor]:
        """The layers of ``stack``; ``ValueError`` naming the valid stacks otherwise."""
        if stack not in self.stacks:
            raise ValueError(f"unknown stack {stack!r}; this model has: {', '.join(self.stacks)}")
        return self.stacks[stack]

    def layer(self, stack: str, layer: int, head: int | None = None) -> Tensor:
        """``(H, T, S)`` weights of one layer, or ``(T, S)`` of one head.

        Raises:
            ValueError: for an unknown stack, or a layer/head out of range (naming the range).
        """
        layers = self.check_stack(stack)
        if not 0 <= layer < len(layers):
            raise ValueError(
                f"layer {layer} is out of range: the {stack} stack has {len(layers)} layers "
                f"(valid 0..{len(layers) - 1})"
            )
        w = layers[layer]
        if head is None:
            return w
        if not 0 <= head < w.shape[0]:
            raise ValueError(
                f"head {head} is out of range: layer {layer} has {w.shape[0]} heads "
                f"(valid 0..{w.shape[0] - 1})"
            )
        return w[head]

    def labels(self, stack: str) -> tuple[list[str], list[str]]:
        """``(query labels, key labels)`` of a stack."""
        self.check_stack(stack)
        target = self.target_tokens if self.target_tokens is not None else self.tokens
        if stack == "decoder":
            return target, target
        if stack == "cross":
            return target, self.tokens
        return self.tokens, self.tokens


def clean_token(token: str) -> str:
    """A display label: BPE/SentencePiece word markers (``Ġ``, ``▁``) dropped, blanks shown."""
    out = token.replace("Ġ", "").replace("▁", "").replace("Ċ", "\\n")
    return out if out.strip() else repr(token)


def find_token(tokens: Sequence[str], word: str) -> list[int]:
    """Indices of the tokens that spell ``word`` (case-insensitive, markers ignored).

    A single token equal to ``word`` gives its first occurrence; otherwise the first run of
    consecutive tokens (sub-words, ``##`` joined) that spells it; an integer string is an index.

    Raises:
        ValueError: if ``word`` is not in ``tokens`` (listing them).
    """
    norm = [clean_token(t).removeprefix("##").lower() for t in tokens]
    target = word.strip().lower()
    if target in norm:
        return [norm.index(target)]
    for start in range(len(norm)):
        text = ""
        for end in range(start, len(norm)):
            text += norm[end]
            if text == target:
                return list(range(start, end + 1))
            if not target.startswith(text):
                break
    if word.strip().lstrip("-").isdigit() and 0 <= int(word) < len(tokens):
        return [int(word)]
    raise ValueError(f"token {word!r} is not in the sequence; tokens: {list(tokens)}")


def load_for_viz(
    path: str | os.PathLike[str], *, tokenizer: str | os.PathLike[str] | None = None
) -> tuple[nn.Module, Tokenizer | CharTokenizer | None]:
    """A checkpoint directory's model (eval mode) and its tokenizer (``None`` if absent).

    Args:
        path: attnlab or Hugging Face checkpoint directory, or a run directory (its newest
            checkpoint); its ``tokenizer.json`` is its own, else its run's.
        tokenizer: a ``tokenizer.json`` file or directory to use instead of the checkpoint's.

    Returns:
        The model and a ``tokenizers.Tokenizer`` (padding off) or, for attnlab's character
        tokenizer, a :class:`~attnlab.tokenizers.CharTokenizer`.

    Raises:
        FileNotFoundError: for a missing directory, config, weights or given tokenizer.
        ValueError: for a damaged tokenizer file (naming it).
    """
    from attnlab.pretrained import from_pretrained
    from attnlab.training.rundir import find_tokenizer

    model = from_pretrained(path)
    file = Path(tokenizer) if tokenizer is not None else find_tokenizer(path)
    return model, (_load_tokenizer(file) if file is not None else None)


def _load_tokenizer(file: Path) -> Tokenizer | CharTokenizer:
    """Any ``tokenizer.json`` (:func:`attnlab.tokenizers.load_tokenizer`): the library's
    tokenizer itself for a library file, attnlab's character tokenizer as it is."""
    from attnlab.tokenizers import CharTokenizer, LibraryTokenizer
    from attnlab.tokenizers import load_tokenizer as load_any

    tok = load_any(file)
    if isinstance(tok, CharTokenizer):
        return tok
    backend = cast(LibraryTokenizer, tok).backend
    backend.no_padding()  # type: ignore[attr-defined]  # one sequence: never padded
    return cast("Tokenizer", backend)


def _label(tokenizer: Tokenizer | CharTokenizer, i: int, missing: str | None = None) -> str:
    """The display label of token id ``i``: its string, else ``missing`` (default the id)."""
    from attnlab.tokenizers import CharTokenizer

    if isinstance(tokenizer, CharTokenizer):
        if not 0 <= i < tokenizer.vocab_size:
            return missing or str(i)
        return clean_token(tokenizer.decode([i]))
    return clean_token(tokenizer.id_to_token(i) or missing or str(i))


def _encode(
    tokenizer: Tokenizer | CharTokenizer | None,
    text: str | None,
    ids: Sequence[int] | None,
    *,
    special: bool,
) -> tuple[list[int], list[str], list[int]]:
    """``(ids, labels, type_ids)`` from explicit ids or from text through the tokenizer."""
    from attnlab.tokenizers import CharTokenizer

    if ids is not None:
        ids = [int(i) for i in ids]
        if tokenizer is None:
            return ids, [str(i) for i in ids], [0] * len(ids)
        return ids, [_label(tokenizer, i) for i in ids], [0] * len(ids)
    if text is None:
        raise ValueError("pass a text or token ids")
    if tokenizer is None:
        raise ValueError(
            "this checkpoint has no tokenizer.json: pass token ids (--ids) or a tokenizer"
        )
    if isinstance(tokenizer, CharTokenizer):  # one token per character, no specials added
        seq = tokenizer.encode(text)
        return seq, [_label(tokenizer, i) for i in seq], [0] * len(seq)
    enc = tokenizer.encode(text, add_special_tokens=special)
    if enc.overflowing:  # the tokenizer file truncates: the map shows only the first tokens
        from attnlab.interop.tokenizer import untruncated_lengths

        full = untruncated_lengths(tokenizer, [text], add_special_tokens=special)[0]
        logger.warning(
            "the text has %d tokens; the tokenizer (its truncation setting) keeps the first %d, "
            "so the attention maps cover only those",
            full,
            len(enc.ids),
        )
    return list(enc.ids), [clean_token(t) for t in enc.tokens], list(enc.type_ids)


@torch.no_grad()
def attention_for_text(
    model: nn.Module,
    text: str | None = None,
    *,
    tokenizer: Tokenizer | CharTokenizer | None = None,
    ids: Sequence[int] | None = None,
    target: str | None = None,
    target_ids: Sequence[int] | None = None,
    max_new_tokens: int = 32,
) -> AttentionMaps:
    """Run ``model`` on one text (or ids) and keep the weights of every layer and head.

    Args:
        model: a BERT, GPT or EncoderDecoderTransformer.
        text: the input (the source for an encoder-decoder), tokenised by ``tokenizer`` (a
            ``tokenizers.Tokenizer`` or attnlab's :class:`~attnlab.tokenizers.CharTokenizer`).
        ids: token ids instead of ``text`` (labelled by the tokenizer when given, else by id).
        target, target_ids: encoder-decoder only: the decoder input after BOS; default the
            model's greedy output (up to ``max_new_tokens``).

    Raises:
        ValueError: without text/ids, without a tokenizer for text, for an unsupported model, or
            for ids the model rejects (outside the vocabulary, longer than its positions).
    """
    device = next(model.parameters()).device
    name = type(model).__name__
    family = find_family(model)
    kind = family.kind if family is not None else None
    if kind is Kind.SEQ2SEQ:
        return _seq2seq(model, text, tokenizer, ids, target, target_ids, max_new_tokens)
    if kind not in (Kind.ENCODER, Kind.CAUSAL_LM):
        raise ValueError(
            f"attention_for_text supports encoders (BERT), causal LMs (GPT) and encoder-decoder "
            f"models, got {name}"
        )
    seq, labels, type_ids = _encode(tokenizer, text, ids, special=True)
    _check_ids(seq, cast(Any, model).config.vocab_size)
    x = torch.tensor([seq], device=device)  # (1, T)
    if kind is Kind.ENCODER:  # segments and a mask (the encoder protocol)
        types = torch.tensor([type_ids], device=device)  # (1, T)
        stacks = collect_attention(model, x, token_type_ids=types, mask=torch.ones_like(x))
    else:
        stacks = collect_attention(model, x)
    return AttentionMaps(labels, None, _squeeze(stacks), name)


def _seq2seq(
    model: nn.Module,
    text: str | None,
    tokenizer: Tokenizer | CharTokenizer | None,
    ids: Sequence[int] | None,
    target: str | None,
    target_ids: Sequence[int] | None,
    max_new_tokens: int,
) -> AttentionMaps:
    from attnlab.generation.generate import generate

    c: Any = model.config
    device = next(model.parameters()).device
    src_ids, src_labels, _ = _encode(tokenizer, text, ids, special=True)
    _check_ids(src_ids, c.vocab_size)
    src = torch.tensor([src_ids], device=device)  # (1, S)
    if target is None and target_ids is None:
        out = generate(model, src, max_new_tokens=max_new_tokens)[0].tolist()
        if out and out[-1] == c.eos_id:
            out = out[:-1]
        target_ids = out
    tgt_ids, tgt_labels, _ = _encode(tokenizer, target, target_ids, special=False)
    _check_ids(tgt_ids, c.target_vocab_size)
    bos = _label(tokenizer, c.bos_id, "<bos>") if tokenizer is not None else "<bos>"
    tgt = torch.tensor([[c.bos_id, *tgt_ids]], device=device)  # (1, T)
    stacks = collect_attention(model, src, tgt)
    return AttentionMaps(src_labels, [bos, *tgt_labels], _squeeze(stacks), type(model).__name__)


def _check_ids(ids: Sequence[int], vocab_size: int) -> None:
    if not ids:
        raise ValueError("the input has no tokens")
    bad = [i for i in ids if not 0 <= i < vocab_size]
    if bad:
        raise ValueError(f"token ids {bad} are outside the vocabulary [0, {vocab_size})")


def _squeeze(stacks: dict[str, list[Tensor]]) -> dict[str, list[Tensor]]:
    return {s: [w[0].float().cpu() for w in layers] for s, layers in stacks.items()}


__all__ = [
    "STACK_TITLES",
    "AttentionMaps",
    "attention_for_text",
    "clean_token",
    "find_token",
    "load_for_viz",
]
