"""The memory check of a decoding call: refuse, before anything is allocated, a call whose
estimate exceeds the memory available, instead of failing in the allocator half-way.

:func:`~attnlab.generation.generate`, :func:`~attnlab.generation.stream`,
:func:`~attnlab.generation.beam_search` and speculative decoding call :func:`check_call_memory`
(or :func:`check_speculative_memory`) once the request is validated and its sizes are final
(after the context policy): the estimate is
:func:`attnlab.analysis.memory_check.estimate_generation`'s, less the weights the caller already
holds: the KV cache (or recurrent state), the ``(rows, P + N)`` token buffers, the ``(rows, V)``
tensors of a step, beam search's hypotheses and candidates, and the fused engine's weight copies
when the call makes them. It is compared with :func:`~attnlab.analysis.memory_check.
available_memory` (a CUDA device: its free memory) and a larger one raises
:class:`~attnlab.analysis.memory_check.MemoryLimitError` (a ``ValueError``) naming the estimate,
its parts and the figure it was compared with.

``GenerationConfig(memory_check=False)`` (``generate(..., memory_check=False)``; ``attnlab
generate --ignore-memory-check``) skips the check. It costs a few microseconds of arithmetic on
an ordinary call: a call estimated below :data:`CHECK_FLOOR` (64 MiB) is not compared, because
reading the available memory costs tens of microseconds (``/proc/meminfo`` and the cgroup files)
and such a call is not what the check is for.

Shapes: B prompts, K beams, R returned sequences, P prompt width, N new tokens, V vocabulary.
"""

from __future__ import annotations

from typing import Any, cast

from torch import nn

from attnlab.analysis.memory import DTYPE_BYTES
from attnlab.analysis.memory_check import (
    MemoryEstimate,
    check_fits,
    device_memory,
    estimate_generation,
    estimate_speculative,
)
from attnlab.generation.config import ContextLengthError, GenerationConfig
from attnlab.generation.engines import EngineChoice, engine_copy_numel
from attnlab.generation.request import GenerationRequest, fit_context
from attnlab.models.family import Kind, find_family

CHECK_FLOOR = 64 * 2**20  # calls estimated below this are not compared with the memory available
OPTION = "memory_check=False"  # what the message tells a caller to pass to skip the check


def decode_sizes(
    kind: Kind, *, prompt_len: int, max_new_tokens: int, window: int | None, use_cache: bool
) -> tuple[int | None, int]:
    """``(cache_len, recompute_len)`` of a call's standard session (:mod:`.session`): the
    positions its KV cache holds (``None`` for a recurrent model, which has a state) and the
    positions a step reruns without the cache (0: none).

    Args:
        kind: the model's kind. prompt_len, max_new_tokens: after the context policy.
        window: the ``context="slide"`` window (``None``: everything fits). use_cache: the
            config's.
    """
    P, N = prompt_len, max_new_tokens
    if kind is Kind.RECURRENT_LM:
        return None, 0
    if kind is Kind.SEQ2SEQ:
        return (max(N, 1), 0) if use_cache else (0, max(N, 1))
    seen = P + N if window is None else min(P + N, window)
    fits = window is None or window >= P
    cache_len = seen if use_cache and fits else 0
    return cache_len, (0 if use_cache and window is None else seen)


def planned_sizes(model_config: Any, prompt_len: int, config: GenerationConfig) -> dict[str, Any]:
    """The sizes of :func:`attnlab.analysis.memory_check.estimate_generation` for a call of
    ``config`` on prompts ``prompt_len`` wide, from the model's config alone (before it is
    loaded: the command line's check): ``max_new_tokens`` after the context policy, the cache
    and recompute lengths, the rows, the stop ids, sampling. Empty for a call the context policy
    refuses (it fails later, naming the policy) or a config of no generating family.
    """
    family = find_family(model_config)
    if family is None or not family.kind.generates:
        return {}
    kind = family.kind
    N, window = config.max_new_tokens, None
    if kind is not Kind.RECURRENT_LM:
        try:
            N, window = fit_context(prompt_len, config, model_config.max_seq_len,
                                    kind is Kind.SEQ2SEQ)  # fmt: skip
        except ContextLengthError:
            return {}
    cache_len, recompute_len = decode_sizes(
        kind, prompt_len=prompt_len, max_new_tokens=N, window=window, use_cache=config.use_cache
    )
    return {
        "prompt_len": prompt_len,
        "max_new_tokens": N,
        "num_beams": config.num_beams,
        "num_return_sequences": config.num_return_sequences,
        "cache_len": cache_len,
        "recompute_len": recompute_len,
        "n_eos": len(config.eos_ids or ()) or 1,
        "sampling": config.sampling,
    }


