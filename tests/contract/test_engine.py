"""The whole contract: raw text + module -> envelope, for every code the engine produces."""

from __future__ import annotations

import json
from typing import Any

import pytest

from proxy.contract.engine import run_contract
from proxy.contract.validate import validate_envelope
from tests.conftest import ModuleFactory, schema_with, success


def dumps(value: Any) -> str:
    return json.dumps(value)


def test_valid_answer_passes_unchanged(make_module: ModuleFactory) -> None:
    envelope = success()
    result = run_contract(dumps(envelope), make_module())
    assert result.passed
    assert result.envelope == envelope
    assert result.repairs == ()


def test_fenced_answer_is_extracted_and_recorded(make_module: ModuleFactory) -> None:
    result = run_contract("```json\n" + dumps(success()) + "\n```", make_module())
    assert result.passed
    assert [(r.kind, r.detail) for r in result.repairs] == [("json_extracted", "fence")]


def test_unparseable_answer_is_e1000(make_module: ModuleFactory) -> None:
    result = run_contract("I'm sorry, I can't do that.", make_module())
    assert result.error_code == "E1000"
    env = result.envelope
    assert env["ok"] is False and env["error"]["code"] == "E1000"
    assert env["meta"]["confidence"] == 0.0 and env["meta"]["risk"] == "high"
    assert env["error"]["details"]["name"] == "PARSE_ERROR"
    assert validate_envelope(env) == []


def test_prose_is_e1000_blaming_the_model_with_an_operator_suggestion(make_module: ModuleFactory) -> None:
    env = run_contract("Here is my review: looks fine.", make_module()).envelope
    assert env["error"]["code"] == "E1000"
    assert env["meta"]["explain"].startswith("The model's answer could not be parsed")
    assert "max_tokens" in env["error"]["suggestion"] and "reask" in env["error"]["suggestion"]


@pytest.mark.parametrize("text", [dumps(success()), '{"ok": true, "meta": {"confid'])
def test_output_cut_by_the_provider_is_e2003_whatever_it_holds(make_module: ModuleFactory, text: str) -> None:
    result = run_contract(text, make_module(), finish_reason="length")
    assert result.error_code == "E2003" and not result.passed
    assert result.envelope["error"]["code"] == "E2003" and "partial_data" not in result.envelope
    assert validate_envelope(result.envelope) == []
    assert run_contract(dumps(success()), make_module(), finish_reason="stop").passed


def test_e3001_has_no_partial_data_when_the_module_forbids_it(make_module: ModuleFactory) -> None:
    answer = success(result=42)
    result = run_contract(dumps(answer), make_module(failure={"partial_allowed": False}))
    assert result.error_code == "E3001" and "partial_data" not in result.envelope


def test_repairable_answer_passes_with_repairs(make_module: ModuleFactory) -> None:
    answer = success(changes=[{"type": "Simplify_Logic", "risk": "low"}])
    answer["meta"] = {"confidence": 0.8, "risk": "LOW", "explain": "x" * 300}
    result = run_contract(dumps(answer), make_module())
    assert result.passed, result.violations
    assert result.envelope["meta"]["risk"] == "low"
    assert len(result.envelope["meta"]["explain"]) == 280
    assert result.envelope["data"]["changes"][0]["type"] == "simplify_logic"
    assert {r.kind for r in result.repairs} == {"enum_normalized", "explain_truncated"}


def test_irreparable_answer_is_e3001_with_the_original_data(make_module: ModuleFactory) -> None:
    answer = success(result=42)
    answer["meta"]["confidence"] = "0.85"
    result = run_contract(dumps(answer), make_module())
    env = result.envelope
    assert result.error_code == "E3001"
    assert env["ok"] is False and env["error"]["code"] == "E3001"
    assert env["partial_data"] == answer["data"]
    assert env["meta"]["confidence"] == 0.0
    paths = {v["path"] for v in env["error"]["details"]["violations"]}
    assert paths == {"meta.confidence", "data.result"}
    assert validate_envelope(env) == []


