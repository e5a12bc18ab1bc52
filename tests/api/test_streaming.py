"""Streamed module answers (spec v2.5 §3.2) end to end: SSE, NDJSON, chat, escalation."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import aiohttp
import openai
import pytest
import yaml

from proxy.conformance_table import CLAIMED_LEVEL, SPEC_VERSIONS
from proxy.contract.validate import validate_envelope
from tests.api.test_modules import REVIEW_INPUT, envelope
from tests.conftest import ROOT
from tests.fake_upstream import STREAM_BREAK, FakeUpstream, Fault
from tests.proxy_server import (
    UPSTREAM_KEY,
    UPSTREAM_KEY_ENV,
    RunningProxy,
    cognitive_of,
    running_proxy,
    upstream_policy,
)
from tests.stream.client import read_ndjson, read_sse, rendered, seq, sequenced
from tests.test_bundled_modules import BUNDLED

RATIONALE = "The function returns its argument unchanged, so nothing needs simplifying here."
SSE = {"Accept": "text/event-stream"}


def answer(confidence: float, rationale: str = RATIONALE, **data: Any) -> str:
    return envelope(confidence, rationale=rationale, **data)


async def execute(proxy: RunningProxy, headers: dict[str, str], body: dict[str, Any] | None = None) -> Any:
    session = aiohttp.ClientSession()
    response = await session.post(
        f"{proxy.base}/modules/code-reviewer/execute", json=body or {"input": REVIEW_INPUT}, headers=headers
    )
    return session, response


async def test_sse_stream_sends_meta_deltas_and_the_decided_final(
    proxy: RunningProxy, fake_upstream: FakeUpstream
) -> None:
    fake_upstream.script("cheap", answer(0.92))
    session, response = await execute(proxy, SSE)
    async with session, response:
        assert response.status == 200
        assert response.headers["Content-Type"].startswith("text/event-stream")
        events = await read_sse(response)
    names = [name for name, _ in events]
    assert names[0] == "meta" and names[-1] == "final"
    meta = events[0][1]
    assert meta["streaming"] is True and meta["session_id"] == response.headers["X-Cognitive-Session-Id"]
    deltas = [c["chunk"] for _, c in events if c.get("chunk", {}).get("type") == "delta"]
    assert len([d for d in deltas if d["field"] == "data.rationale"]) > 3  # it arrived in pieces
    assert [seq(c) for c in sequenced(events)] == list(range(1, len(sequenced(events)) + 1))
    final = events[-1][1]
    assert final["data"]["rationale"] == RATIONALE == rendered(events)["data.rationale"]
    assert final["meta"]["confidence"] == 0.92 and final["cognitive"]["decision"] == "accept"
    last = [d for d in deltas if d["field"] == "data.rationale"][-1]
    assert last["checkpoint"]["offset"] == len(RATIONALE.encode())
    # the provider was asked for a stream
    assert fake_upstream.requests[-1].json["stream"] is True


async def test_ndjson_stream_carries_the_same_chunks(
    proxy: RunningProxy, fake_upstream: FakeUpstream
) -> None:
    fake_upstream.script("cheap", answer(0.92, rationale="Ünïcode räti - onale ✓ fine"))
    session, response = await execute(proxy, {"Accept": "application/x-ndjson"})
    async with session, response:
        assert response.headers["Content-Type"].startswith("application/x-ndjson")
        events = await read_ndjson(response)
    assert events[0][1]["streaming"] is True
    assert events[-1][1]["final"] is True
    assert rendered(events)["data.rationale"] == "Ünïcode räti - onale ✓ fine"
    delta = [c for _, c in events if "chunk" in c][-1]["chunk"]
    assert delta["checkpoint"]["offset"] == len("Ünïcode räti - onale ✓ fine".encode())


async def test_escalation_mid_stream_is_shown_then_reset_then_final(
    proxy: RunningProxy, fake_upstream: FakeUpstream
) -> None:
    fake_upstream.script("cheap", answer(0.3, rationale="A weak first guess at the answer."))
    fake_upstream.script("strong", answer(0.95, rationale="The strong rung's careful answer."))
    session, response = await execute(proxy, SSE)
    async with session, response:
        events = await read_sse(response)
    kinds = ["progress" if "progress" in c else c["chunk"]["type"] if "chunk" in c else n for n, c in events]
    first_progress = kinds.index("progress")
    assert "delta" in kinds[:first_progress]  # the weak answer was streamed live
    progress = events[first_progress][1]["progress"]
    assert progress["stage"] == "escalating"
    assert (progress["from_rung"], progress["to_rung"]) == ("fast", "strong")
    assert "confidence 0.3 < min_confidence 0.7" in progress["reason"]
    assert kinds[first_progress + 1] == "snapshot" and events[first_progress + 1][1]["chunk"]["data"] == {}
    assert "delta" in kinds[first_progress + 2 :]
    final = events[-1][1]
    assert final["final"] is True and final["cognitive"]["decision"] == "escalated"
    assert (
        final["data"]["rationale"]
        == rendered(events)["data.rationale"]
        == "The strong rung's careful answer."
    )


async def test_exhausted_ladder_ends_with_an_error_chunk(
    proxy: RunningProxy, fake_upstream: FakeUpstream
) -> None:
    fake_upstream.script("cheap", "not json at all")
    fake_upstream.script("strong", "still not json")
    session, response = await execute(proxy, SSE)
    async with session, response:
        assert response.status == 200  # the stream opened before the outcome was known
        events = await read_sse(response)
    name, last = events[-1]
    assert name == "error" and last["ok"] is False
    assert last["session_id"] == events[0][1]["session_id"]
    assert last["cognitive"]["decision"] in ("review", "reject")


async def test_provider_stream_break_fails_over_with_a_reset(
    proxy: RunningProxy, fake_upstream: FakeUpstream
) -> None:
    fake_upstream.set_default_reply("cheap", answer(0.92))
    fake_upstream.script("cheap", STREAM_BREAK)
    session, response = await execute(proxy, SSE)
    async with session, response:
        events = await read_sse(response)
    assert events[-1][1]["final"] is True
    assert rendered(events)["data.rationale"] == RATIONALE


async def test_openai_sdk_streams_module_deltas_over_chat(
    proxy: RunningProxy, fake_upstream: FakeUpstream
) -> None:
    fake_upstream.script("cheap", answer(0.92))
    stream = await proxy.client().chat.completions.create(
        model="module:code-reviewer",
        messages=[{"role": "user", "content": json.dumps(REVIEW_INPUT)}],
        stream=True,
        stream_options={"include_usage": True},
    )
    text, pieces, chunks = "", [], []
    async for chunk in stream:
        chunks.append(chunk)
        if chunk.choices:
            text += chunk.choices[0].delta.content or ""
            pieces.append((chunk.choices[0].delta.model_extra or {}).get("reasoning_content") or "")
    assert "".join(pieces) == RATIONALE and sum(map(bool, pieces)) > 3  # the live view, in pieces
    assert json.loads(text)["data"]["rationale"] == RATIONALE  # the content is the envelope
    last = next(c for c in reversed(chunks) if c.choices and c.choices[0].finish_reason == "stop")
    extra = last.model_extra or {}
    assert extra["envelope"]["ok"] is True and extra["envelope"]["data"]["rationale"] == RATIONALE
    assert extra["cognitive"]["decision"] == "accept"
    assert (last.system_fingerprint or "").startswith("cogproxy:decision=accept")
    assert chunks[-1].usage is not None and chunks[-1].usage.total_tokens > 0


def _modules_with_modes(root: Path) -> Path:
    """Copies of code-reviewer declaring ``response.mode`` sync, streaming and both."""
    for mode in ("sync", "streaming", "both"):
        target = root / "modules" / f"reviewer-{mode}"
        shutil.copytree(ROOT / "modules" / "code-reviewer", target)
        manifest = yaml.safe_load((target / "module.yaml").read_text())
        manifest.update(name=f"reviewer-{mode}", response={"mode": mode})
        (target / "module.yaml").write_text(yaml.safe_dump(manifest))
    return root / "modules"


@pytest.fixture
async def moded(fake_upstream: FakeUpstream, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    monkeypatch.setenv(UPSTREAM_KEY_ENV, UPSTREAM_KEY)
    fake_upstream.set_default_reply("cheap", answer(0.92))
    modules = _modules_with_modes(tmp_path)
    async with running_proxy(tmp_path, upstream_policy(fake_upstream), modules=(modules,)) as proxy:
        yield proxy


async def _call(proxy: RunningProxy, module: str, headers: dict[str, str], query: str = "") -> Any:
    async with aiohttp.ClientSession() as session:
        url = f"{proxy.base}/modules/{module}/execute{query}"
        async with session.post(url, json={"input": REVIEW_INPUT}, headers=headers) as response:
            if response.headers["Content-Type"].startswith("application/json"):
                return response.status, dict(response.headers), await response.json()
            return response.status, dict(response.headers), await read_sse(response)


async def test_streaming_asked_of_a_sync_module_falls_back_with_w4010(moded: RunningProxy) -> None:
    status, headers, body = await _call(moded, "reviewer-sync", SSE)
    assert status == 200 and body["ok"] is True
    assert headers["X-Cognitive-Warning"] == "STREAMING_UNAVAILABLE; fallback=sync; reason=module_sync_only"
    assert body["_warnings"] == [
        {
            "code": "W4010",
            "message": "Streaming requested but not available (module_sync_only), returned sync response",
            "fallback_used": "sync",
        }
    ]
    assert validate_envelope({k: v for k, v in body.items() if k != "_warnings"}) == []


async def test_sync_asked_of_a_streaming_module_is_e4010(moded: RunningProxy) -> None:
    status, _, body = await _call(moded, "reviewer-streaming", {"X-Cognitive-Response-Mode": "sync"})
    assert status == 406 and body["error"]["code"] == "E4010"
    assert body["meta"]["explain"].startswith("Caller's choice")  # §5.2: whose choice it was
    assert "response.mode: streaming" in body["error"]["message"]


async def test_a_declared_streaming_module_streams_unasked(moded: RunningProxy) -> None:
    status, headers, events = await _call(moded, "reviewer-streaming", {})
    assert status == 200 and events[-1][1]["final"] is True and "X-Cognitive-Warning" not in headers


@pytest.mark.parametrize(
    ("headers", "query", "streams"),
    [
        ({}, "", False),
        ({"X-Cognitive-Response-Mode": "streaming"}, "", True),
        ({"Accept": "text/event-stream"}, "?response_mode=sync", False),
        (
            {"X-Cognitive-Response-Mode": "streaming", "Accept": "application/json"},
            "?response_mode=sync",
            True,
        ),
        ({}, "?response_mode=streaming", True),
    ],
)
async def test_both_module_follows_the_client(
    moded: RunningProxy, headers: dict[str, str], query: str, streams: bool
) -> None:
    status, got, body = await _call(moded, "reviewer-both", headers, query)
    assert status == 200 and "X-Cognitive-Warning" not in got
    assert isinstance(body, list) is streams


async def test_a_malformed_response_mode_is_a_400(moded: RunningProxy) -> None:
    status, _, body = await _call(moded, "reviewer-both", {"X-Cognitive-Response-Mode": "yes"})
    assert status == 400 and body["error"]["code"] == "E1001"


async def test_responses_api_streams_deltas_and_shows_an_escalation(
    proxy: RunningProxy, fake_upstream: FakeUpstream
) -> None:
    fake_upstream.script("cheap", answer(0.3, rationale="A weak first guess."))
    fake_upstream.script("strong", answer(0.95, rationale="The careful answer."))
    stream = await proxy.client().responses.create(
        model="module:code-reviewer", input=json.dumps(REVIEW_INPUT), stream=True
    )
    parts: list[str] = []
    resets, completed = 0, None
    async for event in stream:
        chunk = (event.model_extra or {}).get("cognitive_chunk") or {}
        resets += chunk.get("chunk", {}).get("type") == "snapshot"
        if event.type == "response.reasoning_summary_part.added":
            parts.append("")
        if event.type == "response.reasoning_summary_text.delta":
            parts[event.summary_index] += event.delta
        if event.type == "response.completed":
            completed = event.response
    assert resets == 1 and parts[-1] == "The careful answer."  # each rung's live view: a part
    assert parts[0].startswith("A weak first guess.") and "escalating to strong" in parts[0]
    assert completed is not None
    assert json.loads(completed.output_text)["data"]["rationale"] == "The careful answer."
    assert cognitive_of(completed)["decision"] == "escalated"


async def test_chat_stream_of_a_contract_failure_ends_with_the_failure_envelope(
    proxy: RunningProxy, fake_upstream: FakeUpstream
) -> None:
    """E1000 is a 200 ``ok: false`` answer over sync: over a stream it is the content too."""
    fake_upstream.script(
        "cheap",
        '{"ok": true, "meta": {"confidence": 0.9, "risk": "low", "explain": "x"}, '
        '"data": {"rationale": "half',
    )
    fake_upstream.script("strong", "not json")
    stream = await proxy.client().chat.completions.create(
        model="module:code-reviewer",
        messages=[{"role": "user", "content": json.dumps(REVIEW_INPUT)}],
        stream=True,
    )
    seen = [chunk async for chunk in stream]
    content = "".join(c.choices[0].delta.content or "" for c in seen if c.choices)
    assert json.loads(content)["error"]["code"] == "E1000"
    reasoning = "".join((c.choices[0].delta.model_extra or {}).get("reasoning_content") or "" for c in seen)
    assert reasoning.startswith("half")
    assert any((c.model_extra or {}).get("cognitive_chunk", {}).get("progress") for c in seen)


async def test_chat_stream_of_an_answer_sync_refuses_raises_in_the_sdk(
    proxy: RunningProxy, fake_upstream: FakeUpstream
) -> None:
    """Every provider down is a 503 over sync: over a stream, an ``error`` frame the SDK raises."""
    fake_upstream.set_default_reply("cheap", Fault.http(500))
    fake_upstream.set_default_reply("strong", Fault.http(500))
    stream = await proxy.client().chat.completions.create(
        model="module:code-reviewer",
        messages=[{"role": "user", "content": json.dumps(REVIEW_INPUT)}],
        stream=True,
    )
    seen: list[Any] = []
    with pytest.raises(openai.APIError) as info:
        async for chunk in stream:
            seen.append(chunk)
    body = info.value.body
    assert isinstance(body, dict) and (body["code"], body["type"]) == ("E4001", "cognitive_module_error")
    assert "".join(c.choices[0].delta.content or "" for c in seen if c.choices) == ""


async def test_capabilities_declare_streaming_in_the_spec_shape(proxy: RunningProxy) -> None:
    async with aiohttp.ClientSession() as session:
        caps = await (await session.get(proxy.base + "/capabilities")).json()
    assert caps["runtime"] == "cognitive-proxy" and caps["response_modes"] == ["sync", "streaming"]
    assert caps["capabilities"] == {
        "streaming": True,
        # the fake's openai provider takes images, audio and PDFs (no policy `modalities:`)
        "multimodal": {"input": ["audio", "document", "image"], "output": []},
        "max_media_size_mb": 50,
        "supported_transports": ["sse", "ndjson"],
        "stream_recovery": True,
        "stream_session_ttl_s": 300.0,
    }
    assert caps["chat_completions"]["module_stream"] == "envelope"  # content: the envelope
    assert caps["max_body_bytes"] > 0 and caps["modules"] == len(BUNDLED)  # today's fields stay
    assert caps["v2_5_features"] == ["streaming", "multimodal"]
    # from the conformance table (tests/test_conformance_table.py), never a literal
    assert caps["conformance_level"] == CLAIMED_LEVEL and caps["spec_versions"] == list(SPEC_VERSIONS)
    assert caps["spec_versions"][0] == "2.5"


def _readme_client() -> Any:
    text = (ROOT / "docs" / "streaming.md").read_text(encoding="utf-8")
    code = text.split("<!-- stream-client -->", 1)[1].split("```python\n", 1)[1].split("```", 1)[0]
    assert len(code.splitlines()) <= 30
    namespace: dict[str, Any] = {}
    exec(compile(code, "docs/streaming.md", "exec"), namespace)
    return namespace["stream_module"]


async def test_the_readme_client_renders_an_escalated_stream(
    proxy: RunningProxy, fake_upstream: FakeUpstream, capsys: pytest.CaptureFixture[str]
) -> None:
    stream_module = _readme_client()
    fake_upstream.script("cheap", answer(0.3, rationale="A weak guess."))
    fake_upstream.script("strong", answer(0.95, rationale="The careful answer."))
    url = f"{proxy.base}/modules/code-reviewer/execute"
    decided = await stream_module(url, {"input": REVIEW_INPUT})
    printed = capsys.readouterr().out
    assert decided["final"] is True and decided["data"]["rationale"] == "The careful answer."
    order = [printed.index(s) for s in ("A weak guess.", "escalating to strong", "--- restarting")]
    assert order == sorted(order)
    assert printed.rstrip().endswith("The careful answer.")


async def test_a_reask_mid_stream_is_shown_then_reset(
    fake_upstream: FakeUpstream, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(UPSTREAM_KEY_ENV, UPSTREAM_KEY)
    policy = upstream_policy(fake_upstream)
    policy["tiers"]["decision"]["reask"] = 1
    fake_upstream.script("cheap", '{"ok": true, "data": {"rationale": "broken', answer(0.92))
    async with running_proxy(tmp_path, policy) as proxy:
        session, response = await execute(proxy, SSE)
        async with session, response:
            events = await read_sse(response)
    progress = next(c["progress"] for _, c in events if "progress" in c)
    assert progress["stage"] == "reasking" and progress["from_rung"] == progress["to_rung"] == "fast"
    assert events[-1][1]["final"] is True and rendered(events)["data.rationale"] == RATIONALE
    assert events[-1][1]["cognitive"]["attempts"][0]["outcome"] == "reask"
