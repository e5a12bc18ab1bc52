"""Attack on the held-head stream changes (``HeldHeadResponse``, ``respond``'s two loop turns and
its one last write, follow's checkpoint walk-back, the reload poll's scandir): from outside,
through the served proxy and the fake upstream."""

from __future__ import annotations

import asyncio
import contextlib
import re
import socket
import struct
from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import orjson
from aiohttp import web
from structlog.testing import capture_logs

from proxy.api.streaming import STREAMS
from proxy.reload import fingerprint
from proxy.settings import Settings
from tests.api.test_modules import REVIEW_INPUT
from tests.api.test_streaming import SSE, answer
from tests.conftest import ProxyWith
from tests.fake_upstream import FakeUpstream, Fault
from tests.proxy_server import RunningProxy, upstream_policy
from tests.stream.client import read_sse
from tests.support.app_upstream import app_upstream
from tests.support.polling import until

LONG = " ".join(f"word{i}" for i in range(40))
EXECUTE = "/v1/modules/code-reviewer/execute"


def _execute_request(body: bytes) -> bytes:
    return (
        b"POST %s HTTP/1.1\r\nHost: 127.0.0.1\r\nAccept: text/event-stream\r\n"
        b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n%s"
        % (EXECUTE.encode(), len(body), body)
    )


async def _reset_after(px: RunningProxy, turns: int) -> None:
    """Send a module stream request, let ``turns`` turns of the loop pass, then reset (RST)."""
    host, _, port = px.url.removeprefix("http://").partition(":")
    _, writer = await asyncio.open_connection(host, int(port))
    writer.write(_execute_request(orjson.dumps({"input": REVIEW_INPUT})))
    await writer.drain()
    for _ in range(turns):
        await asyncio.sleep(0)
    sock = writer.get_extra_info("socket")
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()


async def _statuses(px: RunningProxy, route: str) -> dict[str, float]:
    """``cognitive_requests_total`` of ``route`` by status."""
    async with aiohttp.ClientSession() as session:
        text = await (await session.get(px.url + "/metrics")).text()
    found = re.findall(r"^cognitive_requests_total\{(.*)\} (\S+)$", text, re.MULTILINE)
    counts: dict[str, float] = {}
    for labels, value in found:
        if f'route="{route}"' in labels:
            status = re.search(r'status="(\d+)"', labels)
            assert status is not None
            counts[status[1]] = counts.get(status[1], 0.0) + float(value)
    return counts


async def test_a_module_stream_reset_at_any_turn_is_a_499_not_an_internal_error(
    proxy_with: ProxyWith,
) -> None:
    """RSTs at every loop turn from the request on (before the held head leaves, during the two
    turns, at the meta write, mid-follow): a write meeting the closing transport before the
    handler's cancel raised ``ClientConnectionResetError`` through the edge, logged as
    ``proxy.internal_error`` and counted as a 500 (at 604f19b and at 28f55fe alike). Without
    recovery each producer is cancelled (the upstream answer would take 8 s)."""
    async with (
        FakeUpstream.start(chunk_delay=0.2) as fake,
        proxy_with(upstream_policy(fake), stream_recovery=False) as px,
    ):
        fake.set_default_reply("cheap", LONG)
        with capture_logs() as logs:
            for turns in range(40):
                await _reset_after(px, turns)
            hub = px.app[STREAMS]
            await until(lambda: not hub.tasks, "every producer cancelled")
            await until(lambda: fake.in_flight == 0, "no upstream call left")
        statuses = await _statuses(px, "/v1/modules/{name}/execute")
    assert [e for e in logs if e["event"] == "proxy.internal_error"] == []
    assert "500" not in statuses and statuses.get("499", 0) > 0, statuses
    assert hub.live == 0


async def test_with_recovery_a_reset_stream_keeps_its_producer(proxy_with: ProxyWith) -> None:
    """The same resets with ``--stream-recovery`` (the default): no internal error, and no producer
    is cancelled: each upstream call runs to its end and its session finishes (resumable)."""
    async with FakeUpstream.start(chunk_delay=0.01) as fake, proxy_with(upstream_policy(fake)) as px:
        fake.set_default_reply("cheap", answer(0.92, rationale=LONG))
        with capture_logs() as logs:
            for turns in range(20):
                await _reset_after(px, turns)
            hub = px.app[STREAMS]
            await until(lambda: not hub.tasks, "every producer at its end")
        assert [e for e in logs if e["event"] == "proxy.internal_error"] == []
        assert fake.cancelled == 0 and fake.in_flight == 0
        assert hub.live == 0 and "500" not in await _statuses(px, "/v1/modules/{name}/execute")


DELIVERY_S = 0.05
"""How long a peek waits for bytes the proxy sent before it (none can be sent during it)."""


