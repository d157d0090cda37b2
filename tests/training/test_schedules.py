"""Closed forms of the learning-rate schedules (§5.3 eq. 3, warmup + cosine, constant)."""

from __future__ import annotations

import math

import pytest
import torch

from attnlab.training.schedules import (
    SCHEDULES,
    constant,
    lambda_lr,
    make_schedule,
    noam,
    warmup_cosine,
)


@pytest.mark.parametrize("step", [1, 7, 100, 400, 401, 1000, 123_456])
@pytest.mark.parametrize(("d_model", "warmup", "factor"), [(512, 4000, 1.0), (64, 400, 2.0)])
def test_noam_closed_form(step: int, d_model: int, warmup: int, factor: float) -> None:
    expected = factor * d_model**-0.5 * min(step**-0.5, step * warmup**-1.5)
    assert noam(step, d_model=d_model, warmup=warmup, factor=factor) == pytest.approx(expected)


def test_noam_peaks_at_warmup() -> None:
    d_model, warmup = 512, 4000
    values = [noam(s, d_model=d_model, warmup=warmup) for s in range(1, 3 * warmup)]
    assert max(range(len(values)), key=values.__getitem__) + 1 == warmup
    assert noam(warmup, d_model=d_model, warmup=warmup) == pytest.approx(
        d_model**-0.5 * warmup**-0.5
    )
    # Linear during warmup, inverse square root after it.
    assert noam(2000, d_model=d_model, warmup=warmup) == pytest.approx(
        noam(1000, d_model=d_model, warmup=warmup) * 2
    )
    assert noam(16000, d_model=d_model, warmup=warmup) == pytest.approx(
        noam(4000, d_model=d_model, warmup=warmup) / 2
    )


def test_step_zero_is_the_start_of_the_warmup_ramp() -> None:
    assert noam(0, d_model=512, warmup=10) == 0.0
    assert warmup_cosine(0, warmup=10, total_steps=100) == 0.0
    assert constant(0, warmup=10) == 0.0
    assert constant(0) == 1.0


def test_cosine_endpoints() -> None:
    kw = dict(warmup=10, total_steps=110, min_ratio=0.1)
    assert warmup_cosine(5, **kw) == pytest.approx(0.5)
    assert warmup_cosine(10, **kw) == pytest.approx(1.0)
    assert warmup_cosine(60, **kw) == pytest.approx(0.55)  # halfway: (1 + min_ratio) / 2
    assert warmup_cosine(110, **kw) == pytest.approx(0.1)
    assert warmup_cosine(10_000, **kw) == pytest.approx(0.1)
    assert warmup_cosine(0, warmup=0, total_steps=5) == pytest.approx(1.0)


def test_constant() -> None:
    assert [constant(s, warmup=4) for s in range(6)] == [0.0, 0.25, 0.5, 0.75, 1.0, 1.0]


def test_lambda_lr_hands_the_schedule_one_based_steps() -> None:
    param = torch.nn.Parameter(torch.zeros(1))
    opt = torch.optim.Adam([param], lr=1.0)
    schedule = make_schedule("noam", d_model=64, warmup=3)
    scheduler = lambda_lr(opt, schedule)
    seen = []
    for _ in range(6):
        seen.append(opt.param_groups[0]["lr"])
        opt.step()
        scheduler.step()
    assert seen == pytest.approx([schedule(s) for s in range(1, 7)])
    assert seen[0] > 0  # the first update is not wasted at lr 0


def test_registry_and_errors() -> None:
    assert SCHEDULES.keys() == ["constant", "cosine", "noam"]
    with pytest.raises(ValueError, match="unknown learning-rate schedule 'linear'"):
        make_schedule("linear")
    with pytest.raises(ValueError, match="step must be >= 0"):
        noam(-1, d_model=8)
    with pytest.raises(ValueError, match="positive"):
        noam(1, d_model=8, warmup=0)
    with pytest.raises(ValueError, match="warmup < total_steps"):
        warmup_cosine(1, warmup=10, total_steps=10)
    with pytest.raises(ValueError, match="min_ratio"):
        warmup_cosine(1, warmup=1, total_steps=10, min_ratio=1.5)
    assert math.isfinite(noam(10**9, d_model=8))
