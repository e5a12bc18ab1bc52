"""Stage 4: the repair pass fixes format only: never types, never new keys, idempotent."""

from __future__ import annotations

import copy
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from proxy.contract.repair import repair
from proxy.module.model import Module
from tests.conftest import ModuleFactory, success


def kinds(repairs: list[Any]) -> list[tuple[str, str]]:
    return [(r.kind, r.path) for r in repairs]


def test_missing_meta_fields_get_conservative_defaults(make_module: ModuleFactory) -> None:
    module = make_module()
    envelope = success(changes=[{"type": "other", "risk": "high"}, {"type": "other", "risk": "low"}])
    envelope["meta"] = {}
    fixed, repairs = repair(envelope, module)
    assert fixed["meta"] == {"confidence": 0.5, "risk": "high", "explain": "Folded constants."}
    assert {p for _, p in kinds(repairs)} == {"meta.confidence", "meta.risk", "meta.explain"}


def test_missing_risk_follows_the_module_risk_rule(make_module: ModuleFactory) -> None:
    by_issues = make_module(meta={"risk_rule": "max_issues_risk"})
    envelope = success(changes=[{"type": "other", "risk": "high"}])
    envelope["data"]["issues"] = [{"risk": "low"}]
    del envelope["meta"]["risk"]
    assert repair(envelope, by_issues)[0]["meta"]["risk"] == "low"
    explicit = make_module(meta={"risk_rule": "explicit"})
    assert repair(envelope, explicit)[0]["meta"]["risk"] == "medium"


def test_missing_explain_without_rationale_uses_placeholder() -> None:
    envelope = success(rationale=7)
    del envelope["meta"]["explain"]
    assert repair(envelope)[0]["meta"]["explain"] == "No explanation provided"


def test_failure_meta_defaults_are_zero_confidence_high_risk() -> None:
    envelope = {"ok": False, "error": {"code": "E2004", "message": "Cannot do it"}}
    fixed, _ = repair(envelope)
    assert fixed["meta"] == {"confidence": 0.0, "risk": "high", "explain": "Cannot do it"}


def test_explain_is_truncated_to_280_code_points() -> None:
    envelope = success()
    envelope["meta"]["explain"] = "é" * 279 + "😀" * 10
    fixed, repairs = repair(envelope)
    assert fixed["meta"]["explain"] == "é" * 279 + "😀"
    assert len(fixed["meta"]["explain"]) == 280
    assert ("explain_truncated", "meta.explain") in kinds(repairs)


def test_truncation_at_a_space_stays_idempotent() -> None:
    envelope = success()
    envelope["meta"]["explain"] = "a" * 279 + " " + "b" * 50
    once, _ = repair(envelope)
    assert once["meta"]["explain"] == "a" * 279
    assert repair(once)[1] == []


def test_enum_case_and_whitespace_are_normalised(make_module: ModuleFactory) -> None:
    module = make_module()
    envelope = success(changes=[{"type": " Simplify_Logic ", "risk": "LOW", "scope": "File"}])
    envelope["meta"]["risk"] = " Low\n"
    fixed, repairs = repair(envelope, module)
    assert fixed["meta"]["risk"] == "low"
    assert fixed["data"]["changes"] == [{"type": "simplify_logic", "risk": "low", "scope": "file"}]
    assert ("enum_normalized", "data.changes[0].type") in kinds(repairs)


def test_unknown_enum_values_are_not_invented(make_module: ModuleFactory) -> None:
    module = make_module()
    envelope = success(changes=[{"type": "simplify", "risk": "severe"}])
    envelope["meta"]["risk"] = "critical"
    fixed, _ = repair(envelope, module)
    assert fixed["data"]["changes"] == [{"type": "simplify", "risk": "severe"}]
    assert fixed["meta"]["risk"] == "critical"


def test_types_are_never_changed() -> None:
    envelope = success()
    envelope["meta"]["confidence"] = "0.85"
    fixed, repairs = repair(envelope)
    assert fixed["meta"]["confidence"] == "0.85"
    assert repairs == []


def test_business_strings_are_not_trimmed(make_module: ModuleFactory) -> None:
    module = make_module()
    envelope = success(result="    return x\n")
    envelope["meta"]["explain"] = "  padded  "
    fixed, _ = repair(envelope, module)
    assert fixed["data"]["result"] == "    return x\n"
    assert fixed["meta"]["explain"] == "padded"


def test_null_partial_data_is_dropped() -> None:
    envelope = {
        "ok": False,
        "meta": {"confidence": 0.0, "risk": "high", "explain": "x"},
        "error": {"code": "E1", "message": "m"},
        "partial_data": None,
    }
    fixed, repairs = repair(envelope)
    assert "partial_data" not in fixed
    assert ("partial_data_removed", "partial_data") in kinds(repairs)


def test_input_is_not_mutated(make_module: ModuleFactory) -> None:
    envelope = success(changes=[{"type": "OTHER", "risk": "low"}])
    del envelope["meta"]["risk"]
    before = copy.deepcopy(envelope)
    repair(envelope, make_module())
    assert envelope == before


def test_without_ok_nothing_is_repaired() -> None:
    envelope = {"meta": {}, "data": {"rationale": "r"}}
    assert repair(envelope) == (envelope, [])


# --- properties -------------------------------------------------------------------------------

scalars = (
    st.none()
    | st.booleans()
    | st.integers(-5, 5)
    | st.floats(0, 2)
    | st.text(alphabet=" aLoWhigHnemdu\t", max_size=8)
)
values = st.recursive(
    scalars,
    lambda c: (
        st.lists(c, max_size=3)
        | st.dictionaries(st.sampled_from(["type", "risk", "scope", "x"]), c, max_size=3)
    ),
    max_leaves=10,
)
meta_values = st.dictionaries(
    st.sampled_from(["confidence", "risk", "explain", "trace_id", "model"]),
    scalars | st.text(max_size=400),
    max_size=5,
)
envelopes = st.fixed_dictionaries(
    {"ok": st.booleans()},
    optional={
        "meta": meta_values | scalars,
        "data": st.dictionaries(
            st.sampled_from(["result", "changes", "rationale", "note"]), values, max_size=4
        ),
        "error": st.dictionaries(st.sampled_from(["code", "message"]), scalars, max_size=2),
        "partial_data": st.none() | st.dictionaries(st.text(max_size=3), scalars, max_size=2),
    },
)


def walk(value: Any, path: str = "") -> dict[str, type]:
    """Every path in ``value`` with the type found there."""
    out = {path: type(value)}
    if isinstance(value, dict):
        for key, item in value.items():
            out.update(walk(item, f"{path}/{key}"))
    elif isinstance(value, list):
        for i, item in enumerate(value):
            out.update(walk(item, f"{path}/{i}"))
    return out


@settings(max_examples=300, deadline=None)
@given(envelope=envelopes)
def test_property_repair_never_changes_a_type_and_never_adds_keys_outside_meta(
    module_for_properties: Module, envelope: dict[str, Any]
) -> None:
    fixed, _ = repair(envelope, module_for_properties)
    before, after = walk(envelope), walk(fixed)
    for path, kind in after.items():
        if path in before:
            assert before[path] is kind, path
        else:
            assert path in {"/meta", "/meta/confidence", "/meta/risk", "/meta/explain"}, path


@settings(max_examples=300, deadline=None)
@given(envelope=envelopes)
def test_property_repair_is_idempotent(module_for_properties: Module, envelope: dict[str, Any]) -> None:
    once, _ = repair(envelope, module_for_properties)
    twice, second = repair(once, module_for_properties)
    assert twice == once
    assert second == []
