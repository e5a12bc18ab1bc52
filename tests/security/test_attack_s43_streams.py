"""Attack on the #35 stream-path changes (relay.copy in a task of its own, reads via ``Body``,
``StreamCheck``'s batch pass, module-stream readers): through the served proxy, from outside."""

from __future__ import annotations

import asyncio
import contextlib
import re
import socket
import struct
from collections.abc import AsyncIterator, Awaitable, Callable

import aiohttp
import orjson
import pytest
from aiohttp import web

from proxy.state.stream_sessions import SessionHub
from proxy.upstream.body import Body
from proxy.upstream.relay import copy
from proxy.upstream.sse import BATCH_BYTES, StreamCheck
from tests.conftest import ProxyWith
from tests.fake_upstream import FakeUpstream
from tests.proxy_server import RunningProxy, upstream_policy
from tests.support.app_upstream import app_upstream
from tests.support.polling import until

CHAT = {"model": "gpt-4o-mini", "stream": True, "messages": [{"role": "user", "content": "x"}]}


@contextlib.asynccontextmanager
async def hostile_upstream(
    handler: Callable[[web.Request], Awaitable[web.StreamResponse]], *, handler_cancellation: bool = False
) -> AsyncIterator[FakeUpstream]:
    """An upstream that answers chat with ``handler`` (bytes no ``FakeUpstream`` script sends), on a
    free loopback port, named as a ``FakeUpstream`` for ``upstream_policy``."""
    app = web.Application()
    app.router.add_post("/v1/chat/completions", handler)
    async with app_upstream(app, handler_cancellation=handler_cancellation) as fake:
        yield fake


async def incomplete(px: RunningProxy) -> dict[str, float]:
    """``cognitive_stream_incomplete_total`` by reason."""
    async with aiohttp.ClientSession() as session:
        text = await (await session.get(px.url + "/metrics")).text()
    found = re.findall(r'cognitive_stream_incomplete_total\{[^}]*reason="([^"]*)"\} (\S+)', text)
    return {reason: float(value) for reason, value in found}


async def test_a_client_that_hangs_up_mid_stream_is_not_counted_as_an_upstream_drop(
    proxy_with: ProxyWith,
) -> None:
    """A write to a client that went away raises aiohttp's ``ClientConnectionResetError``, an
    ``aiohttp.ClientError`` like an upstream read's failures: the copy must not take it for the
    upstream dropping the stream (``stream_incomplete{reason="dropped"}``, a log line blaming the
    provider, an error event written to a closed transport)."""
    async with (
        FakeUpstream.start(chunk_delay=0.2) as fake,
        proxy_with(upstream_policy(fake)) as px,
    ):
        fake.script("cheap", " ".join(["word"] * 40))
        async with aiohttp.ClientSession() as session:
            resp = await session.post(px.base + "/chat/completions", json=CHAT)
            await resp.content.readline()
            resp.close()  # hang up mid-stream
        await until(lambda: fake.cancelled, "the upstream call cancelled", step=0.05)
        assert fake.in_flight == 0
        assert await incomplete(px) == {}


async def test_a_write_to_a_client_gone_raises_through_the_copy_not_an_upstream_drop() -> None:
    """``StreamResponse.write`` to a client that went away raises aiohttp's
    ``ClientConnectionResetError`` (when the transport is closing before the handler's cancel
    arrives: a reset met while the upstream's bytes were already buffered). It is an
    ``aiohttp.ClientError`` like a broken upstream read, and ``copy`` must raise it through as its
    contract says, not take it for the upstream dropping the stream (``stream_incomplete{reason=
    "dropped"}``, a log line blaming the provider, an error event written to a closed transport).
    At 47e5112 it raised through."""
    written: list[bytes] = []

    async def frames() -> AsyncIterator[bytes]:
        for _ in range(3):
            yield b'data: {"choices": [{"index": 0, "delta": {"content": "hi"}}]}\n\n'
        yield b"data: [DONE]\n\n"

    async def client_gone_after_the_head(data: bytes) -> None:
        if written:
            raise aiohttp.ClientConnectionResetError("Cannot write to closing transport")
        written.append(data)

    with pytest.raises(aiohttp.ClientConnectionResetError):
        await copy(
            b"head",
            Body.of_chunks(frames()),
            client_gone_after_the_head,
            StreamCheck("chat"),
            idle_s=5.0,
            until=None,
        )


