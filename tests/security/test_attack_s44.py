"""Attack on the held-head stream changes (``HeldHeadResponse``, ``respond``'s two loop turns and
its one last write, follow's checkpoint walk-back, the reload poll's scandir): from outside,
through the served proxy and the fake upstream."""

from __future__ import annotations

import asyncio
import re
import socket
import struct

import aiohttp
import orjson
from structlog.testing import capture_logs

from proxy.api.streaming import STREAMS
from tests.api.test_modules import REVIEW_INPUT
from tests.conftest import ProxyWith
from tests.fake_upstream import FakeUpstream
from tests.proxy_server import RunningProxy, upstream_policy
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
