"""Contract honesty (issue #12, findings 3-7), driven through a live proxy and the fake upstream:
the HTTP status says what the proxy and the caller did, never what a model wrote; unparseable or
cut output is the model's outcome; ``partial_data`` only where the module allows it; the risk
that routes follows ``risk_source``; E2002, E2003 and E4000 are emitted where they apply."""

from __future__ import annotations

import dataclasses
import json
import shutil
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from proxy.api.app_keys import RUNTIME
from proxy.policy.model import ProviderConfig
from proxy.upstream.base import CallInfo, Relayed
from proxy.upstream.body import Body
from tests.conftest import MODULES, ProxyWith
from tests.fake_upstream import FakeUpstream, Fault
from tests.proxy_server import RunningProxy, upstream_policy

REVIEW_INPUT = {"code": "def f(x):\n    return x\n", "language": "python"}
PATCH_INPUT = {"config": '{"a": 1}', "format": "json", "request": "set a to 2"}
RUNGS = ("cheap", "strong")


def review(confidence: float = 0.95, risk: str = "low") -> dict[str, Any]:
    return {
        "ok": True,
        "meta": {"confidence": confidence, "risk": risk, "explain": "e"},
        "data": {"issues": [], "summary": "s", "verdict": "approve", "rationale": "r"},
    }


def patch(confidence: float = 0.95, meta_risk: str = "low", change_risk: str = "low") -> dict[str, Any]:
    return {
        "ok": True,
        "meta": {"confidence": confidence, "risk": meta_risk, "explain": "Sets a."},
        "data": {
            "patch": [{"op": "replace", "path": "/a", "value": 2}],
            "changes": [{"type": "update_setting", "description": "a", "scope": "key", "risk": change_risk}],
            "result_config": '{"a": 2}',
            "rationale": "Set a.",
        },
    }


def failure(code: str) -> dict[str, Any]:
    return {
        "ok": False,
        "meta": {"confidence": 0.0, "risk": "high", "explain": f"The model says {code}."},
        "error": {"code": code, "message": f"model wrote {code}"},
    }


async def execute(px: RunningProxy, module: str, value: Any) -> tuple[int, dict[str, str], dict[str, Any]]:
    async with aiohttp.ClientSession() as session:
        resp = await session.post(px.base + f"/modules/{module}/execute", json={"input": value})
        return resp.status, dict(resp.headers), await resp.json()


async def chat(px: RunningProxy, module: str, value: Any) -> tuple[int, dict[str, str], dict[str, Any]]:
    async with aiohttp.ClientSession() as session:
        resp = await session.post(
            px.base + "/chat/completions",
            json={"model": f"module:{module}", "messages": [{"role": "user", "content": json.dumps(value)}]},
        )
        return resp.status, dict(resp.headers), await resp.json()


async def metrics_text(px: RunningProxy) -> str:
    async with aiohttp.ClientSession() as session:
        resp = await session.get(px.url + "/metrics")
        return await resp.text()


def every_rung(fake: FakeUpstream, reply: str | Fault) -> None:
    for model in RUNGS:
        fake.script(model, reply)


@pytest.fixture
def permissive_modules(tmp_path: Path) -> Path:
    """code-reviewer whose error schema also lists the runtime codes a model might write."""
    root = tmp_path / "modules"
    shutil.copytree(MODULES / "code-reviewer", root / "code-reviewer")
    schema_path = root / "code-reviewer" / "schema.json"
    schema = json.loads(schema_path.read_text())
    schema["error"]["properties"]["code"]["enum"] += ["E4001", "E4002"]
    schema_path.write_text(json.dumps(schema))
    return root


@pytest.fixture
async def permissive(
    proxy_with: ProxyWith, policy: dict[str, Any], permissive_modules: Path
) -> AsyncIterator[RunningProxy]:
    async with proxy_with(policy, modules=(permissive_modules,)) as px:
        yield px


# -- finding 3: a model's output never sets the HTTP status ----------------------------------------


@pytest.mark.parametrize("code", ["E4001", "E4002", "E1001"])
async def test_a_model_failure_envelope_is_200_with_its_code_kept(
    permissive: RunningProxy, fake_upstream: FakeUpstream, code: str
) -> None:
    every_rung(fake_upstream, json.dumps(failure(code)))
    status, headers, env = await execute(permissive, "code-reviewer", REVIEW_INPUT)
    assert status == 200, "the model wrote the code; the proxy and the caller did nothing wrong"
    assert env["ok"] is False and env["error"]["code"] == code
    assert env["error"]["message"] == f"model wrote {code}", "the model's own envelope, not the proxy's"
    assert "Retry-After" not in headers, "SDKs would retry a call that nothing throttled"
    assert headers["X-Cognitive-Decision"] == "review"


