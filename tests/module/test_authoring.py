"""Writing a module from the docs: ``cogproxy new``, ``validate`` on golden cases, ``test``
messages, and module arguments (a name or a path) that say what they could not find."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from proxy.cli import main
from proxy.module.golden import GoldenCase, evaluate
from tests.conftest import MODULES, write_module

TIERS = ("exec", "decision", "exploration")


@pytest.mark.parametrize("tier", TIERS)
def test_new_scaffolds_a_module_that_validates_and_passes_its_test(
    tier: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["new", "sentiment", "--tier", tier, "--dir", str(tmp_path)]) == 0
    root = tmp_path / "sentiment"
    assert (
        "CHANGE" in (root / "module.yaml").read_text()
        and f"tier: {tier}" in (root / "module.yaml").read_text()
    )
    capsys.readouterr()
    assert main(["validate", str(root), "--v22"]) == 0, capsys.readouterr().out
    out = capsys.readouterr().out
    assert "warning" not in out and out.strip().endswith("valid (v2.2)")
    assert main(["test", "sentiment", "--modules", str(tmp_path)]) == 0
    assert capsys.readouterr().out.strip().splitlines()[-1] == "1 passed, 0 failed"


def test_new_refuses_an_existing_directory_and_a_bad_name(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["new", "dup", "--dir", str(tmp_path)]) == 0
    assert main(["new", "dup", "--dir", str(tmp_path)]) == 2
    assert "already exists" in capsys.readouterr().err
    assert main(["new", "Bad_Name", "--dir", str(tmp_path)]) == 2
    assert "lowercase letters" in capsys.readouterr().err
    assert not (tmp_path / "Bad_Name").exists()


def _scaffolded(tmp_path: Path) -> Path:
    assert main(["new", "senti", "--tier", "exec", "--dir", str(tmp_path)]) == 0
    return tmp_path / "senti"


def test_validate_checks_the_expected_answer_against_the_contract(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = _scaffolded(tmp_path)
    expected = root / "tests" / "example.expected.json"
    doc = json.loads(expected.read_text())
    doc["data"]["label"] = "glowing"
    expected.write_text(json.dumps(doc))
    capsys.readouterr()
    assert main(["validate", str(root)]) == 1
    out = capsys.readouterr().out
    assert f"{expected}: data.label: must be one of ['positive', 'negative', 'neutral']" in out


def test_validate_checks_a_contract_form_example(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = _scaffolded(tmp_path)
    expected = root / "tests" / "example.expected.json"
    example = json.loads(expected.read_text())
    example["meta"]["risk"] = "extreme"
    expected.write_text(json.dumps({"$validate": {"ok": {"const": True}}, "$example": example}))
    capsys.readouterr()
    assert main(["validate", str(root)]) == 1
    assert f"{expected}: $example.meta.risk: must be one of" in capsys.readouterr().out


def test_validate_checks_the_input_against_the_input_schema(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = _scaffolded(tmp_path)
    given = root / "tests" / "example.input.json"
    given.write_text(json.dumps({"text": 42}))
    capsys.readouterr()
    assert main(["validate", str(root)]) == 1
    assert f"{given}: input.text: must be string" in capsys.readouterr().out


def test_a_module_without_golden_tests_is_a_warning_for_validate_and_an_error_for_test(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = write_module(tmp_path, "untested")
    assert main(["validate", str(path)]) == 0
    assert "warning:" in capsys.readouterr().out
    assert main(["test", str(path)]) == 1
    assert "no golden tests to run" in capsys.readouterr().err


def test_test_prints_the_real_cause_of_a_failing_case(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = _scaffolded(tmp_path)
    expected = root / "tests" / "example.expected.json"
    example = json.loads(expected.read_text())
    example["data"]["label"] = "glowing"
    rules = {"ok": {"const": True}, "data": {"required": ["label"]}}
    expected.write_text(json.dumps({"$validate": rules, "$example": example}))
    capsys.readouterr()
    assert main(["test", str(root)]) == 1
    out = capsys.readouterr().out
    assert "contract (E3001): data.label: must be one of ['positive', 'negative', 'neutral']" in out
    assert "ok: must be same as const definition: True (got false)" in out


def test_a_wrong_answer_is_named_by_path_with_expected_and_got() -> None:
    want = {"ok": True, "meta": {"confidence": 0.9}, "data": {"label": "neutral", "tags": ["a", "b"]}}
    got = {"ok": True, "meta": {"confidence": 0.9}, "data": {"label": "negative", "tags": ["a", "c"]}}
    assert evaluate(GoldenCase("c", {}, want), got) == [
        'data.label: expected "neutral", got "negative"',
        'data.tags[1]: expected "b", got "c"',
    ]
    assert evaluate(GoldenCase("c", {}, want), {"ok": True, "meta": {"confidence": 0.9}}) == [
        'data: expected {"label":"neutral","tags":["a","b"]}, got nothing'
    ]


@pytest.mark.parametrize("command", ["validate", "test"])
def test_module_commands_accept_a_name(command: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main([command, "code-reviewer", "--modules", str(MODULES)]) == 0, capsys.readouterr()


@pytest.mark.parametrize("command", ["validate", "test", "run"])
def test_module_commands_say_what_they_could_not_find(
    command: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    extra = ["--input", str(MODULES / "code-reviewer" / "tests" / "case_minor_issues.input.json")]
    extra = extra if command == "run" else []
    assert main([command, str(tmp_path / "nonexistent"), *extra]) == 1
    assert f"{tmp_path / 'nonexistent'}: no such directory" in capsys.readouterr().err
    assert main([command, str(tmp_path), *extra]) == 1
    assert f"{tmp_path}: not a module" in "".join(capsys.readouterr())
    assert main([command, "nope", "--modules", str(MODULES), *extra]) == 1
    err = capsys.readouterr().err
    assert f"no such module in {MODULES}" in err and "code-reviewer" in err
    assert main([command, "code-reviewer", "--modules", str(tmp_path / "gone"), *extra]) == 1
    assert f"{tmp_path / 'gone'} does not exist" in capsys.readouterr().err
