"""The benchmark statistics (issue 51): Welch's t-test and the t CDF, against SciPy where it is
installed and against values that hold without it."""

from __future__ import annotations

import math

import pytest

from attnlab.analysis.stats import (
    regularized_incomplete_beta,
    student_t_cdf,
    summarize,
    welch_t_test,
)


def test_closed_forms_hold() -> None:
    # df = 1 is the Cauchy distribution: P(T <= t) = 1/2 + atan(t)/pi
    for t in (-30.0, -2.0, -0.3, 0.0, 0.7, 5.0):
        assert student_t_cdf(t, 1.0) == pytest.approx(0.5 + math.atan(t) / math.pi, abs=1e-12)
    # df = 2: P(T <= t) = 1/2 + t / (2 sqrt(2 + t^2))
    for t in (-4.0, -1.0, 0.5, 3.0):
        assert student_t_cdf(t, 2.0) == pytest.approx(
            0.5 + t / (2 * math.sqrt(2 + t * t)), abs=1e-12
        )
    # I_x(a, 1) = x^a and I_x(1, b) = 1 - (1 - x)^b
    assert regularized_incomplete_beta(0.3, 2.5, 1.0) == pytest.approx(0.3**2.5, rel=1e-12)
    assert regularized_incomplete_beta(0.3, 1.0, 4.0) == pytest.approx(1 - 0.7**4, rel=1e-12)


def test_welch_equals_a_hand_computed_case() -> None:
    a, b = [1.60, 1.62, 1.61], [1.70, 1.66, 1.68]
    r = welch_t_test(a, b)
    va, vb = 0.0001 / 3, 0.0004 / 3  # sample variances 1e-4 and 4e-4, n = 3
    assert r.t == pytest.approx((1.61 - 1.68) / math.sqrt(va + vb), rel=1e-9)
    assert r.df == pytest.approx((va + vb) ** 2 / (va**2 / 2 + vb**2 / 2), rel=1e-9)
    assert r.p < 0.05 and r.p_less == pytest.approx(r.p / 2, rel=1e-9)
    s = summarize(a)
    assert (s.n, s.low, s.high) == (3, 1.60, 1.62) and s.std == pytest.approx(0.01)


def test_welch_matches_scipy() -> None:
    stats = pytest.importorskip("scipy.stats")
    samples = [([1.0, 2.0, 3.5], [2.5, 3.1, 4.0, 4.4]), ([0.1, 0.12, 0.11], [0.1, 0.13, 0.09]),
               ([5.0, 5.5], [1.0, 9.0, 3.0])]  # fmt: skip
    for a, b in samples:
        ours = welch_t_test(a, b)
        ref = stats.ttest_ind(a, b, equal_var=False)
        assert ours.t == pytest.approx(float(ref.statistic), rel=1e-10)
        assert ours.p == pytest.approx(float(ref.pvalue), rel=1e-8)
    for df in (0.7, 3.3, 40.0, 1e4):
        for t in (-8.0, -1.1, 0.2, 2.6):
            assert student_t_cdf(t, df) == pytest.approx(float(stats.t.cdf(t, df)), rel=1e-9)


def test_degenerate_and_bad_samples() -> None:
    assert welch_t_test([1.0, 1.0], [1.0, 1.0]).p == 1.0
    r = welch_t_test([1.0, 1.0], [2.0, 2.0])
    assert r.t == -math.inf and r.p == 0.0 and r.p_less == 0.0
    with pytest.raises(ValueError, match="two or more values per sample, got 1 and 2"):
        welch_t_test([1.0], [1.0, 2.0])
    with pytest.raises(ValueError, match="finite values"):
        summarize([1.0, math.nan])
    with pytest.raises(ValueError, match="df must be > 0, got 0"):
        student_t_cdf(1.0, 0)
