"""Small-sample statistics for benchmark tables: mean, spread and Welch's t-test.

A claim that one training recipe beats another at a budget rests on a few seeds each, with
unequal spreads, so the comparison is Welch's unequal-variance t-test (Welch 1947):

    t  = (mean_a - mean_b) / sqrt(s_a^2 / n_a + s_b^2 / n_b)
    df = (s_a^2/n_a + s_b^2/n_b)^2 / ((s_a^2/n_a)^2 / (n_a - 1) + (s_b^2/n_b)^2 / (n_b - 1))

(the Welch-Satterthwaite degrees of freedom), and the p-value is the Student t distribution's
tail at ``|t|`` with ``df`` degrees of freedom. The t CDF is computed here through the
regularised incomplete beta function ``I_x(df/2, 1/2)`` by its continued fraction (modified
Lentz), so benchmarks need no SciPy; tests compare it with SciPy where that is installed.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Summary:
    """``n`` values' mean, sample standard deviation (``n - 1``; 0 for one value), min, max."""

    n: int
    mean: float
    std: float
    low: float
    high: float


def summarize(values: Sequence[float]) -> Summary:
    """:class:`Summary` of ``values``.

    Raises:
        ValueError: for no values or a non-finite one.
    """
    xs = [float(v) for v in values]
    if not xs:
        raise ValueError("summarize needs at least one value, got none")
    if not all(math.isfinite(x) for x in xs):
        raise ValueError(f"summarize needs finite values, got {xs}")
    n = len(xs)
    mean = sum(xs) / n
    var = sum((x - mean) ** 2 for x in xs) / (n - 1) if n > 1 else 0.0
    return Summary(n, mean, math.sqrt(var), min(xs), max(xs))


@dataclass(frozen=True)
class WelchResult:
    """Welch's test of ``mean(a) != mean(b)``: ``t``, the degrees of freedom ``df``, the
    two-sided ``p``, and the one-sided ``p_less`` of ``mean(a) < mean(b)``."""

    t: float
    df: float
    p: float
    p_less: float


def welch_t_test(a: Sequence[float], b: Sequence[float]) -> WelchResult:
    """Welch's unequal-variance t-test of two samples (see the module's equations).

    Two samples without spread (every value equal in each) give ``t = ±inf`` and ``p = 0``
    when their means differ, and ``t = 0``, ``p = 1`` when they are equal.

    Raises:
        ValueError: for a sample with fewer than two values or a non-finite value.
    """
    sa, sb = summarize(a), summarize(b)
    if sa.n < 2 or sb.n < 2:
        raise ValueError(f"welch_t_test needs two or more values per sample, got {sa.n} and {sb.n}")
    va, vb = sa.std**2 / sa.n, sb.std**2 / sb.n
    diff = sa.mean - sb.mean
    if va + vb == 0.0:
        if diff == 0.0:
            return WelchResult(0.0, float(sa.n + sb.n - 2), 1.0, 0.5)
        t = math.copysign(math.inf, diff)
        return WelchResult(t, float(sa.n + sb.n - 2), 0.0, 1.0 if diff > 0 else 0.0)
    t = diff / math.sqrt(va + vb)
    df = (va + vb) ** 2 / (va**2 / (sa.n - 1) + vb**2 / (sb.n - 1))
    cdf = student_t_cdf(t, df)
    return WelchResult(t, df, 2.0 * min(cdf, 1.0 - cdf), cdf)


def student_t_cdf(t: float, df: float) -> float:
    """P(T <= t) for Student's t with ``df`` > 0 degrees of freedom.

    Uses ``P(|T| > |t|) = I_x(df/2, 1/2)`` with ``x = df / (df + t^2)``.

    Raises:
        ValueError: for ``df <= 0`` or a NaN ``t``.
    """
    if not df > 0:
        raise ValueError(f"df must be > 0, got {df}")
    if math.isnan(t):
        raise ValueError("t is NaN")
    if math.isinf(t):
        return 1.0 if t > 0 else 0.0
    tail = 0.5 * regularized_incomplete_beta(df / (df + t * t), df / 2.0, 0.5)
    return 1.0 - tail if t > 0 else tail


def regularized_incomplete_beta(x: float, a: float, b: float) -> float:
    """``I_x(a, b)``, the regularised incomplete beta function, for ``0 <= x <= 1``, a, b > 0.

    Evaluated by its continued fraction with the modified Lentz method, on the side of
    ``x = a / (a + b)`` where the fraction converges fast (the symmetry
    ``I_x(a, b) = 1 - I_{1-x}(b, a)`` covers the other side); relative accuracy ~1e-14.

    Raises:
        ValueError: for ``x`` outside [0, 1] or ``a``, ``b`` not positive.
    """
    if not 0.0 <= x <= 1.0:
        raise ValueError(f"x must be in [0, 1], got {x}")
    if not (a > 0 and b > 0):
        raise ValueError(f"a and b must be > 0, got a={a}, b={b}")
    if x in (0.0, 1.0):
        return x
    if x > (a + 1.0) / (a + b + 2.0):
        return 1.0 - regularized_incomplete_beta(1.0 - x, b, a)
    log_front = a * math.log(x) + b * math.log1p(-x) - _log_beta(a, b)
    return math.exp(log_front) * _beta_fraction(x, a, b) / a


def _log_beta(a: float, b: float) -> float:
    return math.lgamma(a) + math.lgamma(b) - math.lgamma(a + b)


def _beta_fraction(x: float, a: float, b: float, *, tiny: float = 1e-300) -> float:
    """The continued fraction 1 / (1 + d1 / (1 + d2 / (1 + ...))) of ``I_x(a, b)``."""
    c, d = 1.0, 1.0 - (a + b) * x / (a + 1.0)
    d = 1.0 / (d if abs(d) > tiny else tiny)
    result = d
    for m in range(1, 500):
        for numerator in (
            m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m)),  # the even term d_2m
            -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1)),  # the odd d_2m+1
        ):
            d = 1.0 + numerator * d
            d = 1.0 / (d if abs(d) > tiny else tiny)
            c = 1.0 + numerator / c
            c = c if abs(c) > tiny else tiny
            result *= c * d
        if abs(c * d - 1.0) < 1e-15:
            break
    return result


__all__: list[str] = [
    "Summary",
    "WelchResult",
    "regularized_incomplete_beta",
    "student_t_cdf",
    "summarize",
    "welch_t_test",
]
