"""Streamed module answers (spec v2.5 §3.2) end to end: SSE, NDJSON, chat, escalation."""

from __future__ import annotations

import json
from typing import Any

import aiohttp

from tests.api.test_modules import REVIEW_INPUT, envelope
from tests.fake_upstream import FakeUpstream
from tests.proxy_server import RunningProxy
from tests.stream.client import read_ndjson, read_sse, rendered, seq, sequenced

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


async def test_ndjson_stream_carries_the_same_chunks(proxy: RunningProxy, fake_upstream: FakeUpstream) -> None:
    fake_upstream.script("cheap", answer(0.92, rationale="Ünïcode räti – onale ✓ fine"))
    session, response = await execute(proxy, {"Accept": "application/x-ndjson"})
    async with session, response:
        assert response.headers["Content-Type"].startswith("application/x-ndjson")
        events = await read_ndjson(response)
    assert events[0][1]["streaming"] is True
    assert events[-1][1]["final"] is True
    assert rendered(events)["data.rationale"] == "Ünïcode räti – onale ✓ fine"
    delta = [c for _, c in events if "chunk" in c][-1]["chunk"]
    assert delta["checkpoint"]["offset"] == len("Ünïcode räti – onale ✓ fine".encode())


async def test_escalation_mid_stream_is_shown_then_reset_then_final(
    proxy: RunningProxy, fake_upstream: FakeUpstream
) -> None:
    fake_upstream.script("cheap", answer(0.3, rationale="A weak first guess at the answer."))
    fake_upstream.script("strong", answer(0.95, rationale="The strong rung's careful answer."))
    session, response = await execute(proxy, SSE)
    async with session, response:
        events = await read_sse(response)
    kinds = [
        "progress" if "progress" in c else c["chunk"]["type"] if "chunk" in c else n for n, c in events
    ]
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
    assert final["data"]["rationale"] == rendered(events)["data.rationale"] == "The strong rung's careful answer."


async def test_exhausted_ladder_ends_with_an_error_chunk(proxy: RunningProxy, fake_upstream: FakeUpstream) -> None:
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
    from tests.fake_upstream import STREAM_BREAK

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
    text, chunks = "", []
    async for chunk in stream:
        chunks.append(chunk)
        if chunk.choices and chunk.choices[0].delta.content:
            text += chunk.choices[0].delta.content
    assert text == RATIONALE
    assert sum(1 for c in chunks if c.choices and c.choices[0].delta.content) > 3
    last = next(c for c in reversed(chunks) if c.choices and c.choices[0].finish_reason == "stop")
    extra = last.model_extra or {}
    assert extra["envelope"]["ok"] is True and extra["envelope"]["data"]["rationale"] == RATIONALE
    assert extra["cognitive"]["decision"] == "accept"
    assert last.system_fingerprint.startswith("cogproxy:decision=accept")
    assert chunks[-1].usage is not None and chunks[-1].usage.total_tokens > 0
