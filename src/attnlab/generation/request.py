"""Checks and defaults shared by every decoding loop (greedy, sampling, beam search).

:func:`prepare_request` validates the model kind, packs the prompts, resolves EOS/padding ids
from the config, and checks the context length; :func:`open_session` builds the matching
:mod:`~attnlab.generation.session`; :func:`eval_mode` runs the model in eval mode and restores
its previous mode.

Context length: ``config.max_seq_len``. A decoder-only prompt plus its new tokens must fit in it
(``P + max_new_tokens <= max_seq_len``); for an encoder-decoder model the source and the new
tokens must each fit. Otherwise a ``ValueError`` says by how much, unless ``truncate=True``,
which lowers ``max_new_tokens`` to what fits (a prompt that alone fills the context is always an
error).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from attnlab.generation.prompts import PromptInput, Prompts, pack_prompts
from attnlab.generation.session import DecoderOnlySession, EncoderDecoderSession, Session
from attnlab.models.gpt import GPT
from attnlab.models.transformer import EncoderDecoderTransformer

GenerativeModel = GPT | EncoderDecoderTransformer
EosIds = int | Sequence[int] | None


@dataclass(frozen=True)
class GenerationRequest:
    """A validated generation call.

    Attributes:
        model: the model. prompts: packed prompts (left-padded) or sources (right-padded).
        max_new_tokens: after any truncation. eos: ``(n_eos,)`` int64 stop ids (may be empty).
        pad_id: written after a row's EOS. vocab_size: of the output distribution.
    """

    model: GenerativeModel
    prompts: Prompts
    max_new_tokens: int
    eos: Tensor
    pad_id: int
    vocab_size: int

    @property
    def is_encoder_decoder(self) -> bool:
        return isinstance(self.model, EncoderDecoderTransformer)


def _model_device(model: nn.Module) -> torch.device:
    param = next(model.parameters(), None)
    return param.device if param is not None else torch.device("cpu")


def resolve_eos(model: GenerativeModel, eos_id: EosIds) -> list[int]:
    """``eos_id`` as a list: ``None`` -> the config's ``eos_id`` (none if unset); an empty
    sequence disables stopping."""
    if eos_id is None:
        cfg_eos = model.config.eos_id
        return [] if cfg_eos is None else [int(cfg_eos)]
    if isinstance(eos_id, int):
        return [eos_id]
    return [int(e) for e in eos_id]


def prepare_request(
    model: nn.Module,
    input_ids: PromptInput,
    *,
    max_new_tokens: int,
    attention_mask: Tensor | None = None,
    eos_id: EosIds = None,
    pad_id: int | None = None,
    truncate: bool = False,
) -> GenerationRequest:
    """Validate a generation call and pack its prompts.

    Raises:
        TypeError: for a model that is neither a :class:`GPT` nor an
            :class:`EncoderDecoderTransformer`.
        ValueError: for ``max_new_tokens < 1``, empty prompts, ids outside the vocabulary,
            EOS/pad ids outside it, or prompts/new tokens that do not fit the context.
    """
    if not isinstance(model, (GPT, EncoderDecoderTransformer)):
        raise TypeError(
            f"generation needs a GPT or an EncoderDecoderTransformer, got {type(model).__name__}"
        )
    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int):
        raise ValueError(f"max_new_tokens must be an int, got {max_new_tokens!r}")
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
    cfg = model.config
    enc_dec = isinstance(model, EncoderDecoderTransformer)
    vocab = (
        model.config.target_vocab_size
        if isinstance(model, EncoderDecoderTransformer)
        else (model.config.vocab_size)
    )
    eos = resolve_eos(model, eos_id)
    for e in eos:
        if not 0 <= e < vocab:
            raise ValueError(f"eos id {e} is outside the vocabulary [0, {vocab})")
    if pad_id is None:
        pad_id = cfg.pad_id if cfg.pad_id is not None else (eos[0] if eos else 0)
    if not 0 <= pad_id < vocab:
        raise ValueError(f"pad_id {pad_id} is outside the vocabulary [0, {vocab})")
    in_vocab = cfg.vocab_size
    if (
        isinstance(model, EncoderDecoderTransformer)
        and attention_mask is None
        and isinstance(input_ids, Tensor)
    ):
        attention_mask = model.default_src_mask(
            input_ids.unsqueeze(0) if input_ids.dim() == 1 else input_ids
        )
    prompts = pack_prompts(
        input_ids,
        attention_mask,
        pad_id=pad_id if pad_id < in_vocab else 0,
        vocab_size=in_vocab,
        side="right" if enc_dec else "left",
        device=_model_device(model),
    )
    context = cfg.max_seq_len
    width = prompts.width
    what = "source" if enc_dec else "prompt"
    if width > (context if enc_dec else context - 1):
        raise ValueError(
            f"{what} of {width} tokens does not leave room in the model's context "
            f"(max_seq_len={context})"
        )
    room = context if enc_dec else context - width
    if max_new_tokens > room:
        if not truncate:
            total = f"{max_new_tokens} new" if enc_dec else f"{width} + {max_new_tokens}"
            raise ValueError(
                f"{total} tokens exceed the model's context (max_seq_len={context}); "
                f"use max_new_tokens <= {room} or truncate=True"
            )
        max_new_tokens = room
    return GenerationRequest(
        model=model,
        prompts=prompts,
        max_new_tokens=max_new_tokens,
        eos=torch.tensor(eos, dtype=torch.long, device=prompts.ids.device),
        pad_id=pad_id,
        vocab_size=vocab,
    )


def open_session(request: GenerationRequest, *, use_cache: bool = True) -> Session:
    """The decoding session of ``request``'s model kind (call under ``inference_mode``)."""
    model = request.model
    if isinstance(model, EncoderDecoderTransformer):
        return EncoderDecoderSession(model, request.prompts, request.max_new_tokens, use_cache)
    return DecoderOnlySession(model, request.prompts, request.max_new_tokens, use_cache)


@contextmanager
def eval_mode(model: nn.Module) -> Iterator[None]:
    """Put ``model`` in eval mode (no dropout) and restore its previous mode afterwards."""
    was_training = model.training
    model.eval()
    try:
        yield
    finally:
        model.train(was_training)


def repeat_index(batch: int, n: int, device: torch.device) -> Tensor:
    """``[0]*n + [1]*n + ...``: each of ``batch`` rows repeated ``n`` times. ``(batch·n,)``."""
    return torch.arange(batch, device=device).repeat_interleave(n)


__all__ = [
    "EosIds",
    "GenerationRequest",
    "GenerativeModel",
    "eval_mode",
    "open_session",
    "prepare_request",
    "repeat_index",
    "resolve_eos",
]