@pytest.mark.parametrize(
    ("mutate", "code"),
    [
        (lambda a: a["data"].pop("rationale"), "E3003"),
        (lambda a: a["meta"].update(risk="critical"), "E3005"),
        (
            lambda a: a["data"].update(
                extensions={"insights": [{"text": "t", "suggested_mapping": "m"}] * 6}
            ),
            "E3004",
        ),
    ],
)
def test_specific_output_codes_are_reported_in_details(
    make_module: ModuleFactory, mutate: Any, code: str
) -> None:
    answer = success()
    mutate(answer)
    env = run_contract(dumps(answer), make_module()).envelope
    assert env["error"]["code"] == "E3001"  # spec §4.1: MUST be E3001
    assert code in {v["code"] for v in env["error"]["details"]["violations"]}


def test_model_failure_envelope_is_a_valid_answer_and_keeps_its_code(make_module: ModuleFactory) -> None:
    failure = {
        "ok": False,
        "meta": {"confidence": 0.3, "risk": "medium", "explain": "Unsupported."},
        "error": {"code": "UNSUPPORTED_LANGUAGE", "message": "COBOL is not supported"},
        "partial_data": {"result": "partial"},
    }
    result = run_contract(dumps(failure), make_module())
    assert result.passed
    assert result.envelope == failure


def test_model_failure_partial_data_dropped_when_not_allowed(make_module: ModuleFactory) -> None:
    failure = {
        "ok": False,
        "meta": {"confidence": 0.3, "risk": "medium", "explain": "No."},
        "error": {"code": "E2004", "message": "nothing to do"},
        "partial_data": {"result": "p"},
    }
    result = run_contract(dumps(failure), make_module(failure={"partial_allowed": False}))
    assert result.passed
    assert "partial_data" not in result.envelope
    assert result.envelope["error"]["code"] == "E2004"


def test_v21_payload_is_wrapped_when_module_accepts_it(make_module: ModuleFactory) -> None:
    module = make_module(compat={"accepts_v21_payload": True, "runtime_auto_wrap": True})
    payload = {
        "result": "y",
        "changes": [{"type": "other", "risk": "low"}, {"type": "other", "risk": "none"}],
        "confidence": 0.77,
        "rationale": "R" * 250,
    }
    result = run_contract(dumps(payload), module)
    assert result.passed, result.violations
    assert result.envelope["meta"] == {"confidence": 0.77, "risk": "low", "explain": "R" * 200}
    assert "confidence" not in result.envelope["data"]  # not declared by this data schema
    assert "v21_wrapped" in {r.kind for r in result.repairs}


def test_v21_payload_without_confidence_or_changes_gets_spec_defaults(make_module: ModuleFactory) -> None:
    module = make_module(compat={"runtime_auto_wrap": True})
    result = run_contract(dumps({"ok": True, "data": {"result": "y", "rationale": ""}}), module)
    # rationale is empty -> explain placeholder, and the answer fails on the empty rationale
    assert result.error_code == "E3001"
    result = run_contract(dumps({"ok": True, "data": {"result": "y", "rationale": "why"}}), module)
    assert result.envelope["meta"] == {"confidence": 0.5, "risk": "medium", "explain": "why"}


def test_v21_payload_is_refused_by_a_v22_only_module(make_module: ModuleFactory) -> None:
    result = run_contract(dumps({"result": "y", "rationale": "why", "confidence": 0.9}), make_module())
    assert result.error_code == "E3001"


def test_v21_confidence_is_promoted_without_coercion(make_module: ModuleFactory) -> None:
    module = make_module(
        schema=schema_with(
            data={
                "type": "object",
                "required": ["rationale"],
                "properties": {"rationale": {"type": "string"}, "confidence": {}},
            }
        ),
        compat={"runtime_auto_wrap": True},
    )
    result = run_contract(dumps({"rationale": "r", "confidence": "high"}), module)
    assert result.error_code == "E3001"
    assert result.envelope["partial_data"] == {"rationale": "r", "confidence": "high"}


def test_legacy_bare_error_answer_becomes_a_failure(make_module: ModuleFactory) -> None:
    module = make_module(compat={"runtime_auto_wrap": True})
    result = run_contract(dumps({"error": {"code": "INVALID_INPUT", "message": "not text"}}), module)
    assert result.passed
    assert result.envelope == {
        "ok": False,
        "meta": {"confidence": 0.0, "risk": "high", "explain": "not text"},
        "error": {"code": "INVALID_INPUT", "message": "not text"},
    }
