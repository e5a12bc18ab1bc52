"""Golden tests: the $validate/$example form, plain expected envelopes, and failures."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from proxy.cli import offline_envelope
from proxy.module.golden import example_for, run_golden
from proxy.module.loader import load_module
from tests.conftest import success, write_module


def add_case(path: Path, name: str, value: Any, expected: Any) -> None:
    tests = path / "tests"
    tests.mkdir(exist_ok=True)
    (tests / f"{name}.input.json").write_text(json.dumps(value))
    (tests / f"{name}.expected.json").write_text(json.dumps(expected))


def test_validate_example_form_passes_and_fails(tmp_path: Path) -> None:
    path = write_module(tmp_path, "golden")
    add_case(
        path,
        "good",
        {"code": "x"},
        {"$validate": {"ok": {"const": True}, "data": {"required": ["result"]}}, "$example": success()},
    )
    add_case(
        path,
        "bad",
        {"code": "y"},
        {"$validate": {"meta": {"properties": {"confidence": {"minimum": 0.95}}}}, "$example": success()},
    )
    outcomes = {o.name: o for o in run_golden(load_module(path), offline_envelope)}
    assert outcomes["good"].passed
    assert outcomes["bad"].problems == ("meta.confidence: must be bigger than or equal to 0.95 (got 0.9)",)


def test_plain_expected_envelope_is_compared(tmp_path: Path) -> None:
    path = write_module(tmp_path, "plain")
    add_case(path, "same", {"code": "x"}, success())
    outcomes = run_golden(load_module(path), offline_envelope)
    assert [o.passed for o in outcomes] == [True]


def test_example_that_breaks_the_contract_fails_its_case(tmp_path: Path) -> None:
    path = write_module(tmp_path, "broken-example")
    broken = success(result=3)
    add_case(path, "case", {"code": "x"}, {"$validate": {"ok": {"const": True}}, "$example": broken})
    (outcome,) = run_golden(load_module(path), offline_envelope)
    assert outcome.problems == (
        "contract (E3001): data.result: must be string",
        "ok: must be same as const definition: True (got false)",
    )
    assert outcome.envelope is not None and outcome.envelope["error"]["code"] == "E3001"


def test_invalid_golden_input_is_caught(tmp_path: Path) -> None:
    path = write_module(tmp_path, "bad-input")
    add_case(path, "case", {"language": "py"}, success())
    (outcome,) = run_golden(load_module(path), offline_envelope)
    assert "ok: expected true, got false" in outcome.problems


def test_expected_input_error_case(tmp_path: Path) -> None:
    path = write_module(tmp_path, "input-error")
    add_case(
        path,
        "missing",
        {},
        {
            "ok": False,
            "meta": {"confidence": 0.0, "risk": "high", "explain": "x"},
            "error": {"code": "MISSING_REQUIRED_FIELD", "message": "code missing"},
        },
    )
    assert [o.passed for o in run_golden(load_module(path), offline_envelope)] == [True]


def test_unreadable_case_is_a_failure(tmp_path: Path) -> None:
    path = write_module(tmp_path, "unreadable")
    add_case(path, "case", {"code": "x"}, success())
    (path / "tests" / "case.expected.json").write_text("{")
    (outcome,) = run_golden(load_module(path), offline_envelope)
    assert not outcome.passed and "cannot read case" in outcome.problems[0]


def test_example_for_matches_the_input_exactly_or_nothing(tmp_path: Path) -> None:
    path = write_module(tmp_path, "examples")
    failure = {
        "ok": False,
        "meta": {"confidence": 0.1, "risk": "high", "explain": "x"},
        "error": {"code": "E2004", "message": "m"},
    }
    add_case(path, "a_fail", {"code": "fail"}, failure)
    add_case(path, "b_ok", {"code": "ok"}, {"$validate": {}, "$example": success(result="ok")})
    module = load_module(path)
    assert example_for(module, {"code": "fail"}) == failure
    assert example_for(module, {"code": "ok"})["data"]["result"] == "ok"
    assert example_for(module, {"code": "never seen"}) is None  # the offline demo answer takes over


def _copy_with_decisions(tmp_path: Path, decisions: dict[str, str]) -> Path:
    """The bundled code-reviewer, its cases naming the decision each expects (``$decision``)."""
    import shutil

    from tests.conftest import MODULES

    path = tmp_path / "code-reviewer"
    shutil.copytree(MODULES / "code-reviewer", path)
    for case, decision in decisions.items():
        expected = path / "tests" / f"{case}.expected.json"
        expected.write_text(json.dumps({**json.loads(expected.read_text()), "$decision": decision}))
    return path


def test_a_case_names_the_decision_it_expects_and_a_policy_run_checks_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from proxy.cli import main
    from tests.conftest import ROOT

    path = _copy_with_decisions(tmp_path, {"case_minor_issues": "escalated", "case_sql_injection": "accept"})
    assert main(["test", str(path), "--policy", str(ROOT / "policies" / "demo.yaml")]) == 1
    out = capsys.readouterr().out
    assert "PASS code-reviewer/case_minor_issues" in out
    assert "FAIL code-reviewer/case_sql_injection\n    decision: expected accept, got review" in out
    assert out.strip().splitlines()[-1] == "3 passed, 1 failed"
    assert main(["validate", str(path)]) == 0  # the plain form's $decision is not part of the example


def test_a_decision_outside_the_four_is_a_validate_problem(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from proxy.cli import main

    path = _copy_with_decisions(tmp_path, {"case_minor_issues": "escalate"})
    assert main(["validate", str(path)]) == 1
    out = capsys.readouterr().out
    assert "$decision must be one of accept, escalated, review, reject (has 'escalate')" in out


def test_evaluate_ignores_the_decision_when_nothing_decided() -> None:
    from proxy.module.golden import GoldenCase, evaluate

    case = GoldenCase("c", {}, {**success(), "$decision": "review"})
    assert evaluate(case, success()) == []
    assert evaluate(case, success(), "review") == []
    assert evaluate(case, success(), "accept") == ["decision: expected review, got accept"]


def test_validate_flags_an_example_whose_risk_disagrees_with_the_risk_rule(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from proxy.cli import main

    path = _copy_with_decisions(tmp_path, {})
    expected = path / "tests" / "case_minor_issues.expected.json"
    case = json.loads(expected.read_text())
    answer = case.get("$example", case)
    answer["meta"]["risk"] = "none"
    answer["data"]["issues"][0]["risk"] = "high"
    expected.write_text(json.dumps(case))
    assert main(["validate", str(path)]) == 1
    out = capsys.readouterr().out
    assert "meta.risk is 'none' but the module's risk_rule max_issues_risk over data gives 'high'" in out
