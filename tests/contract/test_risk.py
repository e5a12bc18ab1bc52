"""The module's risk rule over the data, and which risk routes an answer (``risk_source``)."""

from __future__ import annotations

from typing import Any

import pytest

from proxy.contract.risk import RiskSource, aggregate_risk, routed_risk, rule_risk


@pytest.mark.parametrize(
    ("data", "rule", "expected"),
    [
        ({"changes": [{"risk": "low"}, {"risk": "high"}]}, "max_changes_risk", "high"),
        ({"issues": [{"risk": "medium"}, {"risk": "none"}]}, "max_issues_risk", "medium"),
        ({"changes": []}, "max_changes_risk", None),
        ({"changes": [{"risk": "severe"}, {}]}, "max_changes_risk", None),
        ({"summary": "no list"}, "max_changes_risk", None),
        ({"changes": [{"risk": "high"}]}, "explicit", None),
        ({"changes": [{"risk": "high"}]}, "custom_function", None),
        ("not an object", "max_changes_risk", None),
    ],
)
def test_rule_risk(data: Any, rule: str, expected: str | None) -> None:
    assert rule_risk(data, rule) == expected


@pytest.mark.parametrize(
    ("model", "rule", "source", "expected"),
    [
        ("low", "high", "max", "high"),
        ("high", "low", "max", "high"),
        ("low", "high", "rule", "high"),
        ("high", "low", "rule", "low"),
        ("low", "high", "model", "low"),
        ("low", None, "rule", "low"),
        ("low", None, "max", "low"),
        ("medium", "medium", "max", "medium"),
        ("made-up", "medium", "max", "made-up"),  # an unknown model risk counts as high
        ("made-up", "high", "max", "made-up"),
    ],
)
def test_routed_risk(model: str, rule: Any, source: RiskSource, expected: str) -> None:
    assert routed_risk(model, rule, source) == expected


def test_aggregate_risk_defaults_to_the_changes_rule_and_medium() -> None:
    data = {"changes": [{"risk": "low"}], "issues": [{"risk": "high"}]}
    assert aggregate_risk(data) == "low"
    assert aggregate_risk(data, "max_issues_risk") == "high"
    assert aggregate_risk(data, "explicit") == "medium"
    assert aggregate_risk({"changes": "not a list"}) == "medium"
