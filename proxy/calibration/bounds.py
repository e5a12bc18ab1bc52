"""Exact binomial bounds: the beta distribution and Clopper-Pearson intervals.

Why not scipy: ``scipy.stats.beta.ppf`` is the only thing needed from it, and it would bring
numpy and scipy (~100 MB) into a sidecar. The regularized incomplete beta function is the
continued fraction of Numerical Recipes (§6.4, evaluated by the modified Lentz method), exact to
~1e-14; its inverse is found by bisection (monotone, no starting-point trouble), to 1e-13.
Tested against the binomial tail identity, the closed forms and published intervals
(tests/calibration/test_bounds.py).
"""

from __future__ import annotations

import math

_CF_STEPS = 300
_CF_EPS = 1e-15
_TINY = 1e-300
_BISECTIONS = 60


def _continued_fraction(x: float, a: float, b: float) -> float:
    c, d = 1.0, 1.0 - (a + b) * x / (a + 1)
    d = 1 / (d if abs(d) > _TINY else _TINY)
    h = d
    for m in range(1, _CF_STEPS + 1):
        for numerator in (
            m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m)),
            -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1)),
        ):
            d = 1 + numerator * d
            d = 1 / (d if abs(d) > _TINY else _TINY)
            c = 1 + numerator / c
            c = c if abs(c) > _TINY else _TINY
            h *= d * c
        if abs(d * c - 1) < _CF_EPS:
            break
    return h


def beta_cdf(x: float, a: float, b: float) -> float:
    """The regularized incomplete beta function I_x(a, b): P(X <= x) for X ~ Beta(a, b)."""
    if x <= 0:
        return 0.0
    if x >= 1:
        return 1.0
    log_front = math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x)
    front = math.exp(log_front)
    if x < (a + 1) / (a + b + 2):  # the continued fraction converges fast on this side
        return front * _continued_fraction(x, a, b) / a
    return 1 - front * _continued_fraction(1 - x, b, a) / b


def beta_ppf(q: float, a: float, b: float) -> float:
    """The q-quantile of Beta(a, b)."""
    low, high = 0.0, 1.0
    for _ in range(_BISECTIONS):
        mid = (low + high) / 2
        if beta_cdf(mid, a, b) < q:
            low = mid
        else:
            high = mid
    return (low + high) / 2


def error_upper_bound(errors: int, n: int, delta: float) -> float:
    """The Clopper-Pearson upper bound on an error rate: with probability at least 1 - delta the
    rate is at most this, having seen ``errors`` in ``n`` (1.0 when nothing was seen)."""
    if errors >= n:
        return 1.0
    return beta_ppf(1 - delta, errors + 1, n - errors)


def bound_at_most(errors: int, n: int, delta: float, epsilon: float) -> bool:
    """Whether ``error_upper_bound(errors, n, delta) <= epsilon``, read off the distribution
    rather than its quantile: one evaluation of the incomplete beta instead of a bisection."""
    return errors < n and beta_cdf(epsilon, errors + 1, n - errors) >= 1 - delta


def error_lower_bound(errors: int, n: int, delta: float) -> float:
    if errors <= 0:
        return 0.0
    return beta_ppf(delta, errors, n - errors + 1)


def clopper_pearson(successes: int, n: int, alpha: float = 0.05) -> tuple[float, float]:
    """The exact two-sided 1 - alpha interval of a proportion."""
    return error_lower_bound(successes, n, alpha / 2), error_upper_bound(successes, n, alpha / 2)
