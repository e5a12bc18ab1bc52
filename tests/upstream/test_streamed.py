"""``stream_completion``: a module stream's provider answer seen piece by piece (#35, time to first
delta): the first delta reaches whoever waits for it before the rest of the same read is parsed,
down to a session's follower (``Session.read``)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from proxy.policy.model import ProviderConfig
from proxy.service.stream_emitter import ChunkEmitter
from proxy.state.stream_mirror import Event
from proxy.state.stream_sessions import SessionHub
from proxy.stream.fields import RATIONALE
from proxy.upstream.base import CallInfo
from proxy.upstream.openai import OpenAIProvider
from proxy.upstream.streamed import stream_completion

KEY_ENV = "TEST_STREAMED_KEY"
PIECES = ["The", " answer", " is", " here", "."]
ENVELOPE_PIECES = ['{"ok": true, "data": {"rationale": "The', " answer", " is", ' here."}', ', "meta": {}}']


def frame(obj: dict[str, object]) -> bytes:
    return b"data: " + json.dumps(obj).encode() + b"\n\n"


def whole_answer(pieces: list[str]) -> bytes:
    """Every frame of a streamed answer in one buffer (one write, so one read for the proxy)."""
    chunks = [
        frame({"choices": [{"index": 0, "delta": {"content": piece}, "finish_reason": None}]})
        for piece in pieces
    ]
    chunks.append(frame({"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}))
    return b"".join(chunks) + b"data: [DONE]\n\n"


@pytest.fixture
async def upstream() -> AsyncIterator[TestServer]:
    async def chat(request: web.Request) -> web.StreamResponse:
        body = await request.json()
        pieces = ENVELOPE_PIECES if body["messages"][0]["content"] == "envelope" else PIECES
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        await resp.write(whole_answer(pieces))
        await resp.write_eof()
        return resp

    app = web.Application()
    app.router.add_post("/v1/chat/completions", chat)
    server = TestServer(app, host="127.0.0.1", port=0)
    await server.start_server()
    try:
        yield server
    finally:
        await server.close()


@pytest.mark.parametrize("first_delta", [0, 2])
async def test_the_first_delta_is_seen_before_the_rest_of_its_read_is_parsed(
    upstream: TestServer, monkeypatch: pytest.MonkeyPatch, first_delta: int
) -> None:
    """A follower waiting for the first piece that became a delta (``on_text`` True: the pieces
    before it were the envelope's head) runs while the pieces after it, which came in the same
    read, are still unparsed: the first delta is written before the rest of the read is worked
    through."""
    monkeypatch.setenv(KEY_ENV, "sk-upstream")
    pieces: list[str] = []
    first = asyncio.Event()
    seen_when_woken: list[int] = []

    def on_text(piece: str) -> bool:
        pieces.append(piece)
        if len(pieces) <= first_delta:
            return False
        first.set()
        return True

    async def follower() -> None:
        await first.wait()
        seen_when_woken.append(len(pieces))

    waiting = asyncio.create_task(follower())
    base = str(upstream.make_url("/v1"))
    async with aiohttp.ClientSession() as session:
        provider = OpenAIProvider(ProviderConfig("up", "openai", base, KEY_ENV), session)
        body = {"messages": [{"role": "user", "content": "hi"}]}
        reply = await stream_completion(provider, body, "m", CallInfo(), 10.0, on_text)
    await waiting
    assert seen_when_woken == [first_delta + 1]
    assert pieces == PIECES
    assert reply["choices"][0]["message"]["content"] == "".join(PIECES)


async def test_a_sessions_follower_gets_the_first_delta_before_the_rest_of_its_read_is_parsed(
    upstream: TestServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The path of a streamed module call: the provider's pieces into a ``ChunkEmitter``, its delta
    chunks into a session, a follower reading the session (as ``follow`` does). The follower's
    read returns the first delta while the pieces after it, from the same read, are unparsed."""
    monkeypatch.setenv(KEY_ENV, "sk-upstream")
    session = SessionHub(ttl_s=60, max_bytes=1 << 20).create("anonymous", "m")
    emitter = ChunkEmitter(session, (RATIONALE,))
    parsed: list[str] = []

    def on_text(piece: str) -> bool:
        parsed.append(piece)
        return emitter.text(piece)

    async def follower() -> tuple[int, list[Event]]:
        events, _ = await session.read(0, 10.0)
        return len(parsed), events

    following = asyncio.create_task(follower())
    base = str(upstream.make_url("/v1"))
    async with aiohttp.ClientSession() as http:
        provider = OpenAIProvider(ProviderConfig("up", "openai", base, KEY_ENV), http)
        body = {"messages": [{"role": "user", "content": "envelope"}]}
        await stream_completion(provider, body, "m", CallInfo(), 10.0, on_text)
    seen, events = await following
    assert seen == 1
    assert [json.loads(payload)["chunk"]["delta"] for _, payload in events] == ["The"]