async def test_a_client_that_resets_mid_burst_is_not_counted_as_an_upstream_drop(
    proxy_with: ProxyWith,
) -> None:
    """Resets (RST) while the upstream's bytes come as fast as they can: whichever comes first, the
    handler's cancel or a write to the closing transport, nothing is counted as the upstream's."""
    event = b'data: {"choices":[{"index":0,"delta":{"content":"' + b"w" * 900 + b'"}}]}\n\n'

    async def burst(request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        try:
            while True:
                await resp.write(event)
        except (ConnectionError, aiohttp.ClientError):
            return resp

    body = b'{"model":"gpt-4o-mini","stream":true,"messages":[{"role":"user","content":"x"}]}'
    async with hostile_upstream(burst) as fake, proxy_with(upstream_policy(fake)) as px:
        host, _, port = px.url.removeprefix("http://").partition(":")
        for _ in range(3):
            reader, writer = await asyncio.open_connection(host, int(port))
            sock = writer.get_extra_info("socket")
            writer.write(
                b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body)
            )
            await reader.readexactly(50_000)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            writer.transport.abort()  # an RST
        assert await incomplete(px) == {}


async def test_many_readers_resuming_one_session_lose_no_chunk_and_leave_no_waiter() -> None:
    """Readers that time out over and over (each resume a short read) while the producer appends
    at the loop's pace: every reader sees every chunk in order, and no future is left behind."""
    session = SessionHub(ttl_s=60, max_bytes=1 << 22).create("client", "m")
    total = 300

    async def reader(timeout: float) -> list[int]:
        seen: list[int] = []
        index, done = 0, False
        while not done:
            events, done = await session.read(index, timeout)
            index += len(events)
            seen.extend(orjson.loads(payload)["chunk"]["seq"] for _, payload in events)
        return seen

    readers = [asyncio.create_task(reader(0.0005 * (n % 5))) for n in range(200)]
    await until(lambda: len(session._waiters) >= 100, "readers waiting")
    for seq in range(total):
        session.append({"chunk": {"seq": seq}})
        if seq % 7 == 0:
            await asyncio.sleep(0)
        assert len(session._waiters) <= len(readers)
    session.finish()
    for seen in await asyncio.gather(*readers):
        assert seen == list(range(total))
    assert not session._waiters


def _event(content: str, finish: str | None = None, index: int = 0) -> bytes:
    choice = {"index": index, "delta": {"content": content}, "finish_reason": finish}
    return b"data: " + orjson.dumps({"object": "chat.completion.chunk", "choices": [choice]}) + b"\n\n"


