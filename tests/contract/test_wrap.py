"""Stage 2: the v2.1 auto-wrap, output by output (``wrap_v21`` on its own)."""

from __future__ import annotations

from typing import Any

import pytest

from proxy.contract.wrap import NO_EXPLANATION, explain_from, is_v22_envelope, wrap_v21


@pytest.mark.parametrize(
    "payload",
    [
        {"ok": True, "meta": {}, "data": {}},
        {"ok": False, "meta": {}, "error": {}},
        {"ok": "yes", "data": {"rationale": "r"}},  # ok present but not a boolean: not v2.1 either
        {"ok": None},
    ],
)
def test_a_v22_envelope_or_a_non_boolean_ok_is_not_wrapped(payload: dict[str, Any]) -> None:
    assert wrap_v21(payload) is None


def test_is_v22_needs_a_boolean_ok_and_meta() -> None:
    assert is_v22_envelope({"ok": True, "meta": {}})
    assert not is_v22_envelope({"ok": True, "data": {}})
    assert not is_v22_envelope({"meta": {}, "data": {}})
    assert not is_v22_envelope({"ok": "true", "meta": {}})


def test_meta_without_ok_is_a_bare_payload_and_gets_wrapped() -> None:
    assert wrap_v21({"meta": {"x": 1}, "rationale": "r"}) == {
        "ok": True,
        "meta": {"confidence": 0.5, "risk": "medium", "explain": "r"},
        "data": {"meta": {"x": 1}, "rationale": "r"},
    }


def test_a_failure_keeps_its_error_and_partial_data() -> None:
    payload = {"ok": False, "error": {"code": "E", "message": " why "}, "partial_data": {"n": 1}}
    assert wrap_v21(payload) == {
        "ok": False,
        "meta": {"confidence": 0.0, "risk": "high", "explain": "why"},
        "error": {"code": "E", "message": " why "},
        "partial_data": {"n": 1},
    }


def test_a_failure_with_a_non_object_error_gets_the_placeholder() -> None:
    assert wrap_v21({"ok": False, "error": "boom"}) == {
        "ok": False,
        "meta": {"confidence": 0.0, "risk": "high", "explain": NO_EXPLANATION},
        "error": "boom",
    }


def test_a_bare_error_next_to_data_is_a_success_payload() -> None:
    payload = {"error": {"message": "m"}, "data": {"rationale": "r"}}
    assert wrap_v21(payload) == {
        "ok": True,
        "meta": {"confidence": 0.5, "risk": "medium", "explain": NO_EXPLANATION},
        "data": payload,
    }


@pytest.mark.parametrize(
    "payload",
    [
        {"ok": True, "data": {"rationale": "r", "confidence": 0.8}},
        {"data": {"rationale": "r", "confidence": 0.8}},
    ],
    ids=["ok-and-data", "data-only"],
)
def test_the_payload_under_data_is_the_data(payload: dict[str, Any]) -> None:
    assert wrap_v21(payload) == {
        "ok": True,
        "meta": {"confidence": 0.8, "risk": "medium", "explain": "r"},
        "data": {"rationale": "r", "confidence": 0.8},
    }


def test_data_next_to_other_keys_is_part_of_a_bare_payload() -> None:
    payload = {"data": {"a": 1}, "rationale": "r"}
    assert wrap_v21(payload) == {
        "ok": True,
        "meta": {"confidence": 0.5, "risk": "medium", "explain": "r"},
        "data": payload,
    }


def test_ok_true_without_data_wraps_the_whole_payload() -> None:
    assert wrap_v21({"ok": True, "rationale": "r"}) == {
        "ok": True,
        "meta": {"confidence": 0.5, "risk": "medium", "explain": "r"},
        "data": {"ok": True, "rationale": "r"},
    }


def test_non_object_data_gets_the_placeholder_explain() -> None:
    assert wrap_v21({"data": ["a", "b"]}) == {
        "ok": True,
        "meta": {"confidence": 0.5, "risk": "medium", "explain": NO_EXPLANATION},
        "data": ["a", "b"],
    }


def test_risk_follows_the_given_rule_and_defaults_to_the_changes_rule() -> None:
    payload = {"changes": [{"risk": "low"}], "issues": [{"risk": "high"}], "rationale": "r"}
    by_default, by_issues = wrap_v21(payload), wrap_v21(payload, "max_issues_risk")
    assert by_default is not None and by_default["meta"]["risk"] == "low"
    assert by_issues is not None and by_issues["meta"]["risk"] == "high"


def test_explain_from() -> None:
    assert explain_from("  " + "x" * 300) == "x" * 200
    assert explain_from("   ") == NO_EXPLANATION
    assert explain_from(None) == NO_EXPLANATION
