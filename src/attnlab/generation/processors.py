"""Logits processors: temperature and the sampling filters top-k, top-p (nucleus) and min-p.

A processor is a callable ``logits (B, V) -> logits (B, V)``; processors compose left to right
(:class:`LogitsProcessorList`). Filters never renormalise: they set the logits of removed tokens
to ``-inf``, so a following ``softmax`` gives them probability 0 and ``argmax`` never picks them.
Every filter keeps at least one token (the most likely one).

- :class:`Temperature` ``t``: ``logits / t`` (``t < 1`` sharpens, ``t > 1`` flattens);
- :class:`TopK` ``k``: keep the ``k`` highest logits (and any tied with the ``k``-th);
- :class:`TopP` ``p``: keep the smallest set of most likely tokens whose probability reaches
  ``p`` (Holtzman et al. 2020, "nucleus sampling");
- :class:`MinP` ``p``: keep tokens whose probability is at least ``p`` times the top one's.

They are registered in :data:`LOGITS_PROCESSORS` by name; :func:`build_processors` builds the
usual chain in the usual order (temperature, top-k, top-p, min-p, as Hugging Face applies them).

Shapes: B batch rows, V vocabulary.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from typing import Protocol

import torch
from torch import Tensor

from attnlab.registry import Registry


class LogitsProcessor(Protocol):
    """``logits (B, V) -> logits (B, V)``; removed tokens get ``-inf``."""

    def __call__(self, logits: Tensor) -> Tensor: ...


def _check_logits(logits: Tensor) -> None:
    if logits.dim() != 2:
        raise ValueError(f"logits must be (B, V), got shape {tuple(logits.shape)}")


class Temperature:
    """Divide the logits by ``temperature`` > 0 (``0`` means greedy: see :func:`select_tokens`).

    Each row's maximum is subtracted first (softmax does not change): the result is ``<= 0``
    with a 0 at the arg-max, so even a tiny temperature (1e-45) gives ``-inf`` elsewhere and a
    valid distribution (the greedy one), never ``inf - inf = nan``.

    Raises:
        ValueError: if ``temperature`` is not a positive finite number.
    """

    def __init__(self, temperature: float) -> None:
        if not (temperature > 0 and math.isfinite(temperature)):
            raise ValueError(f"temperature must be a finite number > 0 here, got {temperature}")
        self.temperature = float(temperature)

    def __call__(self, logits: Tensor) -> Tensor:
        _check_logits(logits)
        top = logits.amax(dim=-1, keepdim=True)  # (B, 1)
        shifted = torch.where(torch.isfinite(top), logits - top, logits)  # a row of -inf stays
        return shifted / self.temperature

    def __repr__(self) -> str:
        return f"Temperature({self.temperature})"


class TopK:
    """Keep the ``k`` largest logits per row (ties with the ``k``-th kept too).

    Raises:
        ValueError: if ``k`` is not a positive integer.
    """

    def __init__(self, k: int) -> None:
        if isinstance(k, bool) or not isinstance(k, int) or k < 1:
            raise ValueError(f"top_k must be a positive integer, got {k!r}")
        self.k = k

    def __call__(self, logits: Tensor) -> Tensor:
        _check_logits(logits)
        k = min(self.k, logits.shape[-1])
        kth = torch.topk(logits, k, dim=-1).values[:, -1:]  # (B, 1)
        return logits.masked_fill(logits < kth, float("-inf"))

    def __repr__(self) -> str:
        return f"TopK({self.k})"


class TopP:
    """Nucleus filter: keep the most likely tokens until their probability reaches ``p``.

    A token is kept when the probability of the tokens ranked strictly above it is below ``p``,
    so the kept set is the smallest whose mass is ``>= p`` (the top token is always kept;
    ``p = 1`` keeps everything). Ties are ranked by ``torch.sort`` (stable) order.

    Raises:
        ValueError: if ``p`` is outside ``(0, 1]``.
    """

    def __init__(self, p: float) -> None:
        if not 0.0 < p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {p}")
        self.p = float(p)

    def __call__(self, logits: Tensor) -> Tensor:
        _check_logits(logits)
        if self.p >= 1.0:
            return logits
        sorted_logits, order = torch.sort(logits, dim=-1, descending=True, stable=True)
        probs = sorted_logits.float().softmax(dim=-1)  # (B, V), descending
        mass_before = probs.cumsum(dim=-1) - probs  # (B, V): mass of higher-ranked tokens
        remove_sorted = mass_before >= self.p
        remove_sorted[:, 0] = False
        remove = torch.zeros_like(remove_sorted).scatter(-1, order, remove_sorted)
        return logits.masked_fill(remove, float("-inf"))

    def __repr__(self) -> str:
        return f"TopP({self.p})"


class MinP:
    """Keep tokens whose probability is ``>= p · max probability`` (Nguyen et al. 2024).

    Raises:
        ValueError: if ``p`` is outside ``[0, 1]``.
    """

    def __init__(self, p: float) -> None:
        if not 0.0 <= p <= 1.0:
            raise ValueError(f"min_p must be in [0, 1], got {p}")
        self.p = float(p)

    def __call__(self, logits: Tensor) -> Tensor:
        _check_logits(logits)
        probs = logits.float().softmax(dim=-1)  # (B, V)
        threshold = self.p * probs.max(dim=-1, keepdim=True).values  # (B, 1)
        return logits.masked_fill(probs < threshold, float("-inf"))

    def __repr__(self) -> str:
        return f"MinP({self.p})"


class LogitsProcessorList(list[LogitsProcessor]):
    """Processors applied in order; an empty list is the identity."""

    def __call__(self, logits: Tensor) -> Tensor:
        for processor in self:
            logits = processor(logits)
        return logits


LOGITS_PROCESSORS: Registry[Callable[..., LogitsProcessor]] = Registry("logits processor")
LOGITS_PROCESSORS.add("temperature", Temperature)
LOGITS_PROCESSORS.add("top_k", TopK)
LOGITS_PROCESSORS.add("top_p", TopP)
LOGITS_PROCESSORS.add("min_p", MinP)


def build_processors(
    *,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    min_p: float | None = None,
    extra: Iterable[LogitsProcessor] = (),
) -> LogitsProcessorList:
    """The chain temperature -> top-k -> top-p -> min-p -> ``extra``, skipping no-ops.

    ``temperature`` 1 and ``0`` add no processor (``0`` is greedy, handled by the caller).

    Raises:
        ValueError: for a negative temperature, ``top_k < 1``, ``top_p`` outside ``(0, 1]`` or
            ``min_p`` outside ``[0, 1]``.
    """
    if temperature < 0:
        raise ValueError(f"temperature must be >= 0 (0 = greedy), got {temperature}")
    chain = LogitsProcessorList()
    if temperature not in (0.0, 1.0):
        chain.append(Temperature(temperature))
    if top_k is not None:
        chain.append(TopK(top_k))
    if top_p is not None:
        chain.append(TopP(top_p))
    if min_p is not None:
        chain.append(MinP(min_p))
    chain.extend(extra)
    return chain


class NonFiniteLogitsError(ValueError):
    """The model's next-token logits hold NaN or infinite values (non-finite weights or inputs,
    or an overflow): decoding stops instead of emitting arbitrary tokens."""


def check_finite_logits(logits: Tensor, step: int, *, model: str = "the model") -> None:
    """Raise :class:`NonFiniteLogitsError` if the raw logits ``(B, V)`` of decoding step
    ``step`` (0: the prefill's) hold a non-finite value, naming the first such row and
    ``model`` (which model computed them: ``"the draft model"`` in speculative decoding)."""
    # A sum of finite values is finite unless it overflows, and a sum with a NaN or an infinity
    # is not: one float32 reduction and one read settle the common case (0.17 ms of a 7 ms
    # quantized GPT-2 step went to the float64 check below, its code cold after the weights).
    if math.isfinite(logits.sum(dtype=torch.float32).item()):
        return
    # A row's float64 sum is finite exactly when all its float32 values are (it cannot overflow:
    # V * float32's max is far below float64's), and sum - sum is NaN, not 0, otherwise.
    total = logits.sum(dim=-1, dtype=torch.float64)  # (B,)
    bad = (total - total) != 0
    if bool(bad.any()):
        row = int(bad.nonzero()[0, 0])
        kind = "NaN" if bool(torch.isnan(logits[row]).any()) else "infinite"
        raise NonFiniteLogitsError(
            f"{model}'s next-token logits are {kind} at step {step} (sequence {row}): its "
            "weights or inputs hold non-finite values, or the computation overflowed; no "
            "token was chosen from them"
        )


def select_tokens(
    logits: Tensor, *, sample: bool, generator: torch.Generator | None = None
) -> Tensor:
    """Next tokens from processed logits: ``argmax`` or one draw from ``softmax(logits)``.

    Shapes:
        logits ``(B, V)`` -> ``(B,)`` int64.
    """
    if not sample:  # max's index is argmax's (the first maximum), in less CPU time
        return logits.max(dim=-1).indices
    probs = logits.float().softmax(dim=-1)  # (B, V)
    return torch.multinomial(probs, 1, generator=generator).squeeze(-1)


__all__ = [
    "LOGITS_PROCESSORS",
    "LogitsProcessor",
    "LogitsProcessorList",
    "MinP",
    "NonFiniteLogitsError",
    "Temperature",
    "TopK",
    "TopP",
    "build_processors",
    "check_finite_logits",
    "select_tokens",
]