_BIG = _event("x" * (BATCH_BYTES - 200))
_EDGE = _event("a" * 100)
# Hostile SSE bodies, each sent as the listed writes, and how the proxy counts it (no error event
# when nothing but malformed chunks is counted). Every verdict is the same at 47e5112.
_TRUNCATED = {"truncated": 1.0}
_BODIES: dict[str, tuple[list[bytes], dict[str, float]]] = {
    "event split at the 16 KiB batch edge, finish_reason last, no [DONE]": (
        [_BIG + _EDGE[: BATCH_BYTES - len(_BIG)], _EDGE[BATCH_BYTES - len(_BIG) :], _event("", "stop")],
        {},
    ),
    "CRLF split between CR and LF at the batch edge, then [DONE]": (
        [_BIG.replace(b"\n", b"\r\n")[:-1], b"\n" + _EDGE.replace(b"\n", b"\r\n"), b"data: [DONE]\r\n\r\n"],
        {},
    ),
    "[DONE] in the middle, bytes after it": ([_EDGE, b"data: [DONE]\n\n", _EDGE], {}),
    # Accepted (as at 47e5112): the client was told the choice finished; the rule is every choice
    # named in the last batches has a finish_reason, not that it is the last chunk's.
    "finish_reason in a non-final chunk, content after it": ([_event("a", "stop"), _BIG, _EDGE], {}),
    "a second choice left open": ([_event("a", "stop"), _event("b", index=1)], _TRUNCATED),
    "data: without a space, huge, unfinished": (
        [_BIG.replace(b"data: ", b"data:") * 3],
        _TRUNCATED,
    ),
    "NaN, 1e400 and invalid UTF-8 events, then [DONE]": (
        [_EDGE, b"data: NaN\n\n", b'data: {"a":1e400}\n\n', b'data: "\xff"\n\n', b"data: [DONE]\n\n"],
        {"malformed_chunk": 1.0},  # forwarded as sent, the stream counted once
    ),
    "one byte a write, then [DONE]": ([bytes([b]) for b in _EDGE * 3 + b": c\n\ndata: [DONE]\n\n"], {}),
}


@pytest.mark.parametrize("name", list(_BODIES))
async def test_a_hostile_sse_body_is_judged_as_at_47e5112(proxy_with: ProxyWith, name: str) -> None:
    """The copy's own batching (a list append per read, the check judged at ``BATCH_BYTES``) gives
    the same verdict as feeding the check every read (47e5112): complete streams pass untouched,
    incomplete ones end with one error event, each counted once."""
    writes, counted = _BODIES[name]

    async def hostile(request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        for data in writes:
            await resp.write(data)
        await resp.write_eof()
        return resp

    async with (
        hostile_upstream(hostile) as fake,
        proxy_with(upstream_policy(fake)) as px,
        aiohttp.ClientSession() as session,
    ):
        resp = await session.post(px.base + "/chat/completions", json=CHAT)
        body = await resp.read()
        assert resp.status == 200
        assert body.startswith(b"".join(writes))  # forwarded as sent
        errors = body[len(b"".join(writes)) :]
        if "truncated" in counted:
            assert errors.count(b'"code":"upstream_stream_error"') == 1
        else:
            assert errors == b""
        assert await incomplete(px) == counted


async def test_a_stall_inside_a_huge_unfinished_event_still_ends_at_the_idle_bound(
    proxy_with: ProxyWith,
) -> None:
    """The upstream sends a first event, then 20 KiB of an event that never ends (past the batch
    edge, held as pending), then nothing: the read deadline fires, the client gets the bytes and
    one error event, ``stalled`` is counted, and the upstream's connection is let go."""
    released = asyncio.Event()
    head = _event("a") + b'data: {"choices":[{"index":0,"delta":{"content":"' + b"z" * 20_000

    async def stalling(request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        await resp.write(head)
        try:
            await asyncio.Event().wait()  # never sends again
        finally:
            released.set()  # the proxy closed the connection (this handler is cancelled)
        return resp

    async with hostile_upstream(stalling, handler_cancellation=True) as fake:
        policy = upstream_policy(fake)
        policy["failover"] = {"retries": 0, "timeout": {"per_try_s": 0.5, "total_s": 4}}
        async with proxy_with(policy) as px, aiohttp.ClientSession() as session:
            resp = await session.post(px.base + "/chat/completions", json=CHAT)
            body = await resp.read()
            assert resp.status == 200 and body.startswith(head)
            assert body[len(head) :].count(b'"code":"upstream_stream_error"') == 1
            assert await incomplete(px) == {"stalled": 1.0}
            await asyncio.wait_for(released.wait(), 10)