async def test_a_model_failure_envelope_over_chat_is_a_completion(
    permissive: RunningProxy, fake_upstream: FakeUpstream
) -> None:
    every_rung(fake_upstream, json.dumps(failure("E4002")))
    status, headers, reply = await chat(permissive, "code-reviewer", REVIEW_INPUT)
    assert status == 200 and "Retry-After" not in headers
    env = json.loads(reply["choices"][0]["message"]["content"])
    assert env["error"]["code"] == "E4002" and reply["cognitive"]["decision"] == "review"


# -- finding 4: unparseable model output is the model's outcome ------------------------------------


async def test_prose_from_the_model_is_200_e1000_with_an_operator_suggestion(
    proxy: RunningProxy, fake_upstream: FakeUpstream
) -> None:
    every_rung(fake_upstream, "Sorry, I cannot produce JSON today.")
    status, headers, env = await execute(proxy, "code-reviewer", REVIEW_INPUT)
    assert status == 200 and env["ok"] is False and env["error"]["code"] == "E1000"
    assert "model's answer could not be parsed" in env["meta"]["explain"]
    suggestion = env["error"]["suggestion"]
    assert "max_tokens" in suggestion and "reask" in suggestion and "prompt" in suggestion
    assert "Send a body" not in suggestion
    assert headers["X-Cognitive-Decision"] == "review"


async def test_prose_over_chat_is_a_completion_not_a_400(
    proxy: RunningProxy, fake_upstream: FakeUpstream
) -> None:
    every_rung(fake_upstream, "no json here")
    status, _, reply = await chat(proxy, "code-reviewer", REVIEW_INPUT)
    assert status == 200
    assert json.loads(reply["choices"][0]["message"]["content"])["error"]["code"] == "E1000"


@pytest.mark.parametrize("body", [b"{not json", b"[1, 2]"], ids=["invalid", "not-an-object"])
async def test_the_callers_malformed_body_is_a_400_e1000_envelope(
    proxy: RunningProxy, fake_upstream: FakeUpstream, body: bytes
) -> None:
    async with aiohttp.ClientSession() as session:
        resp = await session.post(
            proxy.base + "/modules/code-reviewer/execute",
            data=body,
            headers={"Content-Type": "application/json"},
        )
        env = await resp.json()
    assert resp.status == 400 and env["ok"] is False and env["error"]["code"] == "E1000"
    assert env["error"]["suggestion"] == "Send a body that is one JSON object"
    assert env["meta"]["trace_id"] == resp.headers["X-Cognitive-Trace-Id"]
    assert fake_upstream.count() == 0


# -- finding 5: partial_data only where failure.partial_allowed -----------------------------------


def _no_partial_anywhere(env: dict[str, Any]) -> None:
    assert "partial_data" not in env
    assert '"Set a."' not in json.dumps(env), "no trace of the model's data in a forbidden partial"


async def test_schema_failure_on_a_module_without_partial_data(
    fake_upstream: FakeUpstream, proxy_with: ProxyWith
) -> None:
    broken = patch()
    del broken["data"]["result_config"]
    every_rung(fake_upstream, json.dumps(broken))
    policy = upstream_policy(fake_upstream, modules={"config-patcher": {"exhausted": "review"}})
    async with proxy_with(policy) as px:
        status, _, env = await execute(px, "config-patcher", PATCH_INPUT)
    assert status == 200 and env["error"]["code"] == "E3001"
    _no_partial_anywhere(env)


async def test_schema_failure_keeps_partial_data_where_allowed(
    proxy: RunningProxy, fake_upstream: FakeUpstream
) -> None:
    broken = review()
    del broken["data"]["verdict"]
    every_rung(fake_upstream, json.dumps(broken))
    status, _, env = await execute(proxy, "code-reviewer", REVIEW_INPUT)
    assert status == 200 and env["error"]["code"] == "E3001"
    assert env["partial_data"]["summary"] == "s"


async def test_policy_reject_on_a_module_without_partial_data(
    proxy: RunningProxy, fake_upstream: FakeUpstream
) -> None:
    every_rung(fake_upstream, json.dumps(patch(confidence=0.6)))
    status, headers, env = await execute(proxy, "config-patcher", PATCH_INPUT)
    assert status == 200 and headers["X-Cognitive-Decision"] == "reject" and env["error"]["code"] == "E2001"
    _no_partial_anywhere(env)