async def _reset_seeing_the_head(px: RunningProxy, turns: int) -> bool:
    """``_reset_after`` on a plain socket (closed, so reset, at once: an asyncio transport's abort
    closes on the loop's next turn, after which the proxy may still write), and whether any byte
    of the answer had reached the client by then (peeked at, never read)."""
    host, _, port = px.url.removeprefix("http://").partition(":")
    with socket.create_connection((host, int(port))) as sock:
        sock.sendall(_execute_request(orjson.dumps({"input": REVIEW_INPUT})))
        for _ in range(turns):
            await asyncio.sleep(0)
        # Blocking, so the proxy (this loop) sends nothing meanwhile: what it sent before is let
        # arrive (loopback delivery may trail the send on a loaded machine).
        sock.settimeout(DELIVERY_S)
        try:
            seen = bool(sock.recv(1, socket.MSG_PEEK))
        except TimeoutError:
            seen = False
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    return seen


async def test_with_recovery_a_stream_whose_head_never_left_is_no_orphan(proxy_with: ProxyWith) -> None:
    """With recovery, a producer outlives its connection so that the client can resume with the
    session id from the head. A client reset before the held head left (``respond``'s two loop
    turns) never had that id: its producer ran the whole upstream call for no one (9 of 40 resets,
    at 604f19b and 28f55fe alike). Such a producer is cancelled; one whose head reached the client
    runs to its end."""
    async with FakeUpstream.start(chunk_delay=0.05) as fake, proxy_with(upstream_policy(fake)) as px:
        fake.set_default_reply("cheap", answer(0.92, rationale=LONG))
        seen = [await _reset_seeing_the_head(px, turns) for turns in range(40)]
        hub = px.app[STREAMS]
        await until(lambda: not hub.tasks, "every producer at its end or cancelled", timeout=30)
        async with aiohttp.ClientSession() as session:
            text = await (await session.get(px.url + "/metrics")).text()
    outcomes = dict(
        re.findall(r'^cognitive_streams_total\{module="code-reviewer",outcome="(\w+)"\} (\S+)$', text, re.M)
    )
    assert float(outcomes.get("final", 0)) == seen.count(True), (outcomes, seen.count(True))


def _module_tree(tmp_path: Path) -> tuple[Settings, Path]:
    policy = tmp_path / "policy.yaml"
    policy.write_text("version: 1\n")
    module = tmp_path / "modules" / "m"
    (module / "tests").mkdir(parents=True)
    (module / "module.yaml").write_text("name: m\n")
    (module / "tests" / "a.input.json").write_text("{}")
    return Settings(policy_path=policy, module_dirs=(tmp_path / "modules",)), module


def test_a_symlink_loop_in_a_module_directory_is_walked_once(tmp_path: Path) -> None:
    """A link back up the tree (``ln -s .. up``, a ``current -> .``): the poll, on the event loop
    every second and once at start-up, followed it until the kernel's 40-link limit (40 stamps of
    each file for one link; with two such links 2**40 paths: the proxy hung at start-up, at
    604f19b and at 28f55fe alike). A directory reached through a link is walked once."""
    settings, module = _module_tree(tmp_path)
    (module / "tests" / "up").symlink_to("..")
    (module / "here").symlink_to(".")
    (module / "again").symlink_to(".")
    stamps = fingerprint(settings)
    names = Counter(Path(stamp[0]).name for stamp in stamps)
    assert set(names) == {"a.input.json", "module.yaml", "policy.yaml"}
    assert max(names.values()) <= 2, names  # the real walk, and at most once through a link
    (module / "tests" / "a.input.json").write_text("{ }")
    assert fingerprint(settings) != stamps  # an edit is still seen


def test_a_directory_deeper_than_the_recursion_limit_does_not_stop_the_poll(tmp_path: Path) -> None:
    """A real tree 1,200 directories deep under a module: the walk is no recursion (a
    ``RecursionError`` would end the poll task, and fail start-up)."""
    settings, module = _module_tree(tmp_path)
    levels = [module / "d"]
    for _ in range(1200):
        levels[-1].mkdir()  # one by one: os.makedirs is itself a recursion
        levels.append(levels[-1] / "d")
    leaf = levels.pop().with_name("leaf.md")
    leaf.write_text("x")
    try:
        stamps = fingerprint(settings)
        assert "leaf.md" in {Path(stamp[0]).name for stamp in stamps}
    finally:  # shutil.rmtree (pytest's clean-up of old temporary directories) recurses too
        leaf.unlink()
        for level in reversed(levels):
            level.rmdir()


async def _sse_events(response: aiohttp.ClientResponse) -> list[dict[str, Any]]:
    """The data of every event of an SSE module stream, checked by the chunk schema."""
    return [chunk for _, chunk in await read_sse(response)]


