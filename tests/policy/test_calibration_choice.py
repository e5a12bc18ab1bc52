"""Platt and temperature fits, and the choice among the three kinds by held-out log-loss."""

from __future__ import annotations

import math
import random
from dataclasses import replace

import pytest

from proxy.calibration.choose import as_yaml, choose, ece, held_out, observations
from proxy.calibration.fit import Point
from proxy.calibration.parametric import A_MIN, fit_platt, fit_temperature, logit, sigmoid
from proxy.policy.loader import parse_policy
from tests.policy.test_loader import MINIMAL


def population(curve: object, n: int, seed: int) -> list[Point]:
    """``n`` verdicts at confidences uniform in 0.05..0.99, right with probability curve(c)."""
    assert callable(curve)
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        c = rng.uniform(0.05, 0.99)
        out.append(Point(c, float(rng.random() < curve(c))))
    return out


def test_platt_recovers_the_curve_that_drew_the_verdicts() -> None:
    points = population(lambda c: sigmoid(2.0 * logit(c) - 1.0), 20000, seed=1)
    fitted = fit_platt(points)
    assert fitted.a == pytest.approx(2.0, abs=0.1) and fitted.b == pytest.approx(-1.0, abs=0.1)


def test_temperature_recovers_the_temperature() -> None:
    points = population(lambda c: sigmoid(logit(c) / 2.5), 20000, seed=2)
    fitted = fit_temperature(points)
    assert 1 / fitted.a == pytest.approx(2.5, abs=0.15) and fitted.b == 0.0
    assert as_yaml("temperature", replace(fitted, upto=None)) == {"temperature": pytest.approx(1 / fitted.a)}
    bounded = as_yaml("temperature", fitted)  # flat above the highest confidence seen: its Platt form
    top = round(fitted.upto or 0, 4)
    assert bounded == {"platt": {"a": pytest.approx(fitted.a, abs=1e-6), "b": 0.0, "upto": top}}


def test_a_confidence_that_tells_nothing_fits_a_nearly_flat_admissible_platt_map() -> None:
    # Right 7 times in 12 whatever the confidence: the unconstrained slope is 0, the policy needs a > 0.
    points = [Point(c, float(i % 12 < 7)) for i, c in enumerate([0.75, 0.95] * 600)]
    fitted = fit_platt(points)
    assert fitted.a == A_MIN and fitted(0.75) == pytest.approx(7 / 12, abs=0.01)
    assert fitted(0.95) == pytest.approx(7 / 12, abs=0.01)
    parse_policy({**MINIMAL, "calibration": {"p/m": fitted.as_yaml()}})  # admissible


def test_the_kind_chosen_has_the_lowest_held_out_log_loss() -> None:
    # A step curve no sigmoid follows: isotonic wins.
    step = choose(population(lambda c: 0.2 if c < 0.8 else 0.9, 3000, seed=3))
    assert step.kind == "isotonic"
    # A temperature curve: a parametric map beats the isotonic one on held-out verdicts.
    smooth = choose(population(lambda c: sigmoid(logit(c) / 3), 400, seed=4))
    assert smooth.kind in ("platt", "temperature")
    for choice in (step, smooth):
        assert choice.kind == min(choice.scores, key=lambda s: s.log_loss).kind
        assert {s.kind for s in choice.scores} == {"isotonic", "platt", "temperature"}
        chosen = next(s for s in choice.scores if s.kind == choice.kind)
        assert chosen.ece_after < chosen.ece_before and chosen.brier_after < chosen.brier_before


def test_held_out_figures_of_the_reported_confidence_are_those_of_all_verdicts() -> None:
    points = population(lambda c: c - 0.04, 500, seed=5)
    [first, *_] = held_out(points)
    pairs = [(p.x, p.y) for p in points]
    assert first.ece_before == pytest.approx(ece(pairs))
    assert first.brier_before == pytest.approx(sum((q - y) ** 2 for q, y in pairs) / len(pairs))


def test_counter_bins_become_unit_verdicts() -> None:
    units = observations([Point(0.95, 0.5, 40), Point(0.75, 0.75, 20), Point(0.3, 1.0)])
    assert len(units) == 61 and sum(p.y for p in units) == 20 + 15 + 1
    assert math.isclose(sum(p.x for p in units), 40 * 0.95 + 20 * 0.75 + 0.3)


@pytest.mark.parametrize("fit", [fit_platt, fit_temperature])
def test_a_fitted_parametric_map_does_not_extrapolate_past_the_confidences_it_saw(fit: object) -> None:
    """A model right ``c - 0.3`` of the time, seen at confidences up to 0.95 (the top bin of the
    counters the proxy fits from): a logistic curve through them climbed to 0.99 at a reported
    1.0 (logit(1.0) is clamped to ~13.8, far past logit(0.95) ~2.9), so the commonest answer of
    an overconfident model, "1.0", was accepted by the exec tier (found as a flaky end-to-end
    test). A fitted map is flat past its highest confidence, and says so in its YAML."""
    assert callable(fit)
    rng = random.Random(7)
    tops = (0.55, 0.65, 0.75, 0.85, 0.95)
    points = [Point(x, float(rng.random() < x - 0.3)) for x in tops for _ in range(400)]
    fitted = fit(points)
    assert fitted(1.0) == pytest.approx(fitted(0.95)) and fitted(1.0) < 0.8
    kind = "platt" if fit is fit_platt else "temperature"
    written = as_yaml(kind, fitted)
    assert written["platt"]["upto"] == 0.95  # type: ignore[index]
    doc = {**MINIMAL, "calibration": {"p/small": written}}
    again = parse_policy(doc).calibration["p/small"]
    assert again(1.0) == pytest.approx(fitted(0.95), abs=1e-4)
