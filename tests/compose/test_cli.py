"""The command line runs composites as the server does (steps from the modules beside them)."""

from __future__ import annotations

import json

import pytest

from proxy.cli import main
from tests.conftest import MODULES, ROOT

DEMO = str(ROOT / "policies" / "demo.yaml")


def test_run_with_a_policy_runs_the_steps(capsys: pytest.CaptureFixture[str]) -> None:
    case = MODULES / "code-review-pipeline" / "tests" / "clean_function"
    code = main(
        [
            "run",
            "code-review-pipeline",
            "--modules",
            str(MODULES),
            "--input",
            f"{case}.input.json",
            "--policy",
            DEMO,
        ]
    )
    out = capsys.readouterr()
    envelope = json.loads(out.out)
    assert code == 0 and envelope["ok"] is True
    assert envelope["data"]["style_issues"] == [] and "security_issues" not in envelope["data"]
    assert "decision: accept" in out.err


def test_golden_tests_of_a_composite_through_a_policy(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["test", "code-review-pipeline", "--modules", str(MODULES), "--policy", DEMO])
    assert code == 0 and "3 passed, 0 failed" in capsys.readouterr().out