async def test_policy_reject_keeps_the_last_data_where_allowed(
    fake_upstream: FakeUpstream, proxy_with: ProxyWith
) -> None:
    every_rung(fake_upstream, json.dumps(review(confidence=0.2)))
    policy = upstream_policy(fake_upstream, modules={"code-reviewer": {"exhausted": "reject"}})
    async with proxy_with(policy) as px:
        status, _, env = await execute(px, "code-reviewer", REVIEW_INPUT)
    assert status == 200 and env["error"]["code"] == "E2001"
    assert env["partial_data"]["verdict"] == "approve"


# -- finding 6: the risk that routes follows risk_source -------------------------------------------


@pytest.mark.parametrize(
    ("overrides", "decision", "routed"),
    [
        ({}, "reject", "high"),  # default: max
        (
            {"tiers": {"exec": {"min_confidence": 0.9, "max_risk": "low", "risk_source": "rule"}}},
            "reject",
            "high",
        ),
        ({"modules": {"config-patcher": {"risk_source": "model"}}}, "accept", "low"),
    ],
    ids=["max-default", "rule-tier", "model-module"],
)
async def test_a_model_that_understates_its_risk(
    fake_upstream: FakeUpstream, overrides: dict[str, Any], decision: str, routed: str, proxy_with: ProxyWith
) -> None:
    every_rung(fake_upstream, json.dumps(patch(meta_risk="low", change_risk="high")))
    policy = upstream_policy(fake_upstream)
    for key, value in overrides.items():
        policy[key] = {**policy.get(key, {}), **value}
    async with proxy_with(policy) as px:
        status, headers, reply = await chat(px, "config-patcher", PATCH_INPUT)
        exported = await metrics_text(px)
    assert status == 200 and headers["X-Cognitive-Decision"] == decision
    attempts = reply["cognitive"]["attempts"]
    assert all(a["model_risk"] == "low" and a["rule_risk"] == "high" for a in attempts)
    assert [a["risk"] for a in attempts] == [routed] * len(attempts)
    env = json.loads(reply["choices"][0]["message"]["content"])
    if decision == "accept":
        assert env["ok"] is True and env["meta"]["risk"] == "low" and len(attempts) == 1
    else:
        assert env["error"]["code"] == "E2001" and "risk high > max_risk low" in env["meta"]["explain"]
        assert len(attempts) == 2, "escalated once, then rejected on the top rung"
    line = f'cognitive_risk_disagreements_total{{module="config-patcher"}} {float(len(attempts))}'
    assert line in exported


async def test_agreeing_risks_are_not_counted(proxy: RunningProxy, fake_upstream: FakeUpstream) -> None:
    every_rung(fake_upstream, json.dumps(patch()))
    status, headers, _ = await execute(proxy, "config-patcher", PATCH_INPUT)
    assert status == 200 and headers["X-Cognitive-Decision"] == "accept"
    assert "cognitive_risk_disagreements_total{" not in await metrics_text(proxy)


async def test_the_routed_risk_is_the_one_the_caller_sees(
    proxy: RunningProxy, fake_upstream: FakeUpstream
) -> None:
    # decision tier (max_risk medium): a model saying "low" over a "high" issue goes to review as high
    answer = review(risk="low")
    answer["data"]["issues"] = [
        {
            "severity": "major",
            "category": "correctness",
            "line": 1,
            "description": "d",
            "suggestion": "s",
            "risk": "high",
        }
    ]
    every_rung(fake_upstream, json.dumps(answer))
    status, headers, env = await execute(proxy, "code-reviewer", REVIEW_INPUT)
    assert status == 200 and headers["X-Cognitive-Decision"] == "review"
    assert env["meta"]["risk"] == "high" and headers["X-Cognitive-Risk"] == "high"
    assert env["data"]["issues"] == answer["data"]["issues"], "data untouched"


# -- finding 7: E2002, E2003, E4000 ---------------------------------------------------------------