def _dtype(model: nn.Module) -> str | int:
    """The model's dtype by name (``"float32"``), or its bytes per element."""
    param = next(model.parameters(), None)
    if param is None:
        return "float32"
    name = str(param.dtype).removeprefix("torch.")
    return name if name in DTYPE_BYTES else param.element_size()


def _below_floor(estimate: MemoryEstimate | None) -> bool:
    """Whether ``estimate`` is absent or, less its weights, under :data:`CHECK_FLOOR`."""
    return estimate is None or estimate.total - estimate.parts.get("weights", 0) < CHECK_FLOOR


def _check(estimate: MemoryEstimate | None, device: Any, copies: int) -> None:
    """Compare ``estimate`` (less its weights) with the memory available, above the floor."""
    if estimate is None or _below_floor(estimate):
        return
    parts = {k: v for k, v in estimate.parts.items() if k != "weights"}  # already allocated
    if copies:
        parts["decode_copies"] = copies * 4  # float32 copies (the engine runs on the CPU)
    check_fits(MemoryEstimate(estimate.what, parts), available=device_memory(device), flag=OPTION)


def check_call_memory(
    request: GenerationRequest,
    config: GenerationConfig,
    *,
    choice: EngineChoice | None = None,
    held: bool = False,
) -> None:
    """Refuse ``request`` (greedy, sampling or beam search under ``config``) before anything is
    allocated when its estimate exceeds the memory available (see the module docstring).

    Args:
        choice: the decode engine the call runs on (the fused one copies weights unless
            ``held``: a :class:`~attnlab.generation.engines.DecodeSession` holds them).

    Raises:
        MemoryLimitError: (a ``ValueError``) naming the estimate, the memory available and the
            option that skips the check, ``memory_check=False``.
    """
    if not config.memory_check:
        return
    model, prompts = request.model, request.prompts
    family = find_family(model.config)  # the model's (request.family reads it from the model)
    if family is None:
        return
    P, N = prompts.width, request.max_new_tokens
    cache_len, recompute_len = decode_sizes(
        family.kind,
        prompt_len=P,
        max_new_tokens=N,
        window=request.window,
        use_cache=config.use_cache,
    )

    sizes: dict[str, Any] = {
        "batch": prompts.batch_size, "prompt_len": P, "max_new_tokens": N,
        "num_beams": config.num_beams, "num_return_sequences": config.num_return_sequences,
        "weight_bytes": 0, "cache_len": cache_len, "recompute_len": recompute_len,
        "n_eos": max(int(request.eos.numel()), 1), "sampling": config.sampling,
    }  # fmt: skip
    # first with 8 bytes per element, an upper bound whatever the model's dtype: an ordinary
    # call ends here, without reading the model's parameters or the memory available
    if _below_floor(estimate_generation(model.config, dtype=8, **sizes)):
        return
    fused = choice is not None and choice.name == "fused" and not held
    copies = engine_copy_numel(model, "fused") if fused else 0
    _check(estimate_generation(model.config, dtype=_dtype(model), **sizes), prompts.ids.device,
           copies)  # fmt: skip


def check_speculative_memory(
    request: GenerationRequest, config: GenerationConfig, draft_model: nn.Module, k: int
) -> None:
    """:func:`check_call_memory` for speculative decoding with ``draft_model`` proposing ``k``
    tokens per round (:func:`attnlab.analysis.memory_check.estimate_speculative`; the fused
    engines' copies are not counted).

    Raises:
        MemoryLimitError: as :func:`check_call_memory`.
    """
    if not config.memory_check:
        return
    model, prompts = request.model, request.prompts
    estimate = estimate_speculative(
        model.config, cast(Any, draft_model).config, batch=prompts.batch_size,
        prompt_len=prompts.width, max_new_tokens=request.max_new_tokens, num_draft_tokens=k,
        num_return_sequences=config.num_return_sequences, dtype=_dtype(model),
        weight_bytes=0, padded=prompts.mask is not None, sampling=config.sampling,
    )  # fmt: skip
    _check(estimate, prompts.ids.device, 0)


__all__ = [
    "CHECK_FLOOR",
    "OPTION",
    "check_call_memory",
    "check_speculative_memory",
    "decode_sizes",
    "planned_sizes",
]
