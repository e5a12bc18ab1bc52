"""Attack on the #35 stream-path changes (relay.copy in a task of its own, reads via ``Body``,
``StreamCheck``'s batch pass, module-stream readers): through the served proxy, from outside."""

from __future__ import annotations

import asyncio
import re
import socket
import struct
from collections.abc import AsyncIterator

import aiohttp
import pytest
from aiohttp import web

from proxy.upstream.body import Body
from proxy.upstream.relay import copy
from proxy.upstream.sse import StreamCheck
from tests.conftest import ProxyWith
from tests.fake_upstream import FakeUpstream
from tests.proxy_server import RunningProxy, upstream_policy
from tests.support.polling import until

CHAT = {"model": "gpt-4o-mini", "stream": True, "messages": [{"role": "user", "content": "x"}]}


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

    app = web.Application()
    app.router.add_post("/v1/chat/completions", burst)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    fake = FakeUpstream()
    fake.url = f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}"  # type: ignore[union-attr]
    body = b'{"model":"gpt-4o-mini","stream":true,"messages":[{"role":"user","content":"x"}]}'
    try:
        async with proxy_with(upstream_policy(fake)) as px:
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
    finally:
        await runner.cleanup()
