"""Checks and defaults shared by every decoding loop (greedy, sampling, beam search, speculative).

:func:`prepare_request` validates the model kind, packs the prompts, resolves EOS/padding ids
from the config, and checks the context length; :func:`open_session` builds the matching
:mod:`~attnlab.generation.session`; :func:`eval_mode` runs the model in eval mode and restores
its previous mode; :class:`StepOutput` is what the streaming loops yield per token.

Context length: ``config.max_seq_len``. A decoder-only prompt plus its new tokens fit when
``P + max_new_tokens <= max_seq_len``; for an encoder-decoder model the source and the new tokens
must each fit. What happens otherwise is the generation config's ``context`` policy
(:mod:`attnlab.generation.config`): slide a window (decoder-only), lower ``max_new_tokens``, or
raise :class:`~attnlab.generation.config.ContextLengthError` saying by how much.
Recurrent models (kind ``RECURRENT_LM``: Mamba, LSTM/GRU) have no context limit: no policy
applies to them. What a model generates with is its family's declaration
(:mod:`attnlab.models.family`): its kind's standard session, or a session of its own.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, cast

import torch
from torch import Tensor, nn

from attnlab.generation.config import ContextLengthError, GenerationConfig
from attnlab.generation.engines import Runner
from attnlab.generation.prompts import PromptInput, Prompts, pack_prompts
from attnlab.generation.recurrent import RecurrentSession
from attnlab.generation.session import DecoderOnlySession, EncoderDecoderSession, Session
from attnlab.models.family import Family, Kind, family_of

GenerativeModel = Any
"""A model whose family's :class:`~attnlab.models.family.Kind` generates (causal LM,
encoder-decoder, recurrent LM)."""

# the standard session of each kind that generates (a family may declare its own)
STANDARD_SESSIONS: dict[Kind, Any] = {
    Kind.CAUSAL_LM: DecoderOnlySession,
    Kind.SEQ2SEQ: EncoderDecoderSession,
    Kind.RECURRENT_LM: RecurrentSession,
}


@dataclass(frozen=True)
class StepOutput:
    """One decoding step of :func:`stream`.

    Attributes:
        tokens: ``(B·R,)`` the new token of each row (``pad_id`` once a row has finished).
        logits: ``(B·R, V)`` the model's logits for this step, before any processor.
        finished: ``(B·R,)`` bool, rows that have produced an EOS (this step included).
    """

    tokens: Tensor
    logits: Tensor
    finished: Tensor


@dataclass(frozen=True)
class GenerationRequest:
    """A validated generation call.

    Attributes:
        model: the model. prompts: packed prompts (left-padded) or sources (right-padded).
        max_new_tokens: after any truncation. eos: ``(n_eos,)`` int64 stop ids (may be empty).
        pad_id: written after a row's EOS. vocab_size: of the output distribution.
        window: decoder-only, ``context="slide"``: the model's context, when the prompt and the
            new tokens exceed it (``None``: everything fits).
    """

    model: GenerativeModel
    prompts: Prompts
    max_new_tokens: int
    eos: Tensor
    pad_id: int
    vocab_size: int
    window: int | None = None

    @property
    def family(self) -> Family:
        """The model's family (its kind decides the session)."""
        return family_of(self.model)

    @property
    def is_encoder_decoder(self) -> bool:
        return self.family.kind is Kind.SEQ2SEQ


def _model_device(model: nn.Module) -> torch.device:
    param = next(model.parameters(), None)
    return param.device if param is not None else torch.device("cpu")


def resolve_eos(model: GenerativeModel, eos_id: int | Sequence[int] | None) -> list[int]:
    """``eos_id`` as a list: ``None`` -> the config's ``eos_id`` (none if unset); an empty
    sequence disables stopping."""
    if eos_id is None:
        cfg_eos = model.config.eos_id
        return [] if cfg_eos is None else [int(cfg_eos)]
    if isinstance(eos_id, int):
        return [eos_id]
    return [int(e) for e in eos_id]


