"""``generate``: autoregressive decoding with the KV cache (greedy, sampling, or beam search).

"At each step the model is auto-regressive, consuming the previously generated symbols as
additional input when generating the next" (§3). A *prefill* runs the whole prompt (decoder-only)
or the encoder and BOS (encoder-decoder) once, filling the :class:`~attnlab.layers.KVCache`; then
each step feeds the one new token per row. The next token is the arg-max (greedy) or a draw from
``softmax`` of the processed logits (temperature, top-k, top-p, min-p:
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
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from attnlab.generation.beam import LengthNorm, beam_search
from attnlab.generation.layout import decode_layout
from attnlab.generation.processors import LogitsProcessor, build_processors, select_tokens
from attnlab.generation.prompts import PromptInput
from attnlab.generation.request import (
    EosIds,
    GenerationRequest,
    eval_mode,
    open_session,
    prepare_request,
    repeat_index,
)
from attnlab.models.gpt import GPT
from attnlab.models.transformer import EncoderDecoderTransformer


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


def _check_sampling(
    do_sample: bool,
    temperature: float,
    top_k: int | None,
    top_p: float | None,
    min_p: float | None,
    num_return_sequences: int,
) -> None:
    build_processors(temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p)  # validates
    if not do_sample:
        given = [
            name
            for name, value, default in (
                ("temperature", temperature, 1.0),
                ("top_k", top_k, None),
                ("top_p", top_p, None),
                ("min_p", min_p, None),
            )
            if value != default and not (name == "temperature" and value == 0)
        ]
        if given:
            raise ValueError(f"{', '.join(given)} only apply when sampling: pass do_sample=True")
        if num_return_sequences != 1:
            raise ValueError(
                "num_return_sequences > 1 needs do_sample=True or num_beams > 1 "
                "(greedy decoding returns one sequence per prompt)"
            )
    if num_return_sequences < 1:
        raise ValueError(f"num_return_sequences must be >= 1, got {num_return_sequences}")


def stream(
    model: nn.Module,
    input_ids: PromptInput,
    *,
    max_new_tokens: int,
    attention_mask: Tensor | None = None,
    do_sample: bool = False,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    min_p: float | None = None,
    processors: Iterable[LogitsProcessor] = (),
    generator: torch.Generator | None = None,
    eos_id: EosIds = None,
    pad_id: int | None = None,
    num_return_sequences: int = 1,
    use_cache: bool = True,
    truncate: bool = False,
) -> Iterator[StepOutput]:
    """Greedy or sampled decoding, one :class:`StepOutput` per generated token.

    Arguments are checked at the call (not at the first ``next``); see :func:`generate` for
    them. The model stays in eval mode until the iterator is exhausted or closed.

    Raises:
        ValueError: as :func:`generate`.
    """
    _check_sampling(do_sample, temperature, top_k, top_p, min_p, num_return_sequences)
    request = prepare_request(
        model,
        input_ids,
        max_new_tokens=max_new_tokens,
        attention_mask=attention_mask,
        eos_id=eos_id,
        pad_id=pad_id,
        truncate=truncate,
    )
    sample = do_sample and temperature > 0
    chain = build_processors(
        temperature=temperature if sample else 1.0,
        top_k=top_k if sample else None,
        top_p=top_p if sample else None,
        min_p=min_p if sample else None,
        extra=processors,
    )
    return _steps(request, chain, sample, generator, num_return_sequences, use_cache)


def _steps(
    request: GenerationRequest,
    chain: LogitsProcessor,
    sample: bool,
    generator: torch.Generator | None,
    num_return_sequences: int,
    use_cache: bool,
) -> Iterator[StepOutput]:
    """The decoding loop. Grad mode is switched off per step, not across ``yield``."""
    model, eos, pad = request.model, request.eos, request.pad_id
    rows = request.prompts.batch_size * num_return_sequences
    with eval_mode(model), decode_layout(model, rows):
        with torch.inference_mode():
            session = open_session(request, use_cache=use_cache)
            logits = session.prefill()  # (B, V)
            B = logits.shape[0]
            if num_return_sequences > 1:
                index = repeat_index(B, num_return_sequences, logits.device)
                session.select(index)
                logits = logits.index_select(0, index)  # (B·R, V)
            finished = torch.zeros(logits.shape[0], dtype=torch.bool, device=logits.device)
        for t in range(request.max_new_tokens):
            with torch.inference_mode():
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
    *,
    max_new_tokens: int,
    attention_mask: Tensor | None = None,
    do_sample: bool = False,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    min_p: float | None = None,
    processors: Iterable[LogitsProcessor] = (),
    generator: torch.Generator | None = None,
    eos_id: EosIds = None,
    pad_id: int | None = None,
    num_beams: int = 1,
    length_penalty: float = 0.6,
    length_norm: str | LengthNorm = "gnmt",
    num_return_sequences: int = 1,
    use_cache: bool = True,
    truncate: bool = False,
) -> Tensor:
    """Generate up to ``max_new_tokens`` tokens after each prompt (or for each source).

    Args:
        model: a :class:`~attnlab.GPT` (``input_ids`` are prompts) or an
            :class:`~attnlab.EncoderDecoderTransformer` (``input_ids`` are sources; the target
            starts from ``config.bos_id``).
        input_ids: ``(B, T)`` or ``(T,)`` token ids, or a list of prompts of different lengths
            (1-D tensors or int lists), which are padded for you.
        max_new_tokens: the most tokens generated per row (EOS included).
        attention_mask: ``(B, T)``, 1/True for real tokens of a tensor ``input_ids`` (any
            padding layout; default: all real for GPT, ``ids != pad_id`` for sources).
        do_sample: sample from ``softmax(logits / temperature)`` after the filters; ``False``
            is greedy (the filters and ``temperature`` are then rejected).
        temperature: ``> 0``; ``0`` means greedy even when sampling.
        top_k, top_p, min_p: sampling filters (``top_p`` in ``(0, 1]``, ``min_p`` in ``[0, 1]``).
        processors: extra logits processors, applied after the built-in ones (also greedy).
        generator: a seeded ``torch.Generator`` for reproducible sampling.
        eos_id: stop id(s); default ``config.eos_id``; ``()`` never stops early.
        pad_id: written after a row's EOS; default ``config.pad_id``, else the first EOS, else 0.
        num_beams: ``> 1`` runs beam search (:func:`~attnlab.generation.beam.beam_search`,
            with ``length_penalty`` α and ``length_norm``; see there).
        num_return_sequences: R sequences per prompt (samples, or the best R beams); rows
            ``b·R .. b·R + R - 1`` belong to prompt ``b``.
        use_cache: ``False`` recomputes the whole prefix at every step (slow; a reference).
        truncate: lower ``max_new_tokens`` to fit the context instead of raising.

    Shapes:
        returns ``(B·R, N)`` int64: the new tokens only (no prompt), ``N <= max_new_tokens``,
        padded with ``pad_id`` after each row's EOS.

    Raises:
        TypeError: for a model that cannot generate.
        ValueError: for empty prompts, ids outside the vocabulary, a prompt longer than the
            context or ``max_new_tokens`` overflowing it (unless ``truncate``), ``num_beams < 1``,
            ``top_p`` outside ``(0, 1]``, and other bad arguments.
    """
    if isinstance(num_beams, bool) or not isinstance(num_beams, int) or num_beams < 1:
        raise ValueError(f"num_beams must be a positive integer, got {num_beams!r}")
    if num_beams > 1:
        if do_sample:
            raise ValueError("beam search is deterministic: do_sample=True needs num_beams=1")
        _check_sampling(False, temperature, top_k, top_p, min_p, 1)
        return beam_search(
            model,
            input_ids,
            max_new_tokens=max_new_tokens,
            num_beams=num_beams,
            length_penalty=length_penalty,
            length_norm=length_norm,
            num_return_sequences=num_return_sequences,
            attention_mask=attention_mask,
            eos_id=eos_id,
            pad_id=pad_id,
            processors=processors,
            use_cache=use_cache,
            truncate=truncate,
        ).sequences
    steps = stream(
        model,
        input_ids,
        max_new_tokens=max_new_tokens,
        attention_mask=attention_mask,
        do_sample=do_sample,
        temperature=temperature,
        top_k=top_k,
        top_p=top_p,
        min_p=min_p,
        processors=processors,
        generator=generator,
        eos_id=eos_id,
        pad_id=pad_id,
        num_return_sequences=num_return_sequences,
        use_cache=use_cache,
        truncate=truncate,
    )
    return torch.stack([step.tokens for step in steps], dim=1)  # (B·R, N)


def _generate_method(
    self: nn.Module, input_ids: PromptInput, *, max_new_tokens: int, **kwargs: Any
) -> Tensor:
    """``attnlab.generate(self, input_ids, max_new_tokens=..., **kwargs)``: the new tokens
    ``(B·R, N)``; see :func:`attnlab.generation.generate` for every option."""
    return generate(self, input_ids, max_new_tokens=max_new_tokens, **kwargs)


# The Hugging Face-style convenience ``model.generate(...)``, attached here: the model files know
# only their layers.
for _cls in (GPT, EncoderDecoderTransformer):
    setattr(_cls, "generate", _generate_method)  # noqa: B010


__all__ = ["StepOutput", "generate", "stream"]
