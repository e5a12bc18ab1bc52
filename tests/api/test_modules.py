"""Module mode over HTTP: chat completions, execute, catalogue; decisions and status codes."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import aiohttp
import openai
import pytest
import yaml

from tests.conftest import ROOT
from tests.fake_upstream import DROP, FakeUpstream, Fault
from tests.proxy_server import RunningProxy, cognitive_of, running_proxy


def envelope(confidence: float, risk: str = "low", **data: Any) -> str:
    body = {
        "result": "x",
        "issues": [
            {
                "severity": "minor",
                "category": "style",
                "line": 1,
                "description": "d",
                "suggestion": "s",
                "risk": risk,
            }
        ],
        "summary": "s",
        "verdict": "approve",
        "rationale": "Because.",
    }
    body.update(data)
    return json.dumps(
        {
            "ok": True,
            "meta": {"confidence": confidence, "risk": risk, "explain": "e"},
            "data": {k: v for k, v in body.items() if k != "result"},
        }
    )


REVIEW_INPUT = {"code": "def f(x):\n    return x\n", "language": "python"}


async def chat_module(proxy: RunningProxy, module: str, content: str, **kwargs: Any) -> Any:
    return await proxy.client().chat.completions.with_raw_response.create(
        model=f"module:{module}", messages=[{"role": "user", "content": content}], **kwargs
    )


async def test_module_over_chat_accepts_on_the_first_rung(
    proxy: RunningProxy, fake_upstream: FakeUpstream
) -> None:
    fake_upstream.script("cheap", envelope(0.92))
    raw = await chat_module(proxy, "code-reviewer", json.dumps(REVIEW_INPUT))
    reply = raw.parse()
    env = json.loads(reply.choices[0].message.content)
    assert env["ok"] is True and env["meta"]["confidence"] == 0.92
    assert env["meta"]["model"] == "up/cheap" and env["meta"]["latency_ms"] >= 0
    assert env["meta"]["trace_id"] == raw.headers["x-cognitive-trace-id"]
    assert raw.headers["x-cognitive-decision"] == "accept"
    assert raw.headers["x-cognitive-tier"] == "decision"
    assert raw.headers["x-cognitive-attempts"] == "1"
    cognitive = reply.model_extra["cognitive"]
    assert cognitive["decision"] == "accept" and cognitive["attempts"][0]["target"] == "up/cheap"
    sent = fake_upstream.requests[0].json
    assert sent["messages"][0]["role"] == "system" and "Envelope v2.2" in sent["messages"][0]["content"]
    assert json.dumps(REVIEW_INPUT["code"])[1:-1] in sent["messages"][1]["content"]
    assert sent["response_format"]["type"] == "json_schema"


async def test_low_confidence_escalates_to_the_next_rung(
    proxy: RunningProxy, fake_upstream: FakeUpstream
) -> None:
    fake_upstream.script("cheap", envelope(0.4))
    fake_upstream.script("strong", envelope(0.95))
    raw = await chat_module(proxy, "code-reviewer", json.dumps(REVIEW_INPUT))
    assert raw.headers["x-cognitive-decision"] == "escalated"
    assert raw.headers["x-cognitive-model"] == "up/strong"
    attempts = raw.parse().model_extra["cognitive"]["attempts"]
    assert [(a["rung"], a["outcome"], a["confidence"]) for a in attempts] == [
        ("fast", "escalate", 0.4),
        ("strong", "accept", 0.95),
    ]


async def test_high_risk_escalates_then_goes_to_review(
    proxy: RunningProxy, fake_upstream: FakeUpstream
) -> None:
    fake_upstream.script("cheap", envelope(0.95, "high"))
    fake_upstream.script("strong", envelope(0.95, "high"))
    raw = await chat_module(proxy, "code-reviewer", json.dumps(REVIEW_INPUT))
    assert raw.headers["x-cognitive-decision"] == "review"
    assert json.loads(raw.parse().choices[0].message.content)["ok"] is True


async def test_parse_failure_escalates_like_low_confidence(
    proxy: RunningProxy, fake_upstream: FakeUpstream
) -> None:
    fake_upstream.script("cheap", "Sorry, I cannot produce JSON today.")
    fake_upstream.script("strong", envelope(0.9))
    raw = await chat_module(proxy, "code-reviewer", json.dumps(REVIEW_INPUT))
    attempts = raw.parse().model_extra["cognitive"]["attempts"]
    assert attempts[0]["confidence"] == 0.0 and attempts[0]["error"] == "contract:E1000"
    assert raw.headers["x-cognitive-decision"] == "escalated"


async def test_exec_tier_rejects_with_e2001_without_partial_data(
    proxy: RunningProxy, fake_upstream: FakeUpstream
) -> None:
    patch = {
        "ok": True,
        "meta": {"confidence": 0.6, "risk": "low", "explain": "Unsure."},
        "data": {
            "patch": [{"op": "replace", "path": "/a", "value": 2}],
            "changes": [{"type": "update_setting", "description": "a", "scope": "key", "risk": "low"}],
            "result_config": '{"a": 2}',
            "rationale": "Set a.",
        },
    }
    fake_upstream.set_default_reply("cheap", patch)
    fake_upstream.set_default_reply("strong", patch)
    async with aiohttp.ClientSession() as session:
        resp = await session.post(
            proxy.base + "/modules/config-patcher/execute",
            json={"input": {"config": '{"a": 1}', "format": "json", "request": "set a to 2"}},
        )
        env = await resp.json()
    assert resp.status == 200 and resp.headers["X-Cognitive-Decision"] == "reject"
    assert env["ok"] is False and env["error"]["code"] == "E2001"
    assert env["meta"]["confidence"] == 0.6, "the reject keeps the answer's own meta"
    assert "confidence 0.6 < min_confidence 0.9" in env["meta"]["explain"]
    assert "partial_data" not in env, "config-patcher sets failure.partial_allowed: false"


async def test_plain_text_input_skips_the_input_schema(
    proxy: RunningProxy, fake_upstream: FakeUpstream
) -> None:
    fake_upstream.script("cheap", envelope(0.9))
    raw = await chat_module(proxy, "code-reviewer", "please review: print('hi')")
    assert raw.headers["x-cognitive-decision"] == "accept"
    assert "please review: print('hi')" in fake_upstream.requests[0].json["messages"][1]["content"]


async def test_module_named_by_header(proxy: RunningProxy, fake_upstream: FakeUpstream) -> None:
    fake_upstream.script("cheap", envelope(0.9))
    raw = await proxy.client().chat.completions.with_raw_response.create(
        model="gpt-4o-mini",
        messages=[{"role": "user", "content": json.dumps(REVIEW_INPUT)}],
        extra_headers={"X-Cognitive-Module": "code-reviewer"},
    )
    assert raw.headers["x-cognitive-tier"] == "decision"


async def test_module_over_chat_streams_the_envelope(
    proxy: RunningProxy, fake_upstream: FakeUpstream
) -> None:
    fake_upstream.script("cheap", envelope(0.9))
    stream = await proxy.client().chat.completions.create(
        model="module:code-reviewer",
        messages=[{"role": "user", "content": json.dumps(REVIEW_INPUT)}],
        stream=True,
    )
    chunks = [c async for c in stream]
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert json.loads(text)["data"]["rationale"] == "Because."  # the content is the envelope
    reasoning = "".join((c.choices[0].delta.model_extra or {}).get("reasoning_content") or "" for c in chunks)
    assert reasoning == "Because."  # the rationale as it was written (spec v2.5 §3.2): the live view
    assert chunks[-1].choices[0].finish_reason == "stop"
    extra = chunks[-1].model_extra
    assert extra is not None and extra["envelope"]["meta"]["confidence"] == 0.9
    assert cognitive_of(chunks[-1])["decision"] == "accept"


async def test_invalid_module_input_is_400_before_any_model_call(
    proxy: RunningProxy, fake_upstream: FakeUpstream
) -> None:
    with pytest.raises(openai.BadRequestError) as info:
        await chat_module(proxy, "code-reviewer", json.dumps({"language": "python"}))
    assert info.value.body["code"] == "E1002"  # type: ignore[index]
    assert fake_upstream.requests == []


async def test_unknown_module_is_404_e4006(proxy: RunningProxy) -> None:
    with pytest.raises(openai.NotFoundError) as info:
        await chat_module(proxy, "no-such-module", "{}")
    assert info.value.body["code"] == "E4006"  # type: ignore[index]
    async with aiohttp.ClientSession() as session:
        for method, path in (
            ("POST", "/modules/nope/execute"),
            ("GET", "/modules/nope"),
            ("GET", "/modules/..%2F..%2Fetc"),
        ):
            resp = await session.request(method, proxy.base + path, json={"input": {}})
            body = await resp.json()
            assert resp.status == 404 and body["ok"] is False and body["error"]["code"] == "E4006", path


@pytest.mark.parametrize(
    ("faults", "status", "code"),
    [([Fault.http(500), DROP], 503, "E4001"), ([Fault.http(429, retry_after=0.05)] * 2, 429, "E4002")],
)
async def test_every_provider_failing_is_e4001_or_e4002_with_retry_after(
    proxy: RunningProxy, fake_upstream: FakeUpstream, faults: list[Fault], status: int, code: str
) -> None:
    fake_upstream.script("cheap", *[faults[0]] * 3)  # first try + 2 retries
    fake_upstream.script("strong", *[faults[1]] * 3)
    async with aiohttp.ClientSession() as session:
        resp = await session.post(proxy.base + "/modules/code-reviewer/execute", json={"input": REVIEW_INPUT})
        env = await resp.json()
    assert resp.status == status and env["error"]["code"] == code
    assert int(resp.headers["Retry-After"]) >= 1
    assert resp.headers["X-Cognitive-Attempts"] == "6"
    assert fake_upstream.count("/v1/chat/completions") == 6


async def test_execute_answers_the_envelope_with_headers(
    proxy: RunningProxy, fake_upstream: FakeUpstream
) -> None:
    fake_upstream.script("cheap", envelope(0.88))
    async with aiohttp.ClientSession() as session:
        resp = await session.post(proxy.base + "/modules/code-reviewer/execute", json={"input": REVIEW_INPUT})
        env = await resp.json()
        missing = await session.post(proxy.base + "/modules/code-reviewer/execute", json={"inp": {}})
        missing_env = await missing.json()
    assert resp.status == 200 and env["ok"] is True
    assert resp.headers["X-Cognitive-Confidence"] == "0.88" and resp.headers["X-Cognitive-Risk"] == "low"
    assert missing.status == 400 and missing_env["error"]["code"] == "E1001"


async def test_structured_output_falls_back_when_refused(
    proxy: RunningProxy, fake_upstream: FakeUpstream
) -> None:
    fake_upstream.script("cheap", Fault.http(400), envelope(0.9))
    raw = await chat_module(proxy, "code-reviewer", json.dumps(REVIEW_INPUT))
    assert raw.headers["x-cognitive-decision"] == "accept"
    formats = [r.json.get("response_format", {}).get("type") for r in fake_upstream.requests]
    assert formats == ["json_schema", "json_object"]


async def test_catalogue_routes(proxy: RunningProxy) -> None:
    models = await proxy.client().models.list()
    ids = [m.id for m in models.data]
    assert "gpt-4o-mini" in ids and "module:code-reviewer" in ids and "module:text-summarizer" in ids
    async with aiohttp.ClientSession() as session:
        listing = await (await session.get(proxy.base + "/modules")).json()
        one = await (await session.get(proxy.base + "/modules/config-patcher")).json()
        caps = await (await session.get(proxy.base + "/capabilities")).json()
    assert {m["id"] for m in listing["data"]} >= {"code-simplifier", "code-reviewer", "idea-explorer"}
    assert one["tier"] == "exec" and one["enums"]["strategy"] == "strict"
    assert caps["spec_versions"][:2] == ["2.5", "2.2"]  # the newest first (proxy.conformance_table)


async def test_an_unknown_module_is_the_callers_mistake_and_other_methods_get_405(tmp_path: Path) -> None:
    policy = yaml.safe_load((ROOT / "policies" / "demo.yaml").read_text())
    async with running_proxy(tmp_path, policy) as px, aiohttp.ClientSession() as session:
        resp = await session.post(px.url + "/v1/modules/nope/execute", json={"input": {}})
        envelope = await resp.json()
        assert resp.status == 404 and envelope["error"]["code"] == "E4006"
        assert "System failure" not in envelope["meta"]["explain"]
        assert envelope["meta"]["explain"].startswith("Caller error")
        for method, path, allow in [
            ("GET", "/v1/modules/code-reviewer/execute", "POST"),
            ("PUT", "/v1/modules/code-reviewer/execute", "POST"),
            ("POST", "/v1/modules", "GET, HEAD"),
            ("DELETE", "/v1/modules/code-reviewer", "GET, HEAD"),
        ]:
            resp = await session.request(method, px.url + path)
            body = await resp.json()
            assert resp.status == 405, (method, path)
            assert resp.headers["Allow"] == allow
            if path.endswith("/execute"):  # a module route: every answer is an envelope
                assert body["ok"] is False and body["error"]["code"] == "E1004", body
            else:
                assert body["error"]["code"] == "method_not_allowed" and body["error"]["type"]


async def test_a_streamed_module_call_asks_for_structured_output_and_falls_back_when_refused(
    proxy: RunningProxy, fake_upstream: FakeUpstream
) -> None:
    """Like the sync call (#29.7): json_schema first, the next form after a 400, before any byte."""
    fake_upstream.script("cheap", Fault.http(400), envelope(0.9))
    stream = await proxy.client().chat.completions.create(
        model="module:code-reviewer",
        messages=[{"role": "user", "content": json.dumps(REVIEW_INPUT)}],
        stream=True,
    )
    text = "".join([c.choices[0].delta.content or "" async for c in stream if c.choices])
    assert json.loads(text)["ok"] is True
    sent = [r.json for r in fake_upstream.requests]
    assert [(r.get("stream"), r.get("response_format", {}).get("type")) for r in sent] == [
        (True, "json_schema"),
        (True, "json_object"),
    ]
