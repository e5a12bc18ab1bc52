"""The aiohttp internals ``proxy.server`` reads, pinned.

``EdgeHandler`` learns that a request head was parsed, and which body stream it has, from
``RequestHandler._request_count`` and ``._messages`` right after aiohttp's ``data_received``;
aiohttp has no public hook for it. It also reads ``_current_request``, ``_reading_paused`` and
``_loop``, and ``EdgeServer`` reads ``web.Server._kwargs``. An aiohttp release that renames or
changes any of them fails here by name, instead of the client read deadline quietly going
wrong. pyproject.toml bounds aiohttp below 4 for the same reason.

``HeldHeadResponse`` (``proxy.api.stream_response``) sets ``_send_headers_immediately``, the class
attribute aiohttp's own ``Response`` uses to send its head with the first body bytes.
"""

from __future__ import annotations

import asyncio
import select
import socket
from collections.abc import AsyncIterator

import pytest
from aiohttp import StreamReader, web
from aiohttp.http_parser import RawRequestMessage
from aiohttp.web_protocol import RequestHandler

from proxy.api.stream_response import HeldHeadResponse
from proxy.observability.metrics import Metrics
from proxy.server import ConnectionGuard, EdgeHandler, EdgeServer

HANDLER_INTERNALS = ("_request_count", "_messages", "_current_request", "_reading_paused", "_loop")
HEAD = b"POST /v1/x HTTP/1.1\r\nHost: proxy\r\nContent-Length: 10\r\n\r\n"


async def _never_called(request: web.BaseRequest) -> web.StreamResponse:
    raise AssertionError("the test reads the parser's state before any handler runs")


@pytest.fixture
async def edge_handler() -> AsyncIterator[EdgeHandler]:
    """An ``EdgeHandler`` on one end of a real socket pair (the test feeds it bytes itself)."""
    loop = asyncio.get_running_loop()
    inner = web.Server(_never_called, loop=loop)
    server = EdgeServer(inner, ConnectionGuard("api", 8, 30.0, Metrics()))
    handler = server()
    assert isinstance(handler, EdgeHandler)
    ours, theirs = socket.socketpair()
    transport, _ = await loop.connect_accepted_socket(lambda: handler, ours)
    try:
        yield handler
    finally:
        transport.close()
        theirs.close()
        await server.shutdown(0)
        await inner.shutdown(0)


async def test_the_attributes_read_are_still_aiohttps(edge_handler: EdgeHandler) -> None:
    missing = [name for name in HANDLER_INTERNALS if not hasattr(edge_handler, name)]
    missing += [] if hasattr(web.Server(_never_called), "_kwargs") else ["web.Server._kwargs"]
    assert not missing, f"aiohttp changed internals proxy/server.py reads: {missing}; rework EdgeHandler"


async def test_a_parsed_head_counts_a_request_and_queues_its_body_stream(edge_handler: EdgeHandler) -> None:
    handler: RequestHandler = edge_handler
    before = handler._request_count
    handler.data_received(HEAD + b"01234")  # synchronously: aiohttp's start() has not taken it yet
    assert handler._request_count == before + 1, "aiohttp no longer counts parsed heads in data_received"
    message, payload = handler._messages[-1]
    assert isinstance(payload, StreamReader), f"aiohttp's queued message is now {type(payload)}"
    assert isinstance(message, RawRequestMessage) and message.method == "POST"
    assert not payload.is_eof()


async def test_the_edge_handler_follows_a_body_from_its_head_to_its_end(edge_handler: EdgeHandler) -> None:
    edge_handler.data_received(HEAD + b"01234")
    body = edge_handler._payload
    assert body is not None and not body.is_eof()
    assert edge_handler._deadline.due is not None  # a body is arriving: the read deadline runs
    edge_handler.data_received(b"56789")
    assert body.is_eof() and edge_handler._deadline.due is None  # complete: the handler has it


def _readable(sock: socket.socket) -> bool:
    return bool(select.select([sock], [], [], 0)[0])


async def test_a_held_head_leaves_with_the_first_body_bytes_in_one_write() -> None:
    """The head is not sent at ``prepare``; the first write sends it and its bytes in one socket
    write, and ``write_eof(last)`` the last bytes and the end in another. On loopback a send is in
    the peer's receive queue when the call returns, so what the client can read after each step is
    what the server wrote by then."""
    assert "_send_headers_immediately" in vars(web.StreamResponse), "aiohttp renamed the head-sending switch"
    steps = [asyncio.Event() for _ in range(4)]  # prepared, write, written, end

    async def handler(request: web.BaseRequest) -> web.StreamResponse:
        response = HeldHeadResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        steps[0].set()
        await steps[1].wait()
        await response.write(b"event: meta\ndata: {}\n\n")
        steps[2].set()
        await steps[3].wait()
        await response.write_eof(b"event: final\ndata: {}\n\n")
        return response

    loop = asyncio.get_running_loop()
    server = web.Server(handler, loop=loop)
    ours, theirs = socket.socketpair()
    theirs.setblocking(False)
    transport, _ = await loop.connect_accepted_socket(server, ours)
    try:
        theirs.send(b"GET /s HTTP/1.1\r\nHost: proxy\r\n\r\n")
        await asyncio.wait_for(steps[0].wait(), 10)
        assert not _readable(theirs), "the head left at prepare, alone"
        steps[1].set()
        await asyncio.wait_for(steps[2].wait(), 10)
        first = theirs.recv(65536)
        assert first.startswith(b"HTTP/1.1 200 OK\r\n")
        assert first.endswith(b"\r\n\r\n16\r\nevent: meta\ndata: {}\n\n\r\n")
        steps[3].set()
        last = b""
        while not last.endswith(b"\r\n0\r\n\r\n"):
            last += await asyncio.wait_for(loop.sock_recv(theirs, 65536), 10)
        assert last == b"17\r\nevent: final\ndata: {}\n\n\r\n0\r\n\r\n"
    finally:
        for step in steps:
            step.set()
        transport.close()
        theirs.close()
        await server.shutdown(0)
