"""Calibration maps (policy), the pool-adjacent-violators fit and the reliability figures."""

from __future__ import annotations

import itertools
import random
from dataclasses import fields
from typing import Any

import pytest

from proxy.calibration.fit import Point, fit_map, grouped, pava
from proxy.calibration.reliability import from_records, render
from proxy.policy.calibration import CalibrationMap
from proxy.policy.loader import PolicyError, parse_policy
from proxy.policy.model import FeedbackPolicy
from proxy.schemas import load
from proxy.state.feedback import AnswerRecord
from tests.policy.test_loader import MINIMAL


def policy_with(calibration: dict[str, Any]) -> Any:
    return parse_policy({**MINIMAL, "calibration": calibration})


def test_points_interpolate_and_stay_flat_outside() -> None:
    policy = policy_with({"p/m": {"points": [[0.5, 0.2], [0.8, 0.5], [1.0, 0.7]]}})
    assert [round(policy.calibrate("p/m", x), 4) for x in (0.0, 0.5, 0.65, 0.8, 0.9, 1.0)] == [
        0.2,
        0.2,
        0.35,
        0.5,
        0.6,
        0.7,
    ]
    assert policy.calibrate("p/other", 0.42) == 0.42  # no map: as reported


def test_platt_and_temperature_are_monotone_sigmoids() -> None:
    policy = policy_with({"p/a": {"platt": {"a": 2.0, "b": -1.0}}, "p/t": {"temperature": 2.0}})
    assert policy.calibrate("p/t", 0.5) == pytest.approx(0.5)
    assert policy.calibrate("p/t", 0.9) == pytest.approx(0.75)  # logit(0.9)/2 = logit(0.75)
    grid = [i / 100 for i in range(101)]
    for target in ("p/a", "p/t"):
        values = [policy.calibrate(target, x) for x in grid]
        assert values == sorted(values) and all(0 < v < 1 for v in values)


@pytest.mark.parametrize(
    ("entry", "problem"),
    [
        ({"points": [[0.5, 0.6], [0.8, 0.4]]}, r"calibration\.p/m\.points\[1\]: calibrated 0.4 below 0.6"),
        ({"points": [[0.5, 0.2], [0.5, 0.4]]}, r"calibration\.p/m\.points\[1\]: reported 0.5 not above"),
        ({"points": [[0.5, 0.2]]}, r"calibration\.p/m\.points"),
        ({"points": [[0.5, 1.2], [0.9, 1.3]]}, r"calibration\.p/m\.points"),
        ({"platt": {"a": -1, "b": 0}}, r"calibration\.p/m\.platt\.a"),
        ({"temperature": 0}, r"calibration\.p/m\.temperature"),
        ({"points": [[0, 0], [1, 1]], "temperature": 2}, r"calibration\.p/m"),
    ],
)
def test_non_monotone_or_malformed_maps_are_refused_at_load(entry: dict[str, Any], problem: str) -> None:
    with pytest.raises(PolicyError, match=problem):
        policy_with({"p/m": entry})


def test_a_map_for_an_unknown_provider_is_refused() -> None:
    with pytest.raises(PolicyError, match=r"calibration\.nope/m: unknown provider 'nope'"):
        policy_with({"nope/m": {"temperature": 2}})


def test_feedback_schema_defaults_are_the_dataclass_defaults() -> None:
    schema = load("policy.schema.json")["properties"]["feedback"]["properties"]
    # the nested feedback.shadow block's defaults: tests/policy/test_defaults.py
    scalars = {f.name: f.default for f in fields(FeedbackPolicy) if f.name != "shadow"}
    assert scalars == {k: v["default"] for k, v in schema.items() if k != "shadow"}
    assert parse_policy(MINIMAL).feedback == FeedbackPolicy()
    assert parse_policy({**MINIMAL, "feedback": {"window_s": 60}}).feedback.window_s == 60


def brute_isotonic(points: list[Point]) -> float:
    """The least weighted squared error of any non-decreasing fit on a grid of levels (small n)."""
    levels = [i / 10 for i in range(11)]
    best = float("inf")
    for fit in itertools.combinations_with_replacement(levels, len(points)):
        best = min(best, sum(p.weight * (p.y - f) ** 2 for p, f in zip(points, fit, strict=True)))
    return best


def test_pava_pools_violators_into_block_means() -> None:
    blocks = pava([Point(0.1, 0.2), Point(0.2, 0.8), Point(0.3, 0.4), Point(0.4, 0.9)])
    assert [(round(b.x, 3), round(b.y, 3), b.weight) for b in blocks] == [
        (0.1, 0.2, 1),
        (0.25, 0.6, 2),
        (0.4, 0.9, 1),
    ]
    weighted = pava([Point(0.1, 1.0, 3), Point(0.2, 0.0, 1)])
    assert [(round(b.y, 3), b.weight) for b in weighted] == [(0.75, 4)]


