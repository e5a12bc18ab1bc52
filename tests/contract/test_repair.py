"""Stage 4: the repair pass fixes format only: never types, never new keys, idempotent."""

from __future__ import annotations

import copy
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from proxy.contract.repair import Repair, repair
from proxy.contract.wrap import NO_EXPLANATION
from proxy.module.model import Module
from tests.conftest import SCHEMA, ModuleFactory, schema_with, success


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


# --- the repair records, exactly (they feed cognitive_repairs_total) ----------------------------


def test_a_missing_meta_is_recorded_created_then_each_default(make_module: ModuleFactory) -> None:
    envelope = success(changes=[{"type": "other", "risk": "high"}])
    del envelope["meta"]
    fixed, repairs = repair(envelope)
    assert fixed["meta"] == {"confidence": 0.5, "risk": "high", "explain": "Folded constants."}
    assert repairs == [
        Repair("meta_default", "meta", "created"),
        Repair("meta_default", "meta.confidence", "0.5"),
        Repair("meta_default", "meta.risk", "high (max_changes_risk)"),
        Repair("meta_default", "meta.explain", "from rationale"),
    ]
    by_issues = make_module(meta={"risk_rule": "max_issues_risk"})
    assert repair(envelope, by_issues)[1][2] == Repair(
        "meta_default", "meta.risk", "medium (max_issues_risk)"
    )


def test_failure_defaults_are_recorded_with_their_values() -> None:
    fixed, repairs = repair({"ok": False, "meta": {}, "error": {"code": "E2004"}})
    assert fixed["meta"] == {"confidence": 0.0, "risk": "high", "explain": NO_EXPLANATION}
    assert repairs == [
        Repair("meta_default", "meta.confidence", "0.0"),
        Repair("meta_default", "meta.risk", "high (max_changes_risk)"),
        Repair("meta_default", "meta.explain", "placeholder"),
    ]


def test_control_plane_strings_are_trimmed_and_every_trim_is_recorded() -> None:
    envelope: dict[str, Any] = {
        "ok": False,
        "meta": {"confidence": 0.1, "risk": " high", "explain": "why ", "trace_id": " t ", "model": "m\n"},
        "error": {"code": " E2004 ", "message": "\tno\t", "details": " kept "},
    }
    fixed, repairs = repair(envelope)
    assert fixed["meta"] == {
        "confidence": 0.1,
        "risk": "high",
        "explain": "why",
        "trace_id": "t",
        "model": "m",
    }
    assert fixed["error"] == {"code": "E2004", "message": "no", "details": " kept "}
    assert repairs == [
        Repair("whitespace_trimmed", "meta.risk"),
        Repair("whitespace_trimmed", "meta.explain"),
        Repair("whitespace_trimmed", "meta.trace_id"),
        Repair("whitespace_trimmed", "meta.model"),
        Repair("whitespace_trimmed", "error.code"),
        Repair("whitespace_trimmed", "error.message"),
    ]


def test_records_of_every_stage_add_up_in_order(make_module: ModuleFactory) -> None:
    """Trim, defaults, risk enum, truncation, partial_data and data enums: none overwrites another."""
    module = make_module()
    envelope = success(changes=[{"type": "OTHER", "risk": "low"}])
    envelope["meta"] = {"risk": " LOW ", "explain": "e" * 281}
    envelope["partial_data"] = None
    fixed, repairs = repair(envelope, module)
    assert fixed["meta"] == {"risk": "low", "explain": "e" * 280, "confidence": 0.5}
    assert repairs == [
        Repair("whitespace_trimmed", "meta.risk"),
        Repair("meta_default", "meta.confidence", "0.5"),
        Repair("enum_normalized", "meta.risk"),
        Repair("explain_truncated", "meta.explain", "281 -> 280"),
        Repair("partial_data_removed", "partial_data"),
        Repair("enum_normalized", "data.changes[0].type"),
    ]


def test_an_explain_of_exactly_280_code_points_is_left_alone() -> None:
    envelope = success()
    envelope["meta"]["explain"] = "😀" * 280
    assert repair(envelope) == (envelope, [])


def test_allowed_partial_data_of_a_failure_is_kept(make_module: ModuleFactory) -> None:
    envelope: dict[str, Any] = {
        "ok": False,
        "meta": {"confidence": 0.0, "risk": "high", "explain": "x"},
        "error": {"code": "E2004", "message": "m"},
        "partial_data": {"result": "half"},
    }
    assert repair(envelope, make_module()) == (envelope, [])
    assert repair(envelope) == (envelope, [])
    fixed, repairs = repair(envelope, make_module(failure={"partial_allowed": False}))
    assert "partial_data" not in fixed
    assert repairs == [Repair("partial_data_removed", "partial_data")]


def test_partial_data_of_a_success_is_dropped() -> None:
    envelope = success()
    envelope["partial_data"] = {"result": "x"}
    fixed, repairs = repair(envelope)
    assert fixed == success()
    assert repairs == [Repair("partial_data_removed", "partial_data")]


def test_error_enums_are_normalised_by_the_module_error_schema(make_module: ModuleFactory) -> None:
    codes = {"type": "string", "enum": ["UNSUPPORTED_LANGUAGE", "E2004"]}
    error_schema = {"type": "object", "properties": {"code": {"$ref": "#/$defs/codes"}, "message": {}}}
    module = make_module(
        schema=schema_with(error=error_schema, **{"$defs": {**SCHEMA["$defs"], "codes": codes}})
    )
    envelope: dict[str, Any] = {
        "ok": False,
        "meta": {"confidence": 0.0, "risk": "high", "explain": "x"},
        "error": {"code": "unsupported_language", "message": "m"},
    }
    fixed, repairs = repair(envelope, module)
    assert fixed["error"] == {"code": "UNSUPPORTED_LANGUAGE", "message": "m"}
    assert repairs == [Repair("enum_normalized", "error.code")]


def test_data_enums_behind_a_ref_are_normalised(make_module: ModuleFactory) -> None:
    defs = {**SCHEMA["$defs"], "scope": {"type": "string", "enum": ["local", "file"]}}
    data = copy.deepcopy(SCHEMA["data"])
    data["properties"]["note"] = {"$ref": "#/$defs/scope"}
    module = make_module(schema=schema_with(data=data, **{"$defs": defs}))
    fixed, repairs = repair(success(note="FILE"), module)
    assert fixed["data"]["note"] == "file"
    assert repairs == [Repair("enum_normalized", "data.note")]


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
