"""The bundled code-review-pipeline (composition.md §8.1): each step routed on its own confidence,
the security scan only when the analysis found risk, the style check only when it is confident."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml

from tests.compose.harness import chat, composed, envelope_of, execute, sent_to, steps_of
from tests.conftest import MODULES, ROOT
from tests.fake_upstream import FakeUpstream
from tests.proxy_server import running_proxy

STEPS = ["code-analyzer", "security-scanner", "style-checker", "code-review-pipeline"]
CODE = {"code": "def f(x):\n    return eval(x)\n", "language": "python"}


def _answer(confidence: float, risk: str, **data: Any) -> str:
    return json.dumps(
        {"ok": True, "meta": {"confidence": confidence, "risk": risk, "explain": "e"}, "data": data}
    )


def _analysis(confidence: float, risk: str) -> str:
    hotspots = [] if risk == "none" else [{"line": 2, "concern": "eval of a parameter", "risk": risk}]
    return _answer(
        confidence,
        risk,
        language="python",
        summary="one function",
        functions=["f"],
        hotspots=hotspots,
        rationale="r",
    )


SCAN = _answer(
    0.9,
    "medium",
    security_issues=[{"line": 2, "issue": "eval", "risk": "medium", "fix": "no eval"}],
    rationale="s",
)
STYLE = _answer(
    0.8, "low", style_issues=[{"line": 1, "issue": "name", "suggestion": "longer name"}], rationale="t"
)


async def test_risk_none_skips_the_scan_and_confidence_runs_the_style_check(
    tmp_path: Path, fake_upstream: FakeUpstream
) -> None:
    fake_upstream.script("m-code-analyzer", _analysis(0.9, "none"))
    fake_upstream.script("m-style-checker", STYLE)
    async with composed(tmp_path, fake_upstream, MODULES, STEPS) as proxy:
        status, reply = await chat(proxy, "code-review-pipeline", CODE)
    env = envelope_of(reply)
    assert status == 200 and env["ok"] is True
    assert not sent_to(fake_upstream, "security-scanner")
    assert env["data"]["style_issues"][0]["suggestion"] == "longer name"
    assert "security_issues" not in env["data"]
    assert env["meta"] == {**env["meta"], "confidence": 0.9, "risk": "low"}
    assert reply["cognitive"]["decision"] == "accept"
    assert list(steps_of(reply["cognitive"])) == ["code-analyzer", "style-checker"]


async def test_risk_runs_the_scan_and_low_confidence_skips_the_style_check(
    tmp_path: Path, fake_upstream: FakeUpstream
) -> None:
    fake_upstream.script("m-code-analyzer", _analysis(0.45, "medium"))
    fake_upstream.script("m-security-scanner", SCAN)
    async with composed(tmp_path, fake_upstream, MODULES, STEPS) as proxy:
        status, reply = await chat(proxy, "code-review-pipeline", CODE)
    env = envelope_of(reply)
    assert status == 200 and env["ok"] is True
    assert not sent_to(fake_upstream, "style-checker")
    scan_input = json.loads(
        sent_to(fake_upstream, "security-scanner")[0]["messages"][1]["content"]
        .split("```json\n")[1]
        .split("\n```")[0]
    )
    assert scan_input == {
        "code": CODE["code"],
        "hotspots": [{"line": 2, "concern": "eval of a parameter", "risk": "medium"}],
    }
    assert env["data"]["security_issues"][0]["fix"] == "no eval"
    # confidence: the lowest required step (the analysis); risk: the highest of the steps
    assert (env["meta"]["confidence"], env["meta"]["risk"]) == (0.45, "medium")
    assert reply["cognitive"]["decision"] == "review"  # the pipeline's own decision-tier thresholds
    steps = steps_of(reply["cognitive"])
    assert steps["code-analyzer"]["decision"] == "accept"  # exploration tier: 0.45 is enough
    assert steps["security-scanner"]["tier"] == "decision"


async def test_the_pipeline_runs_offline_as_make_run_serves_it(tmp_path: Path) -> None:
    policy = yaml.safe_load((ROOT / "policies" / "demo.yaml").read_text())
    case = MODULES / "code-review-pipeline" / "tests"
    value = json.loads((case / "sql_injection.input.json").read_text())
    expected = json.loads((case / "sql_injection.expected.json").read_text())["$example"]
    async with running_proxy(tmp_path, policy) as proxy:
        status, headers, env = await execute(proxy, "code-review-pipeline", value)
    assert status == 200 and env["ok"] is True
    assert env["data"] == expected["data"]
    assert (env["meta"]["confidence"], env["meta"]["risk"]) == (0.86, "high")
    assert headers["X-Cognitive-Decision"] == "review"
    # one offline call per step, and one more: the scan's high risk escalates it (decision tier)
    assert int(headers["X-Cognitive-Attempts"]) == 4


async def test_a_composite_answer_names_the_model_of_its_last_step(
    tmp_path: Path, fake_upstream: FakeUpstream
) -> None:
    """``X-Cognitive-Model`` of a composite is the last step's model (every step's in attempts)."""
    fake_upstream.script("m-code-analyzer", _analysis(0.9, "none"))
    fake_upstream.script("m-style-checker", STYLE)
    fake_upstream.script("m-code-analyzer", _analysis(0.9, "none"))
    fake_upstream.script("m-style-checker", STYLE)
    async with composed(tmp_path, fake_upstream, MODULES, STEPS) as proxy:
        status, headers, body = await execute(proxy, "code-review-pipeline", CODE)
        _, reply = await chat(proxy, "code-review-pipeline", CODE)
    assert status == 200 and body["ok"] is True
    assert headers["X-Cognitive-Model"] == "up/m-style-checker"
    models = {name: step["attempts"][-1]["target"] for name, step in steps_of(reply["cognitive"]).items()}
    assert models == {"code-analyzer": "up/m-code-analyzer", "style-checker": "up/m-style-checker"}