def test_pava_is_the_least_squares_monotone_fit() -> None:
    rng = random.Random(7)
    for _ in range(20):
        points = [Point(i / 6, round(rng.random(), 2), rng.choice([1, 2, 3])) for i in range(6)]
        blocks = pava(points)
        ys = [b.y for b in blocks]
        assert ys == sorted(ys)
        # Expand blocks over their points: a block covers consecutive points summing to its weight.
        fitted: list[float] = []
        remaining = list(points)
        for b in blocks:
            covered = 0.0
            while covered < b.weight - 1e-9:
                covered += remaining.pop(0).weight
                fitted.append(b.y)
        error = sum(p.weight * (p.y - f) ** 2 for p, f in zip(points, fitted, strict=True))
        assert error <= brute_isotonic(points) + 1e-9


def test_fit_recovers_the_accuracy_curve_of_a_miscalibrated_model() -> None:
    rng = random.Random(20)
    points = []
    for _ in range(5000):
        c = rng.uniform(0.5, 1.0)
        points.append(Point(c, 1.0 if rng.random() < c - 0.3 else 0.0))
    fitted = fit_map(points)
    assert fitted is not None and len(fitted.xs) <= 101
    assert list(fitted.xs) == sorted(set(fitted.xs)) and list(fitted.ys) == sorted(fitted.ys)
    for reported in (0.6, 0.75, 0.9, 0.98):
        assert fitted(reported) == pytest.approx(reported - 0.3, abs=0.1)
    assert fitted(1.0) < 0.9  # the exec tier's threshold is out of reach
    assert parse_policy({**MINIMAL, "calibration": {"p/m": fitted.as_yaml()}}).calibrate(
        "p/m", 0.9
    ) == fitted(0.9)


def test_a_pooled_block_is_a_flat_segment_over_its_reported_range() -> None:
    # 40 answers at 0.95 half right, 20 at 0.75 three quarters right: PAV pools both (issue #34).
    points = [Point(0.95, float(i < 20)) for i in range(40)] + [Point(0.75, float(i < 15)) for i in range(20)]
    flat = fit_map(points)
    assert flat is not None
    assert flat.xs == (0.75, 0.95) and flat.ys == (0.5833, 0.5833)
    assert {round(flat(x), 4) for x in (0.0, 0.75, 0.8, 0.95, 1.0)} == {0.5833}
    # Two blocks, the upper one pooled over 0.8..0.9: flat there, linear between blocks.
    fitted = fit_map([Point(0.5, 0.2), Point(0.8, 0.9), Point(0.9, 0.5)])
    assert fitted is not None and fitted.xs == (0.5, 0.8, 0.9) and fitted.ys == (0.2, 0.7, 0.7)
    assert grouped([Point(0.901, 1), Point(0.899, 0)]) == [Point(0.9, 0.5, 2)]


def test_answers_all_at_one_confidence_give_a_flat_map() -> None:
    flat = fit_map([Point(0.9, 1.0), Point(0.9, 0.0), Point(0.9, 1.0)])
    assert flat is not None and flat(0.1) == flat(0.99) == 0.6667
    assert parse_policy({**MINIMAL, "calibration": {"p/m": flat.as_yaml()}}).calibrate("p/m", 0.9) == 0.6667
    assert fit_map([]) is None


def record(confidence: float, verdict: str, score: float, decision: str = "accept") -> AnswerRecord:
    return AnswerRecord(
        "t",
        "m",
        "exec",
        "fast",
        "up",
        "cheap",
        confidence,
        confidence,
        "low",
        decision,
        0.9,
        0,
        1,
        verdict=verdict,
        score=score,
        verdicts=1,
    )


def test_reliability_figures_from_records() -> None:
    rel = from_records(
        [
            record(0.95, "incorrect", 0.0),
            record(0.95, "correct", 1.0),
            record(0.55, "correct", 1.0, "escalated"),
            record(0.55, "partially_correct", 0.5, "review"),
        ]
    )
    figures = rel.models[("up/cheap", "reported")]
    assert figures.count == 4
    # bins 0.9: |1 - 1.9| = 0.9; 0.5: |1.5 - 1.1| = 0.4 -> ECE 1.3 / 4
    assert figures.ece == pytest.approx(1.3 / 4)
    assert figures.brier_score == pytest.approx((0.95**2 + 0.05**2 + 0.45**2 + 0.05**2) / 4)
    assert rel.would_have_been == {("up/cheap", "exec"): 1}
    assert rel.outcomes[("exec", "accept")].accuracy == 0.5
    table = render(rel)
    assert "up/cheap" in table and "0.325" in table
    assert CalibrationMap((0.0, 1.0), (0.0, 1.0))(0.3) == 0.3