def prepare_request(
    model: Any,
    input_ids: PromptInput,
    config: GenerationConfig,
    *,
    attention_mask: Tensor | None = None,
) -> GenerationRequest:
    """Validate a generation call and pack its prompts.

    Raises:
        TypeError: for a model whose family does not generate (an encoder, an image
            classifier) or that belongs to no family.
        ValueError: for empty prompts, ids outside the vocabulary, EOS/pad ids outside it.
        ContextLengthError: for prompts/new tokens that the context policy cannot fit.
    """
    family = generating_family(model)
    recurrent = family.kind is Kind.RECURRENT_LM
    cfg: Any = model.config
    enc_dec = family.kind is Kind.SEQ2SEQ
    vocab = cfg.target_vocab_size if enc_dec else cfg.vocab_size
    eos, pad_id = _special_ids(model, config, vocab)
    in_vocab = cfg.vocab_size
    if enc_dec and attention_mask is None and isinstance(input_ids, Tensor):
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
    if recurrent:  # a recurrent state has no length limit: nothing to fit
        max_new, window = config.max_new_tokens, None
    else:
        max_new, window = fit_context(prompts.width, config, cfg.max_seq_len, enc_dec)
    return GenerationRequest(
        model=model,
        prompts=prompts,
        max_new_tokens=max_new,
        eos=torch.tensor(eos, dtype=torch.long, device=prompts.ids.device),
        pad_id=pad_id,
        vocab_size=vocab,
        window=window,
    )


def generating_family(model: nn.Module) -> Family:
    """The family of a model that generates.

    Raises:
        TypeError: for a model of no family, or of a kind that does not generate.
    """
    family = family_of(model, what="generation")
    if not family.kind.generates:
        raise TypeError(
            f"generation needs a language model (causal LM, encoder-decoder or recurrent LM); "
            f"{type(model).__name__} is of kind {family.kind.value!r}"
        )
    return family


def _special_ids(
    model: GenerativeModel, config: GenerationConfig, vocab: int
) -> tuple[list[int], int]:
    """The EOS ids and the pad id of a call (the config's, else the model's), checked against
    the output vocabulary."""
    eos = resolve_eos(model, config.eos_ids)
    for e in eos:
        if not 0 <= e < vocab:
            raise ValueError(f"eos id {e} is outside the vocabulary [0, {vocab})")
    pad_id: int | None = config.pad_id
    if pad_id is None:
        model_pad = model.config.pad_id
        pad_id = int(model_pad) if model_pad is not None else (eos[0] if eos else 0)
    if not 0 <= pad_id < vocab:
        raise ValueError(f"pad_id {pad_id} is outside the vocabulary [0, {vocab})")
    return list(eos), pad_id


def fit_context(
    width: int, config: GenerationConfig, context: int, enc_dec: bool
) -> tuple[int, int | None]:
    """``(max_new_tokens, window)`` under ``config.context`` for a prompt of ``width`` tokens
    and a model of ``context`` positions (``enc_dec``: an encoder-decoder's source).

    Raises:
        ContextLengthError: when the policy cannot fit the prompt or the new tokens.
    """
    n, policy = config.max_new_tokens, config.context
    if not enc_dec and policy == "slide":
        return n, (context if width + n > context else None)
    limit = context if enc_dec else context - 1  # a decoder-only prompt needs room for 1 token
    what = "source" if enc_dec else "prompt"
    if width > limit:
        hint = "" if enc_dec else "; context='slide' crops it to the last max_seq_len tokens"
        raise ContextLengthError(
            f"{what} of {width} tokens does not leave room in the model's context "
            f"(max_seq_len={context}){hint}",
            context=context, prompt=width, room=0,
        )  # fmt: skip
    room = context if enc_dec else context - width
    if n <= room:
        return n, None
    if policy == "error":
        total = f"{n} new" if enc_dec else f"{width} + {n}"
        raise ContextLengthError(
            f"{total} tokens exceed the model's context (max_seq_len={context}); use "
            f"max_new_tokens <= {room}, context='truncate'"
            + ("" if enc_dec else " or context='slide'"),
            context=context, prompt=width, room=room,
        )  # fmt: skip
    return room, None  # truncate (and an encoder-decoder's "slide")


def open_session(
    request: GenerationRequest, *, use_cache: bool = True, runner: Runner | None = None
) -> Session:
    """The decoding session of ``request``'s model (call under ``inference_mode``): its
    family's own (:attr:`~attnlab.models.family.Family.session`), else its kind's standard one.
    ``runner``: what a causal LM's session runs (a decode engine; default the model itself)."""
    model = request.model
    family = request.family
    factory = family.session or STANDARD_SESSIONS.get(family.kind)
    if factory is None:  # prepare_request admits nothing else
        raise TypeError(f"no decoding session for {type(model).__name__}")
    kwargs: dict[str, Any] = {}
    if family.kind is Kind.CAUSAL_LM:
        kwargs = {"window": request.window, "runner": runner}
    return cast(
        Session,
        factory(model, request.prompts, request.max_new_tokens, use_cache, **kwargs),
    )


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
    "STANDARD_SESSIONS",
    "GenerationRequest",
    "GenerativeModel",
    "StepOutput",
    "eval_mode",
    "fit_context",
    "generating_family",
    "open_session",
    "prepare_request",
    "repeat_index",
    "resolve_eos",
]
