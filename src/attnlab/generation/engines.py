"""Decode engines: what runs a causal LM's decoding steps, chosen in one visible place.

``GenerationConfig(engine=...)`` (``attnlab generate --engine``) names it; every loop
(:func:`~attnlab.generation.generate`, :func:`~attnlab.generation.stream`, beam search,
speculative decoding) asks :func:`resolve_engine` and runs the session on what it returns:

- ``"eager"``: the model's own modules (``model.hidden_states``, ``model.lm_head``): the
  reference every engine is tested against;
- ``"fused"``: :class:`~attnlab.transforms.decode_engine.FusedDecoder`, which runs the layers
  from outside on decode-time weight copies (float32 on the CPU) or attnlab's C++ steps
  (int8/int4): for causal LMs whose family declares a decoder stack, on the CPU. It owns its
  copies for the call (or for the :class:`DecodeSession` a caller holds) and frees them at its
  end; the live model is never changed. Asked for a model it cannot run, it refuses;
- ``"auto"`` (the default): ``"fused"`` where it would do something (a copy that pays for the
  rows decoded, quantized q/k/v to join) and the call is long enough for its one-time copies
  to pay back (:data:`MIN_FUSED_TOKENS` new tokens, or a session held), else ``"eager"``.

The tokens are the same whatever the engine (greedy: bit for bit with the same projections,
within float rounding of the copies' kernels); only the speed and the memory held during the
call differ. :func:`engine_copy_numel` is what the memory check counts for the fused engine's
copies.

Shapes: B rows, T tokens, E d_model, V vocabulary.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Literal, Protocol, cast

from torch import Tensor, nn

from attnlab.models.family import Kind, find_family
from attnlab.transforms import decode_engine
from attnlab.transforms.decode_engine import FusedDecoder
from attnlab.transforms.decode_weights import copy_numel

EngineName = Literal["auto", "eager", "fused"]
ENGINES: tuple[str, ...] = ("auto", "eager", "fused")
# "auto" takes the fused engine for a call of at least this many new tokens: making the copies
# costs about one pass over the weights, which the faster steps pay back after a few tokens
# (measured on a 2-core AMD EPYC, 2026-12-06, GPT-2 small float32: copies 0.12-0.19 s; a step
# 29 -> 17 ms at batch 1 and 51 -> 18.5 ms at batch 8, so about 13 and 6 tokens to break even).
MIN_FUSED_TOKENS = 16


class Runner(Protocol):
    """What a causal-LM session calls: the model itself (eager) or a fused engine."""

    def hidden_states(
        self,
        ids: Tensor,
        *,
        mask: Tensor | None = None,
        positions: Tensor | None = None,
        cache: Any = None,
    ) -> Tensor: ...

    def lm_head(self, h: Tensor) -> Tensor: ...


@dataclass(frozen=True)
class EngineChoice:
    """The engine a call runs on, and why (what ``attnlab generate`` prints).

    Attributes:
        name: ``"eager"`` or ``"fused"``. requested: what the config asked for.
        reason: one line for a header or ``--json``.
    """

    name: str
    requested: str
    reason: str

    def describe(self) -> str:
        """``"fused (auto: ...)"`` / ``"eager"``."""
        return f"{self.name} ({self.reason})" if self.reason else self.name


def resolve_engine(
    model: nn.Module,
    requested: str,
    *,
    rows: int,
    max_new_tokens: int,
    use_cache: bool = True,
    held: bool = False,
) -> EngineChoice:
    """The engine a generation call of ``model`` runs on.

    Args:
        model: the model. requested: ``"auto"``, ``"eager"`` or ``"fused"``.
        rows: rows decoded together. max_new_tokens: the call's new tokens.
        use_cache: ``False`` (every step recomputes the prefix) always runs eager.
        held: a session the caller keeps for several calls (the copies are made once).

    Raises:
        ValueError: for an unknown engine, or ``"fused"`` for a model it cannot run.
    """
    if requested not in ENGINES:
        raise ValueError(f"unknown decode engine {requested!r}; valid: {', '.join(ENGINES)}")
    if requested == "eager":
        return EngineChoice("eager", requested, "asked for")
    why_not = decode_engine.supports(model)
    if requested == "fused":
        if why_not is not None:
            raise ValueError(f"engine='fused' cannot run this model: {why_not}; use 'eager'")
        if not use_cache:
            return EngineChoice("eager", requested, "use_cache=False recomputes every step")
        return EngineChoice("fused", requested, "asked for")
    if why_not is not None:
        return EngineChoice("eager", requested, f"auto: {why_not}")
    if not use_cache:
        return EngineChoice("eager", requested, "auto: no cache")
    if not decode_engine.gains(model, rows):
        return EngineChoice("eager", requested, "auto: no copy pays on this CPU")
    if not held and max_new_tokens < MIN_FUSED_TOKENS:
        return EngineChoice(
            "eager", requested, f"auto: {max_new_tokens} new tokens < {MIN_FUSED_TOKENS}"
        )
    return EngineChoice("fused", requested, "auto")


@contextmanager
def runner_for(
    model: nn.Module,
    choice: EngineChoice,
    rows: int,
    decode_session: DecodeSession | None = None,
) -> Iterator[Runner]:
    """The runner of ``choice`` for one call: ``model`` itself, a held session's engine, or a
    :class:`FusedDecoder` closed (its copies freed) when the block ends."""
    if choice.name != "fused":
        yield cast(Runner, model)
        return
    if decode_session is not None:
        yield decode_session.runner(model)
        return
    engine = FusedDecoder(model, rows)
    try:
        yield engine
    finally:
        engine.close()


def engine_copy_numel(model: nn.Module | Any, requested: str = "auto") -> int:
    """Elements of the weight copies the fused engine may hold during a call (0 for
    ``"eager"`` and for models it does not run): what the memory check counts."""
    if requested == "eager":
        return 0
    family = find_family(model)
    if family is None or family.kind is not Kind.CAUSAL_LM or family.decode_stack is None:
        return 0
    return copy_numel(model)


class DecodeSession:
    """A fused engine the caller holds across several generation calls (the copies are made
    once): ``with DecodeSession(model, rows=8) as s: attnlab.generate(model, ..., session=s)``.

    Args:
        model: a causal LM the fused engine runs. rows: rows each call decodes.

    Raises:
        ValueError: for a model the fused engine cannot run.
    """

    def __init__(self, model: nn.Module, *, rows: int = 1) -> None:
        why_not = decode_engine.supports(model)
        if why_not is not None:
            raise ValueError(f"a decode session needs the fused engine: {why_not}")
        self.model = model
        self.rows = rows
        self.engine: FusedDecoder | None = FusedDecoder(model, rows)

    def runner(self, model: nn.Module) -> Runner:
        """The engine, for a call on ``model`` (which must be the session's).

        Raises:
            ValueError: for another model, or a closed session.
        """
        if model is not self.model:
            raise ValueError("this decode session belongs to another model")
        if self.engine is None:
            raise ValueError("this decode session is closed")
        return self.engine

    def close(self) -> None:
        """Free the engine's copies."""
        if self.engine is not None:
            self.engine.close()
            self.engine = None

    def __enter__(self) -> DecodeSession:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


__all__ = [
    "ENGINES",
    "MIN_FUSED_TOKENS",
    "DecodeSession",
    "EngineChoice",
    "EngineName",
    "Runner",
    "engine_copy_numel",
    "resolve_engine",
    "runner_for",
]
