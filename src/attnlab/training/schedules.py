"""Learning-rate schedules as pure functions of the step, and their ``LambdaLR`` wrapper.

§5.3, eq. (3), the schedule of "Attention Is All You Need"::

    lrate = d_model^-0.5 · min(step_num^-0.5, step_num · warmup_steps^-1.5)

a linear warmup for ``warmup_steps`` steps, then decay proportional to the inverse square root of
the step; it peaks at ``step_num = warmup_steps`` with ``d_model^-0.5 · warmup_steps^-0.5``. Also
here: linear warmup + cosine decay (the common modern choice), warmup-stable-decay (WSD: a
constant peak for most of the run, then a short decay at its end) and a constant rate (with an
optional linear warmup).

Every schedule returns a *multiplier* of the optimizer's learning rate. The Noam schedule's values
are absolute learning rates (the paper uses no separate base rate), so use it with an optimizer
created with ``lr=1.0``; for cosine/constant, the optimizer's ``lr`` is the peak rate.

Steps count optimizer updates from 1 (the paper's ``step_num``). Step 0, "before the first
update", is defined as the limit of the warmup ramp, 0, for every schedule with warmup.
:func:`lambda_lr` hands ``LambdaLR``'s 0-based counter to the schedules as ``step + 1``, so the
first update already runs at step 1's rate instead of wasting an update at rate 0.

Deviations from the paper: the optional ``factor`` scales eq. (3) (the Annotated Transformer's
convention; the paper is ``factor=1``).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from typing import Any

from torch.optim import Optimizer
from torch.optim.lr_scheduler import LambdaLR

from attnlab.registry import Registry

Schedule = Callable[[int], float]

SCHEDULES: Registry[Callable[..., float]] = Registry("learning-rate schedule")


def _check_step(step: int) -> None:
    if step < 0:
        raise ValueError(f"step must be >= 0, got {step}")


@SCHEDULES.register("noam")
def noam(step: int, *, d_model: int, warmup: int = 4000, factor: float = 1.0) -> float:
    """Eq. (3): ``factor · d_model^-0.5 · min(step^-0.5, step · warmup^-1.5)``.

    Args:
        step: optimizer updates so far, from 1 (``0`` gives ``0.0``, the warmup ramp's start).
        d_model: the model width. warmup: ``warmup_steps`` (4000 in the paper).
        factor: a multiplier of the whole schedule (1 in the paper).

    Raises:
        ValueError: for a negative step or non-positive ``d_model``/``warmup``/``factor``.
    """
    _check_step(step)
    if d_model <= 0 or warmup <= 0 or factor <= 0:
        raise ValueError(
            f"d_model, warmup and factor must be positive, got {d_model}, {warmup}, {factor}"
        )
    if step == 0:
        return 0.0
    return factor * d_model**-0.5 * min(step**-0.5, step * warmup**-1.5)


@SCHEDULES.register("cosine")
def warmup_cosine(step: int, *, warmup: int, total_steps: int, min_ratio: float = 0.0) -> float:
    """Linear warmup from 0 to 1 over ``warmup`` steps, then a cosine from 1 to ``min_ratio``
    at ``total_steps`` (and ``min_ratio`` after it).

    Raises:
        ValueError: for a negative step or warmup, ``total_steps <= warmup``, or ``min_ratio``
            outside [0, 1].
    """
    _check_step(step)
    if warmup < 0 or total_steps <= warmup:
        raise ValueError(f"need 0 <= warmup < total_steps, got {warmup}, {total_steps}")
    if not 0.0 <= min_ratio <= 1.0:
        raise ValueError(f"min_ratio must be in [0, 1], got {min_ratio}")
    if step < warmup:
        return step / warmup
    progress = min(1.0, (step - warmup) / (total_steps - warmup))
    return min_ratio + (1.0 - min_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress))


WSD_DECAYS = ("linear", "sqrt", "cosine")


@SCHEDULES.register("wsd")
def warmup_stable_decay(
    step: int,
    *,
    warmup: int,
    total_steps: int,
    decay_fraction: float = 0.2,
    min_ratio: float = 0.0,
    decay: str = "linear",
) -> float:
    """Warmup-stable-decay (WSD): a linear warmup from 0 to 1 over ``warmup`` steps, 1 until the
    last ``D = round(decay_fraction · total_steps)`` steps, then a decay from 1 to ``min_ratio``
    at ``total_steps`` (and ``min_ratio`` after it).

    With ``p = (step - (total_steps - D)) / D`` in [0, 1] during the decay, the multiplier is
    ``min_ratio + (1 - min_ratio) · f(p)`` with ``f(p) = 1 - p`` (``"linear"``),
    ``1 - sqrt(p)`` (``"sqrt"``) or ``(1 + cos(π p)) / 2`` (``"cosine"``).

    Sources: the schedule of MiniCPM (Hu et al., 2024, "MiniCPM: Unveiling the Potential of
    Small Language Models with Scalable Training Strategies") and the "1 - sqrt" cooldown of
    Hägele et al., 2024 ("Scaling Laws and Compute-Optimal Training Beyond Fixed Training
    Durations"). Its use: the stable phase does not depend on the run's length, so a run can be
    continued from any stable-phase checkpoint and decayed where the budget ends.

    Raises:
        ValueError: for a negative step or warmup, ``decay_fraction`` outside (0, 1], a warmup
            that runs into the decay (``warmup > total_steps - D``), ``min_ratio`` outside
            [0, 1] or an unknown ``decay``.
    """
    _check_step(step)
    if not 0.0 < decay_fraction <= 1.0:
        raise ValueError(f"decay_fraction must be in (0, 1], got {decay_fraction}")
    if decay not in WSD_DECAYS:
        raise ValueError(f"unknown decay {decay!r}; valid: {', '.join(WSD_DECAYS)}")
    if not 0.0 <= min_ratio <= 1.0:
        raise ValueError(f"min_ratio must be in [0, 1], got {min_ratio}")
    decay_steps = max(1, round(decay_fraction * total_steps))
    start = total_steps - decay_steps  # the last step at the peak
    if warmup < 0 or total_steps < 1 or warmup > start:
        raise ValueError(
            f"need 0 <= warmup <= total_steps - decay steps, got warmup={warmup}, "
            f"total_steps={total_steps}, decay steps={decay_steps} (decay_fraction "
            f"{decay_fraction})"
        )
    if step < warmup:
        return step / warmup
    if step <= start:
        return 1.0
    progress = min(1.0, (step - start) / decay_steps)
    if decay == "linear":
        shape = 1.0 - progress
    elif decay == "sqrt":
        shape = 1.0 - math.sqrt(progress)
    else:
        shape = 0.5 * (1.0 + math.cos(math.pi * progress))
    return min_ratio + (1.0 - min_ratio) * shape


@SCHEDULES.register("constant")
def constant(step: int, *, warmup: int = 0) -> float:
    """``1.0``, after an optional linear warmup from 0 over ``warmup`` steps.

    Raises:
        ValueError: for a negative step or warmup.
    """
    _check_step(step)
    if warmup < 0:
        raise ValueError(f"warmup must be >= 0, got {warmup}")
    return min(1.0, step / warmup) if warmup else 1.0


def warmup_size(step: int, *, start: int, full: int, steps: int, multiple: int = 1) -> int:
    """A size that grows linearly from ``start`` to ``full`` over the first ``steps`` updates:
    the batch-size and sequence-length warmups of :class:`~attnlab.training.TrainConfig`.

    ``step`` is the 0-based index of the update (0: the first one). The size is
    ``start + (full - start) · step / steps`` rounded down to a multiple of ``multiple`` and
    clipped to ``[start, full]``; from ``step >= steps`` on (and always when ``steps == 0``) it is
    ``full``. Rounding keeps the number of distinct shapes small (``multiple`` 8 on a sequence
    of 128 gives at most 16 shapes, which matters to ``torch.compile`` and to kernel caches).

    Sources: batch-size warmup as in GPT-3 (Brown et al., 2020, appendix B: the batch grows
    over the first tokens) and sequence-length warmup (Li et al., 2022, "The Stability-
    Efficiency Dilemma: Investigating Sequence Length Warmup for Training GPT Models"); both
    ramps appear in the modded-nanogpt speedrun (the attention window grows during training).

    Raises:
        ValueError: for a negative step or steps, sizes outside ``1 <= start <= full`` or a
            ``multiple`` below 1.
    """
    _check_step(step)
    if steps < 0:
        raise ValueError(f"steps must be >= 0, got {steps}")
    if not 1 <= start <= full:
        raise ValueError(f"need 1 <= start <= full, got start={start}, full={full}")
    if multiple < 1:
        raise ValueError(f"multiple must be >= 1, got {multiple}")
    if steps == 0 or step >= steps:
        return full
    size = start + (full - start) * step // steps
    return min(full, max(start, size // multiple * multiple))


def make_schedule(name: str, **kwargs: Any) -> Schedule:
    """The schedule ``name`` (``SCHEDULES.keys()``) with its keyword arguments bound.

    Raises:
        ValueError: for an unknown name, listing the valid ones.
    """
    return functools.partial(SCHEDULES.get(name), **kwargs)


def lambda_lr(optimizer: Optimizer, schedule: Schedule) -> LambdaLR:
    """A ``LambdaLR`` multiplying each group's ``lr`` by ``schedule(step)``.

    ``LambdaLR`` counts from 0 (before the first ``scheduler.step()``); the schedule receives
    that count + 1, the paper's 1-based ``step_num`` of the update about to happen.
    """
    return LambdaLR(optimizer, lambda epoch: schedule(epoch + 1))


__all__ = [
    "SCHEDULES",
    "WSD_DECAYS",
    "Schedule",
    "constant",
    "lambda_lr",
    "make_schedule",
    "noam",
    "warmup_cosine",
    "warmup_size",
    "warmup_stable_decay",
]