async def test_a_resumed_checkpoint_is_echoed_only_as_the_session_holds_it(proxy_with: ProxyWith) -> None:
    """A retry names the right checkpoint with its offset as a float and a key of its own: it
    matches (5.0 == 5, the extra key ignored), and when the resumed stream is interrupted before
    the next delta (the upstream stalls past the session TTL) the error chunk's recovery named the
    client's object as given: extra keys and a float offset, a chunk the shipped schema refuses."""
    async with (
        FakeUpstream.start() as fake,
        proxy_with(upstream_policy(fake), stream_session_ttl_s=0.5, stream_heartbeat_s=0.05) as px,
        aiohttp.ClientSession() as session,
    ):
        fake.set_default_reply("cheap", answer(0.92, rationale=LONG))
        fake.script("cheap", Fault.stall(at=30, delay=20))
        url = px.url + EXECUTE
        async with session.post(url, json={"input": REVIEW_INPUT}, headers=SSE) as first:
            events = await _sse_events(first)
        recovery = events[-1]["error"]["recovery"]
        given = {**recovery["last_checkpoint"], "offset": float(recovery["last_checkpoint"]["offset"])}
        body = {
            "input": REVIEW_INPUT,
            "_recovery": {
                "session_id": events[0]["session_id"],
                "last_seq": recovery["last_seq"],
                "last_checkpoint": {**given, "note": "x" * 1000},
            },
        }
        async with session.post(url, json=body, headers=SSE) as resumed:
            rest = await _sse_events(resumed)
    assert rest[0]["resumed"] is True
    assert rest[-1]["error"]["recovery"]["last_checkpoint"] == recovery["last_checkpoint"]


@contextlib.asynccontextmanager
async def _answers_without_bodies() -> AsyncIterator[FakeUpstream]:
    """An upstream answering ``/v1/things/*`` with heads and no (or a declared) body, and one head
    followed by silence, named as a ``FakeUpstream`` for ``upstream_policy``."""

    async def nobody(request: web.Request) -> web.StreamResponse:
        return web.Response(status=204)

    async def cached(request: web.Request) -> web.StreamResponse:
        return web.Response(status=304, headers={"ETag": '"v1"'})

    async def sized(request: web.Request) -> web.StreamResponse:
        return web.Response(body=b"abc" * 400, content_type="application/octet-stream")

    async def empty(request: web.Request) -> web.StreamResponse:
        return web.Response(body=b"", content_type="application/json")

    async def head_then_silence(request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "application/octet-stream"})
        await resp.prepare(request)
        await asyncio.Event().wait()  # cancelled when the proxy lets the connection go
        return resp

    app = web.Application()
    app.router.add_get("/v1/things/nobody", nobody)
    app.router.add_get("/v1/things/cached", cached)
    app.router.add_get("/v1/things/sized", sized)  # aiohttp answers HEAD with the same head
    app.router.add_get("/v1/things/empty", empty)
    app.router.add_get("/v1/things/silent", head_then_silence)
    async with app_upstream(app, handler_cancellation=True) as fake:
        yield fake


async def test_relayed_answers_without_bodies_keep_their_framing_and_a_silent_head_is_no_hang(
    proxy_with: ProxyWith,
) -> None:
    """Through the passthrough relay (its head held until the first write): 204, 304, HEAD, an
    empty and a sized body leave whole, one after another on one keep-alive connection (a
    framing slip would break the next answer); an upstream that sends its head and then nothing
    is the attempt's timeout (504), not a head held forever. Holds at c794b20."""
    async with _answers_without_bodies() as fake:
        policy = upstream_policy(fake)
        policy["passthrough"] = {"routes": [{"prefix": "/v1/things", "providers": ["up"]}]}
        policy["failover"] = {"retries": 0, "timeout": {"per_try_s": 0.5, "total_s": 2}}
        connector = aiohttp.TCPConnector(limit=1)
        async with proxy_with(policy) as px, aiohttp.ClientSession(connector=connector) as session:
            for _ in range(2):
                async with session.get(px.base + "/things/nobody") as resp:
                    assert (resp.status, await resp.read()) == (204, b"")
                async with session.get(px.base + "/things/cached") as resp:
                    assert (resp.status, await resp.read(), resp.headers["ETag"]) == (304, b"", '"v1"')
                async with session.head(px.base + "/things/sized") as resp:
                    assert (resp.status, resp.headers["Content-Length"]) == (200, "1200")
                    assert await resp.read() == b""
                async with session.get(px.base + "/things/empty") as resp:
                    assert (resp.status, await resp.read()) == (200, b"")
                async with session.get(px.base + "/things/sized") as resp:
                    assert (resp.status, await resp.read()) == (200, b"abc" * 400)
            async with session.get(px.base + "/things/silent") as resp:
                assert resp.status == 504, await resp.text()
