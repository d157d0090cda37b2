"""``GenerationConfig``: every option of a decoding call, in one validated object.

:func:`~attnlab.generation.generate`, :func:`~attnlab.generation.stream` and
:func:`~attnlab.generation.beam_search` take a ``GenerationConfig`` and/or its fields as keyword
arguments (``generate(model, ids, max_new_tokens=20, do_sample=True, top_p=0.9)``), so the
options are defined, documented and checked once, as Hugging Face's ``GenerationConfig`` does.

Context policies (``context``), for a prompt plus new tokens longer than the model's context
(``config.max_seq_len``):

- ``"slide"`` (default): decoder-only models keep generating on a sliding window of the last
  ``max_seq_len`` tokens, as nanoGPT's ``generate`` crops its context (a longer prompt is
  cropped the same way). Once the window slides, every step recomputes the window without the
  KV cache (exact, but each token then costs a forward pass over ``max_seq_len`` tokens). An
  encoder-decoder's output cannot slide: it stops at the context, as with ``"truncate"``.
- ``"truncate"``: lower ``max_new_tokens`` to what fits after the prompt.
- ``"error"``: raise :class:`ContextLengthError`.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Literal

from attnlab.config import Config, check_choice, check_positive

ContextPolicy = Literal["slide", "truncate", "error"]
CONTEXT_POLICIES = ("slide", "truncate", "error")
ENGINE_NAMES = ("auto", "eager", "fused")  # attnlab.generation.engines.ENGINES
LENGTH_NORM_NAMES = ("gnmt", "power")  # attnlab.generation.beam.LENGTH_NORMS


class ContextLengthError(ValueError):
    """A prompt or its new tokens do not fit the model's context under ``context="error"`` (or
    a prompt that no policy can fit). Attributes name the figures, so a command line can say
    which of its flags to change."""

    def __init__(self, message: str, *, context: int, prompt: int, room: int) -> None:
        super().__init__(message)
        self.context, self.prompt, self.room = context, prompt, room


@dataclass(frozen=True, kw_only=True)
class GenerationConfig(Config):
    """How to decode (defaults: greedy, 64 new tokens, the model's EOS id).

    Attributes:
        max_new_tokens: the most tokens generated per row (EOS included).
        do_sample: sample from ``softmax(logits / temperature)`` after the filters; ``False``
            is greedy (then the sampling options must keep their defaults).
        temperature: ``>= 0``; ``0`` means greedy even when sampling.
        top_k, top_p, min_p: sampling filters (``top_k >= 1``, ``top_p`` in ``(0, 1]``,
            ``min_p`` in ``[0, 1]``).
        num_beams: ``> 1`` runs beam search (§6.1: 4), with ``length_penalty`` α (§6.1: 0.6)
            and ``length_norm`` (``"gnmt"`` or ``"power"``).
        num_return_sequences: R sequences per prompt (samples, or the best R beams).
        eos_id: stop id(s); ``None``: the model config's ``eos_id``; ``()``: never stop early.
        pad_id: written after a row's EOS; ``None``: the config's ``pad_id``, else the first
            EOS, else 0.
        use_cache: ``False`` recomputes the whole prefix at every step (slow; a reference).
        context: what happens beyond the model's context (see the module docstring).
        engine: what runs the decoding steps: ``"auto"`` (default), ``"eager"`` (the model's
            own modules) or ``"fused"`` (the fused CPU engine); see
            :mod:`attnlab.generation.engines`. Every engine gives the eager path's tokens.
        memory_check: refuse, before allocating, a call whose estimated memory (KV cache, token
            buffers, a step's ``(rows, V)`` tensors, beam search's candidates, the fused
            engine's copies) exceeds the memory available, with a ``MemoryLimitError`` (a
            ``ValueError``) naming the estimate; ``False`` skips the check (``attnlab generate
            --ignore-memory-check``). See :mod:`attnlab.generation.memory`.
    """

    max_new_tokens: int = 64
    do_sample: bool = False
    temperature: float = 1.0
    top_k: int | None = None
    top_p: float | None = None
    min_p: float | None = None
    num_beams: int = 1
    length_penalty: float = 0.6
    length_norm: str = "gnmt"
    num_return_sequences: int = 1
    eos_id: int | tuple[int, ...] | None = None
    pad_id: int | None = None
    use_cache: bool = True
    context: ContextPolicy = "slide"
    engine: Literal["auto", "eager", "fused"] = "auto"
    memory_check: bool = True

    def validate(self) -> None:
        """Ranges and the combinations that cannot work together.

        Raises:
            ValueError: naming the option and its value.
        """
        check_positive(
            max_new_tokens=self.max_new_tokens, top_k=self.top_k, num_beams=self.num_beams,
            num_return_sequences=self.num_return_sequences,
        )  # fmt: skip
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0 (0: greedy), got {self.temperature}")
        if self.top_p is not None and not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.min_p is not None and not 0.0 <= self.min_p <= 1.0:
            raise ValueError(f"min_p must be in [0, 1], got {self.min_p}")
        check_choice("length_norm", self.length_norm, LENGTH_NORM_NAMES)
        check_choice("engine", self.engine, ENGINE_NAMES)
        for name, ids in (("eos_id", self.eos_ids or ()), ("pad_id", (self.pad_id,))):
            bad = [i for i in ids if i is not None and i < 0]
            if bad:
                raise ValueError(f"{name} must be a non-negative token id, got {bad[0]}")
        if self.num_beams > 1:
            if self.do_sample:
                raise ValueError("beam search is deterministic: do_sample=True needs num_beams=1")
            if self.num_return_sequences > self.num_beams:
                raise ValueError(
                    f"num_return_sequences must be in [1, num_beams={self.num_beams}], "
                    f"got {self.num_return_sequences}"
                )
        if not self.do_sample:
            given = [name for name, value, default in (
                ("temperature", self.temperature, 1.0), ("top_k", self.top_k, None),
                ("top_p", self.top_p, None), ("min_p", self.min_p, None),
            ) if value != default and not (name == "temperature" and value == 0)]  # fmt: skip
            if given:
                raise ValueError(
                    f"{', '.join(given)} only apply when sampling: pass do_sample=True"
                )
            if self.num_return_sequences != 1 and self.num_beams == 1:
                raise ValueError(
                    "num_return_sequences > 1 needs do_sample=True or num_beams > 1 "
                    "(greedy decoding returns one sequence per prompt)"
                )

    @property
    def eos_ids(self) -> tuple[int, ...] | None:
        """``eos_id`` as a tuple (``None`` when the model's should be used)."""
        if self.eos_id is None:
            return None
        return (self.eos_id,) if isinstance(self.eos_id, int) else tuple(self.eos_id)

    @property
    def sampling(self) -> bool:
        """Whether tokens are drawn (sampling with a positive temperature)."""
        return self.do_sample and self.temperature > 0


def resolve_config(config: GenerationConfig | None, options: dict[str, Any]) -> GenerationConfig:
    """``config`` (default: :class:`GenerationConfig`'s defaults) with ``options`` replaced.

    Raises:
        TypeError: for an option of the wrong type, or a ``config`` that is not one.
        ValueError: for an unknown option (listing the valid ones) or a bad value.
    """
    if config is not None and not isinstance(config, GenerationConfig):
        raise TypeError(f"config must be a GenerationConfig, got {type(config).__name__}")
    base = config if config is not None else GenerationConfig()
    if not options:
        return base
    names = [f.name for f in dataclasses.fields(GenerationConfig)]
    unknown = sorted(set(options) - set(names))
    if unknown:
        raise ValueError(f"unknown generation options {unknown}; valid: {names}")
    return dataclasses.replace(base, **options)


__all__ = [
    "CONTEXT_POLICIES",
    "ContextLengthError",
    "ContextPolicy",
    "GenerationConfig",
    "resolve_config",
]
