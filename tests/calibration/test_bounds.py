"""The beta quantile and the Clopper-Pearson bounds ``policy tune`` and ``simulate`` rest on."""

from __future__ import annotations

import math

import pytest

from proxy.calibration.bounds import beta_cdf, beta_ppf, bound_at_most, clopper_pearson, error_upper_bound


def binomial_tail(n: int, k: int, p: float) -> float:
    """P(Bin(n, p) >= k), summed exactly."""
    return sum(math.comb(n, i) * p**i * (1 - p) ** (n - i) for i in range(k, n + 1))


@pytest.mark.parametrize("n", [1, 5, 20, 97, 400])
def test_the_incomplete_beta_is_the_binomial_tail(n: int) -> None:
    # I_p(k, n - k + 1) = P(Bin(n, p) >= k): the identity Clopper-Pearson is built on.
    for k in {1, n // 3 or 1, n // 2 or 1, n}:
        for p in (0.001, 0.05, 0.3, 0.5, 0.77, 0.999):
            assert beta_cdf(p, k, n - k + 1) == pytest.approx(binomial_tail(n, k, p), rel=1e-9, abs=1e-14)


def test_the_quantile_inverts_the_distribution_and_has_the_closed_forms() -> None:
    for a, b in ((1.0, 7.0), (3.0, 1.0), (2.5, 4.5), (40.0, 361.0), (0.5, 0.5)):
        for q in (0.001, 0.025, 0.5, 0.9, 0.999):
            assert beta_cdf(beta_ppf(q, a, b), a, b) == pytest.approx(q, abs=1e-10)
    assert beta_ppf(0.9, 1.0, 7.0) == pytest.approx(1 - 0.1 ** (1 / 7))  # Beta(1, b): 1 - (1-q)^(1/b)
    assert beta_ppf(0.3, 3.0, 1.0) == pytest.approx(0.3 ** (1 / 3))  # Beta(a, 1): q^(1/a)
    assert beta_ppf(0.5, 6.0, 6.0) == pytest.approx(0.5)


@pytest.mark.parametrize(
    ("k", "n", "low", "high"),
    [
        # Exact 95% intervals as published (R's binom.test, Clopper & Pearson's construction).
        (5, 20, 0.0865715, 0.4910459),
        (7, 10, 0.3475471, 0.9332605),
        (0, 10, 0.0, 0.3084971),
        (10, 10, 0.6915029, 1.0),
    ],
)
def test_clopper_pearson_matches_published_intervals(k: int, n: int, low: float, high: float) -> None:
    got_low, got_high = clopper_pearson(k, n, 0.05)
    assert got_low == pytest.approx(low, abs=5e-7) and got_high == pytest.approx(high, abs=5e-7)


def test_the_one_sided_error_bound() -> None:
    # No error in n answers: the bound is 1 - delta^(1/n) (the "rule of three" for delta 0.05).
    assert error_upper_bound(0, 100, 0.05) == pytest.approx(1 - 0.05 ** (1 / 100))
    assert error_upper_bound(3, 3, 0.05) == 1.0
    assert error_upper_bound(0, 0, 0.05) == 1.0  # nothing accepted: nothing known
    assert error_upper_bound(5, 20, 0.025) == pytest.approx(0.4910459, abs=5e-7)


def test_bound_at_most_agrees_with_the_bound_it_stands_for() -> None:
    """``bound_at_most`` (one incomplete-beta evaluation) answers as comparing the bisected
    Clopper-Pearson bound would, away from the bisection's own precision."""
    for n in (1, 5, 30, 181, 1000):
        for errors in range(0, n + 1, max(1, n // 7)):
            for delta in (0.01, 0.05, 0.2):
                bound = error_upper_bound(errors, n, delta)
                for epsilon in (0.01, 0.05, 0.1, 0.3):
                    if abs(bound - epsilon) > 1e-9:
                        assert bound_at_most(errors, n, delta, epsilon) == (bound <= epsilon), (
                            errors, n, delta, epsilon
                        )