@pytest.mark.parametrize(("module", "partial"), [("code-reviewer", True), ("config-patcher", False)])
async def test_deadline_spent_while_a_rung_answers_is_e2002(
    fake_upstream: FakeUpstream, module: str, partial: bool, proxy_with: ProxyWith
) -> None:
    weak = review(confidence=0.1) if module == "code-reviewer" else patch(confidence=0.1)
    fake_upstream.script("cheap", json.dumps(weak))
    fake_upstream.script("strong", Fault.slow(5))
    policy = upstream_policy(
        fake_upstream, failover={"retries": 0, "timeout": {"per_try_s": 0.5, "total_s": 0.5}}
    )
    value = REVIEW_INPUT if module == "code-reviewer" else PATCH_INPUT
    async with proxy_with(policy) as px:
        status, headers, env = await execute(px, module, value)
    assert status == 200 and env["ok"] is False and env["error"]["code"] == "E2002"
    assert "Retry-After" not in headers and headers["X-Cognitive-Decision"] == "reject"
    assert ("partial_data" in env) is partial
    if partial:
        assert env["partial_data"] == weak["data"], "the last answer's data, where allowed"


async def test_providers_down_before_the_deadline_stay_e4001(
    fake_upstream: FakeUpstream, proxy_with: ProxyWith
) -> None:
    every_rung(fake_upstream, Fault.http(503))
    policy = upstream_policy(fake_upstream, failover={"retries": 0})
    async with proxy_with(policy) as px:
        status, headers, env = await execute(px, "code-reviewer", REVIEW_INPUT)
    assert status == 503 and env["error"]["code"] == "E4001" and "Retry-After" in headers


async def test_output_cut_at_the_token_limit_is_e2003_even_when_it_parses(
    proxy: RunningProxy, fake_upstream: FakeUpstream
) -> None:
    fake_upstream.script("cheap", Fault.cut(json.dumps(review())))
    fake_upstream.script("strong", json.dumps(review()))
    status, headers, reply = await chat(proxy, "code-reviewer", REVIEW_INPUT)
    assert status == 200 and headers["X-Cognitive-Decision"] == "escalated"
    first = reply["cognitive"]["attempts"][0]
    assert first["error"] == "contract:E2003" and first["outcome"] == "escalate"


@pytest.mark.parametrize("target", ["up/cheap", "anth/claude-x"], ids=["openai", "anthropic"])
async def test_cut_output_on_the_top_rung_is_answered_e2003(
    fake_upstream: FakeUpstream, target: str, proxy_with: ProxyWith
) -> None:
    fake_upstream.script(target.split("/")[1], Fault.cut('{"ok": true, "meta": {"confidence": 0.9, "ri'))
    policy = upstream_policy(fake_upstream, ladder=[{"name": "only", "targets": [target]}], aliases={})
    async with proxy_with(policy) as px:
        status, _, env = await execute(px, "code-reviewer", REVIEW_INPUT)
    assert status == 200 and env["ok"] is False and env["error"]["code"] == "E2003"
    assert "max_tokens" in env["error"]["suggestion"] and "partial_data" not in env


class _BrokenProvider:
    """A provider with a bug: it raises something no provider is supposed to raise."""

    def __init__(self, config: ProviderConfig) -> None:
        self.config = config

    async def complete(
        self, body: dict[str, Any], model: str, ctx: CallInfo, timeout: float
    ) -> dict[str, Any]:
        raise KeyError("a bug inside a module call")

    async def relay(self, body: dict[str, Any], model: str, ctx: CallInfo, timeout: float) -> Relayed:
        raise KeyError("a bug")

    def stream(
        self, body: dict[str, Any], model: str, ctx: CallInfo, timeout: float, *, bound_reads: bool = True
    ) -> AsyncIterator[bytes]:
        raise KeyError("a bug")

    async def relay_stream(self, body: dict[str, Any], model: str, ctx: CallInfo, timeout: float) -> Body:
        raise KeyError("a bug")


@pytest.mark.parametrize("route", ["execute", "chat"])
async def test_an_internal_error_in_a_module_call_is_a_500_e4000_envelope(
    proxy: RunningProxy, route: str
) -> None:
    # Test-only injection: no input a client or model can send reaches a proxy bug we know of.
    holder = proxy.app[RUNTIME]
    assert holder.current is not None
    providers = dict(holder.current.providers)
    providers["up"] = _BrokenProvider(providers["up"].config)
    holder.current = dataclasses.replace(holder.current, providers=providers)
    status, headers, env = await (execute if route == "execute" else chat)(
        proxy, "code-reviewer", REVIEW_INPUT
    )
    assert status == 500 and env["ok"] is False and env["error"]["code"] == "E4000"
    assert env["meta"]["trace_id"] == headers["X-Cognitive-Trace-Id"]
    assert "a bug" not in json.dumps(env), "the cause goes to the log, not to the caller"
    assert env["meta"]["confidence"] == 0.0
