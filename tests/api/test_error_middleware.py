"""The admin listener's ``error_middleware`` (``api.errors``): every failure leaves as an OpenAI
error body with its status; cancellation and redirects are not error answers."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer
from structlog.testing import capture_logs

from proxy.api.errors import ApiError, error_middleware

CANCELLED = asyncio.Event()


async def _internal(request: web.Request) -> web.StreamResponse:
    raise RuntimeError("a bug")


async def _refused(request: web.Request) -> web.StreamResponse:
    raise ApiError(409, "taken", code="conflict", headers={"X-Why": "taken"})


async def _redirect(request: web.Request) -> web.StreamResponse:
    raise web.HTTPFound("/elsewhere")


async def _cancelled(request: web.Request) -> web.StreamResponse:
    try:
        raise asyncio.CancelledError
    finally:
        CANCELLED.set()


@pytest.fixture
async def server() -> AsyncIterator[TestServer]:
    app = web.Application(middlewares=[error_middleware])
    app.router.add_get("/internal", _internal)
    app.router.add_get("/refused", _refused)
    app.router.add_get("/redirect", _redirect)
    app.router.add_get("/cancelled", _cancelled)
    served = TestServer(app, host="127.0.0.1", port=0)
    await served.start_server()
    try:
        yield served
    finally:
        await served.close()


async def test_an_unexpected_error_is_a_logged_500_internal_error(server: TestServer) -> None:
    async with aiohttp.ClientSession() as session:
        with capture_logs() as logs:
            resp = await session.get(server.make_url("/internal"))
            body = await resp.json()
    assert resp.status == 500
    assert body["error"] == {
        "message": "Internal error in the proxy; see its log for the trace id",
        "type": "server_error",
        "param": None,
        "code": "internal_error",
    }
    assert [e["path"] for e in logs if e["event"] == "proxy.internal_error"] == ["/internal"]


async def test_an_api_error_keeps_its_status_body_and_headers(server: TestServer) -> None:
    async with aiohttp.ClientSession() as session:
        resp = await session.get(server.make_url("/refused"))
        body = await resp.json()
    assert (resp.status, resp.headers["X-Why"]) == (409, "taken")
    assert body["error"]["code"] == "conflict" and body["error"]["type"] == "invalid_request_error"


async def test_a_redirect_is_not_an_error_answer(server: TestServer) -> None:
    async with aiohttp.ClientSession() as session:
        resp = await session.get(server.make_url("/redirect"), allow_redirects=False)
    assert (resp.status, resp.headers["Location"]) == (302, "/elsewhere")


async def test_cancellation_is_not_answered(server: TestServer) -> None:
    """A cancelled handler is re-raised, never turned into a 500: aiohttp drops the connection."""
    async with aiohttp.ClientSession() as session:
        with capture_logs() as logs, pytest.raises(aiohttp.ServerDisconnectedError):
            await session.get(server.make_url("/cancelled"))
    assert CANCELLED.is_set()
    assert not [e for e in logs if e["event"] == "proxy.internal_error"]
