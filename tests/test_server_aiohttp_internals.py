"""The aiohttp internals ``proxy.server`` reads, pinned.

``EdgeHandler`` learns that a request head was parsed, and which body stream it has, from
``RequestHandler._request_count`` and ``._messages`` right after aiohttp's ``data_received``;
aiohttp has no public hook for it. It also reads ``_current_request``, ``_reading_paused`` and
``_loop``, and ``EdgeServer`` reads ``web.Server._kwargs``. An aiohttp release that renames or
changes any of them fails here by name, instead of the client read deadline quietly going
wrong. pyproject.toml bounds aiohttp below 4 for the same reason.
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator

import pytest
from aiohttp import StreamReader, web
from aiohttp.http_parser import RawRequestMessage
from aiohttp.web_protocol import RequestHandler

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
