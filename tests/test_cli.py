"""The cogproxy command line, run as users run it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from proxy.cli import main
from tests.conftest import MODULES, VECTORS, write_module


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "proxy", *args], capture_output=True, text=True, check=False)


def test_conformance_on_the_official_vectors() -> None:
    result = run_cli("conformance", str(VECTORS))
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.strip().splitlines()[-1] == "16 passed, 0 failed"


def test_conformance_without_an_argument_runs_the_vectors_shipped_in_the_package(tmp_path: Path) -> None:
    """A user's clone (or an installed wheel) has no spec checkout: the vectors ship as package data."""
    result = subprocess.run(
        [sys.executable, "-m", "proxy", "conformance"],
        capture_output=True,
        text=True,
        check=False,
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.strip().splitlines()[-1] == "16 passed, 0 failed"


def test_conformance_reports_each_failing_vector(tmp_path: Path) -> None:
    bad = {"$test": {"name": "wrongly-valid", "expects": "accept"}, "envelope": {"ok": True}}
    good = {
        "$test": {"name": "fine", "expects": "reject", "error_codes": ["E3001"]},
        "envelope": {"ok": True},
    }
    (tmp_path / "a.json").write_text(json.dumps(bad))
    (tmp_path / "b.json").write_text(json.dumps(good))
    result = run_cli("conformance", str(tmp_path))
    assert result.returncode == 1
    lines = result.stdout.strip().splitlines()
    assert lines[0].startswith("FAIL a.json (wrongly-valid): should be accepted")
    assert lines[-1] == "1 passed, 1 failed"


def test_validate_reports_one_line_per_problem(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = write_module(
        tmp_path,
        "weak",
        manifest={"overflow": None},
        schema={
            "meta": {"type": "object", "properties": {"explain": {"maxLength": 500}}},
            "data": {"type": "object"},
        },
        prompt="Do it.",
    )
    assert main(["validate", str(path), "--v22"]) == 1
    lines = capsys.readouterr().out.strip().splitlines()
    assert any("overflow is missing" in line for line in lines)
    assert any("enums is missing" in line for line in lines)
    assert any("meta.confidence must be declared" in line for line in lines)
    assert any("maxLength <= 280" in line for line in lines)
    assert any("data.rationale must be declared" in line for line in lines)
    assert any("does not explain the v2.2 envelope" in line for line in lines)
    assert main(["validate", str(path)]) == 0  # the plain check passes: the module loads


def test_validate_broken_module_exits_non_zero(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = write_module(tmp_path, "broken")
    (path / "schema.json").write_text("[")
    assert main(["validate", str(path)]) == 1
    assert "invalid JSON" in capsys.readouterr().out


def test_run_prints_the_envelope(capsys: pytest.CaptureFixture[str]) -> None:
    input_file = MODULES / "code-simplifier" / "tests" / "case1.input.json"
    assert main(["run", "code-simplifier", "--modules", str(MODULES), "--input", str(input_file)]) == 0
    envelope = json.loads(capsys.readouterr().out)
    assert envelope["ok"] is True and envelope["meta"]["confidence"] >= 0.9


def test_run_with_invalid_input_answers_the_input_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "in.json"
    bad.write_text("{}")
    assert main(["run", str(MODULES / "code-simplifier"), "--input", str(bad)]) == 1
    assert json.loads(capsys.readouterr().out)["error"]["code"] == "E1002"


def test_run_unknown_module(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "in.json").write_text("{}")
    assert main(["run", "nope", "--modules", str(MODULES), "--input", str(tmp_path / "in.json")]) == 1
    assert "no such module" in capsys.readouterr().err


def test_console_script_is_installed() -> None:
    exe = Path(sys.executable).with_name("cogproxy")
    result = subprocess.run([str(exe), "--version"], capture_output=True, text=True, check=False)
    assert result.returncode == 0 and result.stdout.startswith("cogproxy ")


def test_policy_check_prints_a_summary(capsys: pytest.CaptureFixture[str]) -> None:
    from tests.conftest import ROOT

    assert main(["policy", "check", str(ROOT / "policies" / "default.yaml")]) == 0
    out = capsys.readouterr().out
    assert "valid" in out and "1. strong: openai/gpt-4o, anthropic/claude-sonnet-4-20250514" in out
    assert "exec: min_confidence 0.9, max_risk low, exhausted reject, start fast" in out


def test_policy_check_summarises_prices_and_limits(capsys: pytest.CaptureFixture[str]) -> None:
    from tests.conftest import ROOT

    assert main(["policy", "check", str(ROOT / "policies" / "examples" / "cost-saving-cascade.yaml")]) == 0
    out = capsys.readouterr().out
    assert "  openai/gpt-4o: 2.5/10" in out
    assert "limits (window 60s; over a budget: downgrade):" in out
    assert "  client batch-indexer: rpm 3000, tpm 2000000, usd/day 200" in out


def test_policy_check_refuses_a_bad_file_naming_the_key(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text(
        "version: 1\nproviders: {p: {kind: openai, base_url: 'http://x'}}\n"
        "ladder: [{name: a, targets: [p/m]}]\ntiers: {exec: {min_confidence: 2, max_risk: low}}\n"
    )
    assert main(["policy", "check", str(bad)]) == 1
    assert f"{bad}: tiers.exec.min_confidence: must be smaller than or equal to 1" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["--tier", "exec", "--confidence", "0.95", "--risk", "low"], "decision: accept (meets thresholds)"),
        (
            ["--tier", "decision", "--confidence", "0.5", "--risk", "low"],
            "decision: escalate (confidence 0.5 < min_confidence 0.7)\nnext: rung 1 (strong)",
        ),
        (
            ["--tier", "exec", "--confidence", "0.95", "--risk", "medium", "--rung", "1"],
            "decision: reject (risk medium > max_risk low on the top rung)",
        ),
        (
            ["--module", "code-reviewer", "--confidence", "0.9", "--risk", "high", "--rung", "1"],
            "decision: review (risk high > max_risk medium on the top rung)",
        ),
    ],
)
def test_policy_explain(args: list[str], expected: str, capsys: pytest.CaptureFixture[str]) -> None:
    from tests.conftest import ROOT

    code = main(
        [
            "policy",
            "explain",
            "--policy",
            str(ROOT / "policies" / "default.yaml"),
            "--modules",
            str(MODULES),
            *args,
        ]
    )
    assert code == 0
    assert expected in capsys.readouterr().out


def test_policy_explain_applies_module_overrides(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from tests.conftest import ROOT

    text = (ROOT / "policies" / "examples" / "cost-saving-cascade.yaml").read_text()
    assert (
        main(
            [
                "policy",
                "explain",
                "--policy",
                str(ROOT / "policies/examples/cost-saving-cascade.yaml"),
                "--modules",
                str(MODULES),
                "--module",
                "code-reviewer",
                "--confidence",
                "0.75",
                "--risk",
                "low",
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    assert "min_confidence 0.8" in out and "decision: escalate" in out
    assert "code-reviewer: {min_confidence: 0.8}" in text


def test_every_shipped_policy_checks() -> None:
    from tests.conftest import ROOT

    for path in sorted((ROOT / "policies").rglob("*.yaml")):
        assert main(["policy", "check", str(path)]) == 0, path


def test_golden_tests_through_a_policy_use_the_pipeline() -> None:
    from tests.conftest import ROOT

    result = run_cli("test", str(MODULES / "code-reviewer"), "--policy", str(ROOT / "policies" / "demo.yaml"))
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.strip().splitlines()[-1] == "4 passed, 0 failed"


async def test_golden_tests_fail_when_the_provider_answers_garbage(tmp_path: Path) -> None:
    import asyncio

    import yaml

    from tests.fake_upstream import FakeUpstream
    from tests.proxy_server import upstream_policy

    async with FakeUpstream.start() as fake:
        fake.set_default_reply("cheap", "not an envelope")
        fake.set_default_reply("strong", "still not an envelope")
        policy = tmp_path / "policy.yaml"
        policy.write_text(yaml.safe_dump(upstream_policy(fake)))
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "proxy",
            "test",
            str(MODULES / "code-simplifier"),
            "--policy",
            str(policy),
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        out, _ = await proc.communicate()
    assert proc.returncode == 1
    assert (
        out.decode().strip().splitlines()[-1].endswith("failed")
        and "FAIL code-simplifier/case1" in out.decode()
    )


def _calibrated_policy(tmp_path: Path) -> Path:
    from tests.conftest import ROOT

    doc = yaml.safe_load((ROOT / "policies" / "default.yaml").read_text())
    first = doc["ladder"][0]["targets"][0]
    doc["calibration"] = {first: {"points": [[0.0, 0.0], [0.95, 0.81], [1.0, 0.85]]}}
    doc["cache"] = {"tiers": {"decision": {"ttl_s": 600}}}
    path = tmp_path / "calibrated.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def test_policy_explain_decides_on_the_calibrated_confidence_and_shows_the_cache_rule(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """0.95 reported maps to 0.81 on the rung's first target: below exec's 0.9, so not accepted there."""
    policy = str(_calibrated_policy(tmp_path))
    args = ["policy", "explain", "--policy", policy, "--confidence", "0.95", "--risk", "low"]
    assert main([*args, "--tier", "exec"]) == 0
    out = capsys.readouterr().out
    assert "calibrated 0.81" in out and "decision: accept" not in out
    assert main([*args, "--tier", "decision"]) == 0
    out = capsys.readouterr().out
    assert "decision: accept" in out and "cache: accepted answers reused for 600s" in out


def test_policy_check_lists_calibration_maps_and_cache_rules(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["policy", "check", str(_calibrated_policy(tmp_path))]) == 0
    out = capsys.readouterr().out
    assert "calibration (reported -> decided confidence):" in out and "0.95 -> 0.81" in out
    assert "cache:" in out and "tier decision: 600s" in out
