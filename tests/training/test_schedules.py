"""Closed forms of the learning-rate schedules (§5.3 eq. 3, warmup + cosine, WSD, constant)."""

from __future__ import annotations

import itertools
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
    assert SCHEDULES.keys() == ["constant", "cosine", "noam", "wsd"]
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


# -- warmup-stable-decay (issue 50, item 4) ---------------------------------------------------


@pytest.mark.parametrize("decay", ["linear", "sqrt", "cosine"])
@pytest.mark.parametrize("min_ratio", [0.0, 0.1])
def test_wsd_closed_form(decay: str, min_ratio: float) -> None:
    """Warmup 100, peak until step 800, then the last 20% of 1000 steps decay: each step's
    multiplier from the three phases' formulas, written out here."""
    warmup, total, fraction = 100, 1000, 0.2
    shapes = {"linear": lambda p: 1 - p, "sqrt": lambda p: 1 - math.sqrt(p),
              "cosine": lambda p: 0.5 * (1 + math.cos(math.pi * p))}  # fmt: skip
    for step in range(0, 1201):
        if step < warmup:
            expected = step / warmup
        elif step <= 800:
            expected = 1.0
        else:
            expected = min_ratio + (1 - min_ratio) * shapes[decay](min(1.0, (step - 800) / 200))
        wsd = SCHEDULES.get("wsd")
        got = wsd(step, warmup=warmup, total_steps=total, decay_fraction=fraction,
                  min_ratio=min_ratio, decay=decay)  # fmt: skip
        assert got == pytest.approx(expected, abs=1e-12), (step, got, expected)


def test_wsd_is_constant_through_the_stable_phase_and_ends_at_its_floor() -> None:
    f = make_schedule("wsd", warmup=10, total_steps=100, decay_fraction=0.3, min_ratio=0.05)
    assert [f(s) for s in (10, 40, 70)] == [1.0, 1.0, 1.0]
    assert f(71) < 1.0 and f(100) == pytest.approx(0.05) and f(500) == pytest.approx(0.05)
    values = [f(s) for s in range(70, 101)]
    assert all(a >= b for a, b in itertools.pairwise(values))  # decays monotonically


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [({"decay_fraction": 0.0}, "decay_fraction must be in"),
     ({"decay_fraction": 1.5}, "decay_fraction must be in"),
     ({"warmup": 90}, "warmup <= total_steps - decay steps"),
     ({"decay": "exp"}, "unknown decay 'exp'; valid: linear, sqrt, cosine"),
     ({"min_ratio": -0.1}, "min_ratio must be in")],
)  # fmt: skip
def test_wsd_refuses_bad_arguments(kwargs: dict[str, object], message: str) -> None:
    args: dict[str, object] = {"warmup": 10, "total_steps": 100, **kwargs}
    with pytest.raises(ValueError, match=message):
        SCHEDULES.get("wsd")(5, **args)


def test_the_trainer_runs_wsd_from_its_config() -> None:
    """``TrainConfig(schedule="wsd")`` reaches the optimizer: lr at the peak in the stable
    phase, at ``lr * min_lr_ratio`` after the last step; a warmup into the decay is refused."""
    from attnlab.training.config import TrainConfig
    from attnlab.training.optim import build_optimizer, build_scheduler

    config = TrainConfig(schedule="wsd", warmup=2, steps=10, decay_fraction=0.5, lr=0.1,
                         min_lr_ratio=0.2, wsd_decay="linear", optimizer="adamw")  # fmt: skip
    model = torch.nn.Linear(2, 2)
    optimizer = build_optimizer(model, config)
    scheduler = build_scheduler(optimizer, config, d_model=2)
    rates = []
    for _ in range(12):
        rates.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        scheduler.step()
    assert rates[:5] == pytest.approx([0.05, 0.1, 0.1, 0.1, 0.1])  # steps 1-5: warmup, stable
    assert rates[5:10] == pytest.approx([0.1 * (0.2 + 0.8 * (1 - p / 5)) for p in range(1, 6)])
    assert rates[10:] == pytest.approx([0.02, 0.02])
    with pytest.raises(ValueError, match="schedule='wsd' needs warmup <= steps - decay steps"):
        TrainConfig(schedule="wsd", warmup=6, steps=10, decay_fraction=0.5)
