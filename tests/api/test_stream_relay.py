"""Relayed streams are complete or marked (#11 findings 1, 2, 8) and every attempt is bounded as a
whole (finding 5): through the served proxy against the fault-injecting fake upstream."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from tests.fake_upstream import DROP, MALFORMED_FRAME, STREAM_BREAK, FakeUpstream, Fault
from tests.proxy_server import UPSTREAM_KEY, UPSTREAM_KEY_ENV, RunningProxy, running_proxy, upstream_policy

REVIEW_INPUT = {"code": "def f(): pass", "language": "python"}
CHAT = {"model": "duo", "stream": True, "messages": [{"role": "user", "content": "hi"}]}
PER_TRY_S = 0.5
# Longer than every bound of the policy below: a fault that waits this long must be cut.
STALL_S = 5.0
DRIP_S = 0.1


def relay_policy(fake: FakeUpstream, **timeout: float) -> dict[str, Any]:
    """``duo``: two OpenAI-wire targets on the fake; ``anth/claude-x``; the generic passthrough to
    ``up`` then ``up2``; small bounds."""
    policy = upstream_policy(fake)
    policy["providers"]["up2"] = {**policy["providers"]["up"]}
    policy["ladder"].append({"name": "duo", "targets": ["up/m-a", "up2/m-b"]})
    policy["passthrough"] = {
        "routes": [{"prefix": p, "providers": ["up", "up2"]} for p in ("/v1/responses", "/v1/embeddings")]
    }
    policy["failover"] = {
        "retries": 0,
        "timeout": {"per_try_s": PER_TRY_S, "total_s": 4, **timeout},
    }
    return policy


@pytest.fixture
def policy(fake_upstream: FakeUpstream) -> dict[str, Any]:
    """What the ``proxy`` fixture serves here."""
    return relay_policy(fake_upstream)


async def post(px: RunningProxy, path: str, body: dict[str, Any], **headers: str) -> tuple[int, bytes]:
    async with aiohttp.ClientSession() as session:
        resp = await session.post(px.base + path, json=body, headers=headers)
        return resp.status, await resp.read()


async def incomplete(px: RunningProxy) -> dict[tuple[str, str, str], float]:
    """``cognitive_stream_incomplete_total`` by (provider, model, reason)."""
    async with aiohttp.ClientSession() as session:
        text = await (await session.get(px.url + "/metrics")).text()
    found = re.findall(
        r'cognitive_stream_incomplete_total\{model="([^"]*)",provider="([^"]*)",reason="([^"]*)"\} (\S+)',
        text,
    )
    return {(p, m, r): float(v) for m, p, r, v in found}


def error_events(body: bytes) -> list[bytes]:
    return [e for e in body.split(b"\n\n") if e.startswith((b'data: {"error"', b"event: error"))]


async def test_a_stream_truncated_after_two_chunks_ends_with_an_error_event_and_is_counted(
    proxy: RunningProxy, fake_upstream: FakeUpstream
) -> None:
    fake_upstream.script("m-a", Fault.truncate(2))
    status, body = await post(proxy, "/chat/completions", CHAT)
    assert status == 200
    assert b"data: [DONE]" not in body
    assert body.count(b'"chat.completion.chunk"') == 2  # what the upstream sent, as it sent it
    assert len(error_events(body)) == 1 and body.endswith(b"\n\n")
    assert b'"code":"upstream_stream_error"' in error_events(body)[0]
    assert await incomplete(proxy) == {("up", "m-a", "truncated"): 1.0}
    assert fake_upstream.count("/v1/chat/completions") == 1  # bytes were sent: never retried


async def test_a_complete_stream_is_not_counted(proxy: RunningProxy, fake_upstream: FakeUpstream) -> None:
    status, body = await post(proxy, "/chat/completions", CHAT)
    assert status == 200 and body.endswith(b"data: [DONE]\n\n") and not error_events(body)
    assert await incomplete(proxy) == {}


@pytest.mark.parametrize(
    "fault",
    [Fault.truncate(0), DROP, Fault.stall(0, STALL_S), Fault.malformed_chunk(0)],
    ids=["truncated", "dropped", "stalled", "malformed"],
)
async def test_a_stream_failing_before_its_first_chunk_fails_over(
    proxy: RunningProxy, fake_upstream: FakeUpstream, fault: Fault
) -> None:
    fake_upstream.script("m-a", fault)
    status, body = await post(proxy, "/chat/completions", CHAT)
    assert status == 200
    assert body.endswith(b"data: [DONE]\n\n") and not error_events(body)
    assert MALFORMED_FRAME not in body
    assert fake_upstream.count("/v1/chat/completions", model="m-b") == 1
    assert await incomplete(proxy) == {}


async def test_a_stream_that_fails_everywhere_before_its_first_chunk_is_an_error_status(
    proxy: RunningProxy, fake_upstream: FakeUpstream
) -> None:
    fake_upstream.script("m-a", Fault.truncate(0))
    fake_upstream.script("m-b", Fault.truncate(0))
    status, body = await post(proxy, "/chat/completions", CHAT)
    assert status == 502
    assert b"ended before its first event" in body


async def test_a_stall_after_the_first_chunk_ends_the_stream_with_an_error_event(
    proxy: RunningProxy, fake_upstream: FakeUpstream
) -> None:
    fake_upstream.script("m-a", Fault.stall(2, STALL_S))
    status, body = await post(proxy, "/chat/completions", CHAT)
    assert status == 200 and len(error_events(body)) == 1
    assert await incomplete(proxy) == {("up", "m-a", "stalled"): 1.0}


async def test_a_connection_dropped_after_the_first_chunk_ends_the_stream_with_an_error_event(
    proxy: RunningProxy, fake_upstream: FakeUpstream
) -> None:
    """The upstream's body is read with aiohttp's own reads: a broken connection is still a
    ``dropped`` stream, not an error out of the handler."""
    fake_upstream.script("m-a", STREAM_BREAK)
    status, body = await post(proxy, "/chat/completions", CHAT)
    assert status == 200 and len(error_events(body)) == 1
    assert await incomplete(proxy) == {("up", "m-a", "dropped"): 1.0}


async def test_a_malformed_chunk_is_forwarded_as_is_and_counted(
    proxy: RunningProxy, fake_upstream: FakeUpstream
) -> None:
    fake_upstream.script("m-a", Fault.malformed_chunk(2))
    status, body = await post(proxy, "/chat/completions", CHAT)
    assert status == 200
    assert MALFORMED_FRAME in body and body.endswith(b"data: [DONE]\n\n") and not error_events(body)
    assert await incomplete(proxy) == {("up", "m-a", "malformed_chunk"): 1.0}


async def test_a_truncated_anthropic_stream_is_not_passed_off_as_complete(
    proxy: RunningProxy, fake_upstream: FakeUpstream
) -> None:
    fake_upstream.script("claude-x", Fault.truncate(3))
    status, body = await post(proxy, "/chat/completions", {**CHAT, "model": "claude"})
    assert status == 200
    assert b"data: [DONE]" not in body and len(error_events(body)) == 1
    assert await incomplete(proxy) == {("anth", "claude-x", "truncated"): 1.0}


async def test_a_complete_anthropic_stream_ends_with_done(
    proxy: RunningProxy, fake_upstream: FakeUpstream
) -> None:
    status, body = await post(proxy, "/chat/completions", {**CHAT, "model": "claude"})
    assert status == 200 and body.endswith(b"data: [DONE]\n\n") and not error_events(body)


RESPONSES = {"model": "gpt-4o", "input": "hi", "stream": True}


async def test_a_truncated_responses_stream_ends_with_an_error_event(
    proxy: RunningProxy, fake_upstream: FakeUpstream
) -> None:
    fake_upstream.script("gpt-4o", Fault.truncate(4))
    status, body = await post(proxy, "/responses", RESPONSES)
    assert status == 200
    assert b"response.completed" not in body
    assert len(error_events(body)) == 1 and error_events(body)[0].startswith(b"event: error\n")
    assert await incomplete(proxy) == {("up", "other", "truncated"): 1.0}


async def test_a_complete_responses_stream_is_not_marked(
    proxy: RunningProxy, fake_upstream: FakeUpstream
) -> None:
    status, body = await post(proxy, "/responses", RESPONSES)
    assert status == 200 and b"event: response.completed" in body and not error_events(body)
    assert await incomplete(proxy) == {}


async def test_a_responses_stream_cut_before_its_first_event_fails_over(
    proxy: RunningProxy, fake_upstream: FakeUpstream
) -> None:
    fake_upstream.script("gpt-4o", Fault.truncate(0))
    status, body = await post(proxy, "/responses", RESPONSES)
    assert status == 200 and b"event: response.completed" in body and not error_events(body)
    assert fake_upstream.count("/v1/responses") == 2


async def test_a_responses_stream_cut_everywhere_before_its_first_event_is_an_error_status(
    proxy: RunningProxy, fake_upstream: FakeUpstream
) -> None:
    fake_upstream.script("gpt-4o", Fault.truncate(0), Fault.truncate(0))
    status, body = await post(proxy, "/responses", RESPONSES)
    assert status == 502 and b"ended before its first event" in body


# -- deadlines (finding 5) -------------------------------------------------------------------------


async def test_a_dripping_chat_answer_is_cut_at_per_try_and_fails_over(
    proxy: RunningProxy, fake_upstream: FakeUpstream
) -> None:
    fake_upstream.script("m-a", Fault.drip(DRIP_S))
    status, body = await post(proxy, "/chat/completions", {**CHAT, "stream": False})
    assert status == 200 and b'"chat.completion"' in body
    assert fake_upstream.count("/v1/chat/completions", model="m-b") == 1


async def test_a_dripping_answer_everywhere_is_a_timeout(
    proxy: RunningProxy, fake_upstream: FakeUpstream
) -> None:
    fake_upstream.script("m-a", Fault.drip(DRIP_S))
    fake_upstream.script("m-b", Fault.drip(DRIP_S))
    status, body = await post(proxy, "/chat/completions", {**CHAT, "stream": False})
    assert status == 504, body


async def test_a_passthrough_answer_dripping_past_per_try_is_cut_never_passed_off_as_whole(
    proxy: RunningProxy, fake_upstream: FakeUpstream
) -> None:
    """Its first byte came in time, so the client has the headers: the rest is bounded by the
    attempt and, past it, the connection is closed (a short body the client sees as broken)."""
    fake_upstream.script("text-embedding-3-small", Fault.drip(DRIP_S))
    async with aiohttp.ClientSession() as session:
        resp = await session.post(
            proxy.base + "/embeddings", json={"model": "text-embedding-3-small", "input": "x"}
        )
        with pytest.raises(aiohttp.ClientPayloadError):
            await resp.read()
    assert await incomplete(proxy) == {("up", "other", "too_long"): 1.0}


async def test_a_dripping_module_answer_is_cut_at_per_try(
    proxy: RunningProxy, fake_upstream: FakeUpstream
) -> None:
    for model in ("cheap", "strong", "m-a", "m-b"):
        fake_upstream.script(model, Fault.drip(DRIP_S))
    async with aiohttp.ClientSession() as session:
        resp = await session.post(proxy.base + "/modules/code-reviewer/execute", json={"input": REVIEW_INPUT})
        envelope = await resp.json()
    assert resp.status == 503 and envelope["error"]["code"] == "E4001", envelope  # every provider failed
    assert "within 0.5s" in envelope["error"]["message"]


async def test_stream_total_s_ends_a_long_stream_with_an_error_event(
    fake_upstream: FakeUpstream, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(UPSTREAM_KEY_ENV, UPSTREAM_KEY)
    policy = relay_policy(fake_upstream, stream_idle_s=2 * STALL_S, stream_total_s=1.0)
    fake_upstream.script("m-a", Fault.stall(2, STALL_S))
    async with running_proxy(tmp_path, policy) as running:
        status, body = await post(running, "/chat/completions", CHAT)
        assert status == 200 and len(error_events(body)) == 1
        assert await incomplete(running) == {("up", "m-a", "too_long"): 1.0}
