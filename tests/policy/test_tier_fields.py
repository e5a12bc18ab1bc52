"""A per-tier policy field is written twice only: on ``Thresholds`` and in the schema's
``definitions.tier``. A module's override takes the same properties (derived at load), the loader
reads every field, ``cogproxy policy check``'s summary prints every field."""

from __future__ import annotations

from dataclasses import fields
from typing import Any

import pytest

from proxy.policy.loader import PolicyError, parse_policy, policy_schema
from proxy.policy.model import Thresholds
from proxy.policy.report import summary
from proxy.schemas import load

MINIMAL: dict[str, Any] = {
    "version": 1,
    "providers": {"p": {"kind": "openai", "base_url": "http://127.0.0.1:1/v1"}},
    "ladder": [{"name": "fast", "targets": ["p/small"]}, {"name": "strong", "targets": ["p/big"]}],
}
EVERY_FIELD: dict[str, Any] = {
    "min_confidence": 1,  # a YAML integer where a float is declared
    "max_risk": "medium",
    "exhausted": "accept",
    "start": "strong",
    "reask": 2,
    "risk_source": "rule",
}


def test_the_schema_and_the_dataclass_name_the_same_fields() -> None:
    tier = policy_schema()["definitions"]["tier"]["properties"]
    assert set(tier) == {f.name for f in fields(Thresholds)} == set(EVERY_FIELD)


def test_a_module_override_takes_every_tier_property_and_the_file_writes_them_once() -> None:
    schema = policy_schema()["definitions"]
    assert schema["override"]["properties"].keys() == schema["tier"]["properties"].keys()
    assert all("default" not in p for p in schema["override"]["properties"].values())
    assert "override" not in load("policy.schema.json")["definitions"]  # derived, not written


def test_the_loader_reads_every_field_of_a_tier_entry() -> None:
    policy = parse_policy({**MINIMAL, "tiers": {"decision": EVERY_FIELD}})
    decision = policy.tiers["decision"]
    assert {f.name: getattr(decision, f.name) for f in fields(decision)} == EVERY_FIELD
    assert isinstance(decision.min_confidence, float)


def test_a_module_override_of_every_field_applies() -> None:
    policy = parse_policy({**MINIMAL, "modules": {"m": EVERY_FIELD}})
    merged = policy.thresholds_for("m", "exec")
    assert {f.name: getattr(merged, f.name) for f in fields(merged)} == EVERY_FIELD


@pytest.mark.parametrize(
    ("section", "entry", "problem"),
    [
        ("modules", {}, "modules.m"),
        ("modules", {"no_such_field": 1}, "no_such_field"),
        ("modules", {"reask": 9}, "modules.m.reask"),
        ("tiers", {"min_confidence": 0.5}, "max_risk"),
    ],
)
def test_the_derived_override_and_the_tier_entry_are_checked(
    section: str, entry: dict[str, Any], problem: str
) -> None:
    key = "m" if section == "modules" else "exec"
    with pytest.raises(PolicyError) as raised:
        parse_policy({**MINIMAL, section: {key: entry}})
    assert problem in str(raised.value)


def test_the_summary_prints_every_field_that_is_set() -> None:
    policy = parse_policy({**MINIMAL, "tiers": {"decision": EVERY_FIELD}})
    line = next(x for x in summary(policy) if x.strip().startswith("decision:"))
    assert line.strip() == (
        "decision: min_confidence 1, max_risk medium, exhausted accept, start strong, reask 2, "
        "risk_source rule"
    )


@pytest.mark.parametrize(
    ("change", "problem"),
    [
        (
            {"tiers": {"exec": {"min_confidence": float("nan"), "max_risk": "low"}}},
            "tiers.exec.min_confidence",
        ),
        ({"modules": {"m": {"min_confidence": float("nan")}}}, "modules.m.min_confidence"),
        ({"failover": {"timeout": {"per_try_s": float("inf")}}}, "failover.timeout.per_try_s"),
    ],
)
def test_a_number_that_is_not_finite_is_refused_with_its_path(change: dict[str, Any], problem: str) -> None:
    """``.nan`` passes ``minimum``/``maximum`` (every comparison is false): a NaN ``min_confidence``
    loaded and sent every answer to review (#30 attack pass)."""
    with pytest.raises(PolicyError) as raised:
        parse_policy({**MINIMAL, **change})
    assert f"{problem}: must be a finite number" in str(raised.value)
