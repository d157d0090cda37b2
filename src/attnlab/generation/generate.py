"""``generate``: autoregressive decoding with the KV cache (greedy, sampling, or beam search).

"At each step the model is auto-regressive, consuming the previously generated symbols as
additional input when generating the next" (§3). A *prefill* runs the whole prompt (decoder-only)
or the encoder and BOS (encoder-decoder) once, filling the :class:`~attnlab.layers.KVCache`; then
each step feeds the one new token per row (a recurrent model, Mamba or an LSTM/GRU, carries its
constant-size state instead: :mod:`attnlab.generation.recurrent`). The next token is the arg-max
(greedy) or a draw from ``softmax`` of the processed logits (temperature, top-k, top-p, min-p:
:mod:`attnlab.generation.processors`), with an optional seeded ``torch.Generator``. A row stops at
any of its EOS ids and is padded with ``pad_id`` after it; the loop stops when every row has.
:func:`stream` yields each step as it is produced; :func:`generate` collects them, or runs
:func:`~attnlab.generation.beam.beam_search` for ``num_beams > 1``.

Prompts of different lengths are left-padded (:mod:`attnlab.generation.prompts`); every row's
tokens and logits equal those of the row decoded alone (up to float rounding). Everything runs
under ``torch.inference_mode`` with the model in eval mode (its mode is restored afterwards):
returned tensors are inference tensors, fine to read, index and concatenate.

Shapes: B prompts, R ``num_return_sequences``, N generated tokens (<= ``max_new_tokens``),
V vocabulary.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

import torch
from torch import Tensor, nn

from attnlab.generation.beam import beam_search
from attnlab.generation.config import GenerationConfig, resolve_config
from attnlab.generation.engines import DecodeSession, EngineChoice, resolve_engine, runner_for
from attnlab.generation.memory import check_call_memory
from attnlab.generation.processors import (
    LogitsProcessor,
    build_processors,
    check_finite_logits,
    select_tokens,
)
from attnlab.generation.prompts import PromptInput
from attnlab.generation.request import (
    GenerationRequest,
    StepOutput,
    eval_mode,
    open_session,
    prepare_request,
    repeat_index,
)
from attnlab.generation.speculative import (
    DEFAULT_DRAFT_TOKENS,
    speculative_generate,
    speculative_stream,
)
from attnlab.models.base import IMPLEMENTATIONS


def stream(
    model: nn.Module,
    input_ids: PromptInput,
    config: GenerationConfig | None = None,
    *,
    attention_mask: Tensor | None = None,
    processors: Iterable[LogitsProcessor] = (),
    generator: torch.Generator | None = None,
    draft_model: nn.Module | None = None,
    num_draft_tokens: int | None = None,
    decode_session: DecodeSession | None = None,
    **options: Any,
) -> Iterator[StepOutput]:
    """Greedy or sampled decoding, one :class:`StepOutput` per generated token.

    Arguments are checked at the call (not at the first ``next``); see :func:`generate` for
    them (beam search does not stream). The model stays in eval mode until the iterator is
    exhausted or closed. With a ``draft_model`` the iterator is a
    :class:`~attnlab.generation.speculative.SpeculativeStream` (its ``stats`` the acceptance
    statistics), and tokens come in bursts, one per verification round.

    Raises:
        ValueError: as :func:`generate`, and for ``num_beams > 1``.
    """
    cfg = resolve_config(config, options)
    if draft_model is not None or num_draft_tokens is not None:
        return speculative_stream(
            model, _draft(draft_model, num_draft_tokens), input_ids, cfg,
            num_draft_tokens=_k(num_draft_tokens),
            attention_mask=attention_mask, processors=processors, generator=generator,
        )  # fmt: skip
    if cfg.num_beams > 1:
        raise ValueError("beam search does not stream: use generate() or beam_search()")
    request = prepare_request(model, input_ids, cfg, attention_mask=attention_mask)
    sample = cfg.sampling
    chain = build_processors(
        temperature=cfg.temperature if sample else 1.0,
        top_k=cfg.top_k if sample else None,
        top_p=cfg.top_p if sample else None,
        min_p=cfg.min_p if sample else None,
        extra=processors,
    )
    rows = request.prompts.batch_size * cfg.num_return_sequences
    choice = resolve_engine(
        model, cfg.engine, rows=rows, max_new_tokens=request.max_new_tokens,
        use_cache=cfg.use_cache, held=decode_session is not None,
    )  # fmt: skip
    check_call_memory(request, cfg, choice=choice, held=decode_session is not None)
    return _steps(request, chain, sample, generator, cfg, choice, decode_session)


def _steps(
    request: GenerationRequest,
    chain: LogitsProcessor,
    sample: bool,
    generator: torch.Generator | None,
    cfg: GenerationConfig,
    choice: EngineChoice,
    decode_session: DecodeSession | None,
) -> Iterator[StepOutput]:
    """The decoding loop. Grad mode is switched off per step, not across ``yield``."""
    model, eos, pad = request.model, request.eos, request.pad_id
    num_return_sequences = cfg.num_return_sequences
    rows = request.prompts.batch_size * num_return_sequences
    with eval_mode(model), runner_for(model, choice, rows, decode_session) as runner:
        with torch.inference_mode():
            session = open_session(request, use_cache=cfg.use_cache, runner=runner)
            logits = session.prefill()  # (B, V)
            B = logits.shape[0]
            if num_return_sequences > 1:
                index = repeat_index(B, num_return_sequences, logits.device)
                session.select(index)
                logits = logits.index_select(0, index)  # (B·R, V)
            finished = torch.zeros(logits.shape[0], dtype=torch.bool, device=logits.device)
        for t in range(request.max_new_tokens):
            with torch.inference_mode():
                check_finite_logits(logits, t)
                tokens = select_tokens(chain(logits.float()), sample=sample, generator=generator)
                tokens = tokens.masked_fill(finished, pad)  # (B·R,)
                if eos.numel():
                    finished = finished | torch.isin(tokens, eos)
            yield StepOutput(tokens=tokens, logits=logits, finished=finished)
            if t + 1 == request.max_new_tokens or bool(finished.all()):
                return
            with torch.inference_mode():
                logits = session.step(tokens)


def generate(
    model: nn.Module,
    input_ids: PromptInput,
    config: GenerationConfig | None = None,
    *,
    attention_mask: Tensor | None = None,
    processors: Iterable[LogitsProcessor] = (),
    generator: torch.Generator | None = None,
    draft_model: nn.Module | None = None,
    num_draft_tokens: int | None = None,
    decode_session: DecodeSession | None = None,
    **options: Any,
) -> Tensor:
    """Generate up to ``max_new_tokens`` tokens after each prompt (or for each source).

    Args:
        model: a :class:`~attnlab.GPT` or a recurrent LM (``MambaLM``, ``RNNLM``:
            ``input_ids`` are prompts) or an :class:`~attnlab.EncoderDecoderTransformer`
            (``input_ids`` are sources; the target starts from ``config.bos_id``).
        input_ids: ``(B, T)`` or ``(T,)`` token ids, or a list of prompts of different lengths
            (1-D tensors or int lists), which are padded for you.
        config: a :class:`~attnlab.generation.GenerationConfig` (default: its defaults).
        attention_mask: ``(B, T)``, 1/True for real tokens of a tensor ``input_ids`` (any
            padding layout; default: all real for GPT, ``ids != pad_id`` for sources).
        processors: extra logits processors, applied after the built-in ones (also greedy).
        generator: a seeded ``torch.Generator`` for reproducible sampling.
        draft_model: a smaller GPT on the same vocabulary for speculative decoding
            (:mod:`attnlab.generation.speculative`): the same tokens (greedy) or the same
            distribution (sampling), fewer target forwards; its acceptance statistics are
            logged at INFO level (``speculative_generate`` returns them).
        num_draft_tokens: ``k``, the draft's proposals per target forward (default 4).
        decode_session: a :class:`~attnlab.generation.engines.DecodeSession` held across calls
            (the fused engine's copies made once), used when the call runs the fused engine.
        options: :class:`~attnlab.generation.GenerationConfig` fields overriding ``config``
            (``max_new_tokens``, ``do_sample``, ``temperature``, ``top_k``, ``top_p``,
            ``min_p``, ``num_beams``, ``length_penalty``, ``length_norm``,
            ``num_return_sequences``, ``eos_id``, ``pad_id``, ``use_cache``, ``context``,
            ``engine``: ``"auto"``, ``"eager"`` or ``"fused"``, see
            :mod:`attnlab.generation.engines`; ``memory_check``).

    Shapes:
        returns ``(B·R, N)`` int64: the new tokens only (no prompt), ``N <= max_new_tokens``,
        padded with ``pad_id`` after each row's EOS; rows ``b·R .. b·R + R - 1`` belong to
        prompt ``b``.

    Raises:
        TypeError: for a model that cannot generate, or an option of the wrong type.
        ValueError: for empty prompts, ids outside the vocabulary, an unknown option, and the
            option errors of :class:`~attnlab.generation.GenerationConfig`; with a draft, for
            different vocabularies, a bad ``num_draft_tokens``, beam search or no cache.
        ContextLengthError: (a ``ValueError``) when the prompt or the new tokens do not fit
            the context under the ``context`` policy.
        MemoryLimitError: (a ``ValueError``) before anything is allocated, when the call's
            estimated memory (KV cache, token buffers, a step's tensors, beam search's
            candidates) exceeds the memory available; ``memory_check=False`` skips the check
            (:mod:`attnlab.generation.memory`).
    """
    cfg = resolve_config(config, options)
    if draft_model is not None or num_draft_tokens is not None:
        return speculative_generate(
            model, _draft(draft_model, num_draft_tokens), input_ids, cfg,
            num_draft_tokens=_k(num_draft_tokens),
            attention_mask=attention_mask, processors=processors, generator=generator,
        ).sequences  # fmt: skip
    if cfg.num_beams > 1:
        return beam_search(
            model, input_ids, cfg, attention_mask=attention_mask, processors=processors,
            decode_session=decode_session,
        ).sequences  # fmt: skip
    steps = stream(
        model, input_ids, cfg, attention_mask=attention_mask, processors=processors,
        generator=generator, decode_session=decode_session,
    )  # fmt: skip
    return torch.stack([step.tokens for step in steps], dim=1)  # (B·R, N)


def _draft(draft_model: nn.Module | None, num_draft_tokens: int | None) -> nn.Module:
    """The draft model, refusing ``num_draft_tokens`` without one."""
    if draft_model is None:
        raise ValueError(f"num_draft_tokens={num_draft_tokens!r} needs a draft_model to propose")
    return draft_model


def _k(num_draft_tokens: int | None) -> int:
    return DEFAULT_DRAFT_TOKENS if num_draft_tokens is None else num_draft_tokens


# ``model.generate(...)`` (attnlab.models.base.GenerationMixin) calls this function.
IMPLEMENTATIONS.add("generate", generate)


__all__ = ["StepOutput", "generate", "stream"]
