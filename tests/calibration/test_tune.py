"""``policy tune``'s threshold search: the guarantee checked on seeded populations, the fixed
sequence's stop, and the verdicts still needed when the evidence is thin."""

from __future__ import annotations

import random
from collections.abc import Callable

import pytest

from proxy.calibration.bounds import error_upper_bound
from proxy.calibration.tune import GRID, Tuned, Verdict, first_tested, tune

Curve = Callable[[float], float]


def overconfident(c: float) -> float:
    """Right 20% of the time at 0.5 rising linearly to always at 1.0: the accuracy of the answers
    at or above t (t >= 0.5) is 0.2 + 0.8 t."""
    return 0.2 + 0.8 * (c - 0.5) / 0.5


def draw(curve: Curve, n: int, rng: random.Random) -> list[Verdict]:
    """``n`` answers at confidences uniform in 0.5..1, right with probability curve(c)."""
    out = []
    for _ in range(n):
        c = round(rng.uniform(0.5, 1.0), 4)
        out.append(Verdict(c, rng.random() < curve(c)))
    return out


def accuracy_above(curve: Curve, threshold: float, steps: int = 20_000) -> float:
    """The population's accuracy among answers at or above ``threshold`` (midpoint rule)."""
    low = max(threshold, 0.5)
    width = (1.0 - low) / steps
    return sum(curve(low + (i + 0.5) * width) for i in range(steps)) / steps


@pytest.mark.parametrize(("target", "delta"), [(0.8, 0.1), (0.9, 0.05)])
def test_the_guarantee_holds_on_fresh_draws_in_at_least_1_minus_delta_of_200_repetitions(
    target: float, delta: float
) -> None:
    """On 2,000 verdicts each time, the threshold tune recommends is one at which the population's
    accepted accuracy is at least the target in at least 1 - delta of 200 seeded repetitions."""
    rng = random.Random(34)
    realised: dict[float, float] = {}
    misses, chosen = 0, []
    for _ in range(200):
        result = tune(draw(overconfident, 2000, rng), target, delta)
        if result.threshold is None:  # no threshold vouched for: nothing recommended, nothing wrong
            continue
        chosen.append(result.threshold)
        if result.threshold not in realised:
            realised[result.threshold] = accuracy_above(overconfident, result.threshold)
        misses += realised[result.threshold] < target
    assert misses <= delta * 200, (misses, sorted(set(chosen)))
    assert len(chosen) >= 180  # and it does recommend one nearly every time
    # Not vacuous: the thresholds chosen sit near the loosest one that meets the target.
    loosest = min(t for t in GRID if accuracy_above(overconfident, t) >= target)
    assert sorted(chosen)[len(chosen) // 2] == pytest.approx(loosest, abs=0.06)


def test_the_fixed_sequence_stops_at_the_first_threshold_it_cannot_vouch_for() -> None:
    # 100 right answers at 0.95, 30 wrong ones at 0.85, 500 right ones at 0.6: below 0.85 the
    # accuracy would recover, but the sequence stops where it first fails. Of the thresholds
    # accepting the same 100 answers (0.86..0.95) the strictest: nothing below 0.95 was seen.
    verdicts = [Verdict(0.95, True)] * 100 + [Verdict(0.85, False)] * 30 + [Verdict(0.6, True)] * 500
    result = tune(verdicts, 0.9, 0.05)
    assert result == Tuned(630, 0.95, 100, 0, error_upper_bound(0, 100, 0.05))
    assert result.accuracy_bound == pytest.approx(0.05 ** (1 / 100))
    assert result.accepted_share == pytest.approx(100 / 630)


def test_too_few_verdicts_say_how_many_more_are_needed() -> None:
    # The sequence starts at 181 accepted answers for 0.95 at delta 0.05: the fewest whose bound
    # passes with 2.5% of them wrong (4 of 181: 0.0499; 4 of 180: 0.0501).
    assert first_tested(0.95, 0.05) == 181
    assert error_upper_bound(4, 181, 0.05) <= 0.05 < error_upper_bound(4, 180, 0.05)
    thin = tune([Verdict(0.9, True)] * 30, 0.95, 0.05)
    assert thin.threshold is None and thin.more_needed == 151
    assert tune([Verdict(0.9, True)] * 181, 0.95, 0.05).threshold == 0.9
    # Half of them at 0.6 and wrong: the accepted share at 0.9 is half, so twice as many needed.
    mixed = [Verdict(0.9, True)] * 30 + [Verdict(0.6, False)] * 30
    assert tune(mixed, 0.95, 0.05).more_needed == 2 * 181 - 60


def test_an_accuracy_below_target_at_every_threshold_needs_no_more_verdicts_but_a_better_model() -> None:
    poor = tune([Verdict(0.9, i % 2 == 0) for i in range(1000)], 0.9, 0.05)
    assert poor.threshold is None and poor.more_needed is None


def test_target_and_delta_are_probabilities() -> None:
    for target, delta in ((1.0, 0.1), (0.9, 0.0), (0.0, 0.1)):
        with pytest.raises(ValueError, match="in \\(0, 1\\)"):
            tune([], target, delta)
