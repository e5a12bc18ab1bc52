"""The harness itself: the canary sees connections and raw requests reach the proxy unchanged."""

from __future__ import annotations

import asyncio

from tests.proxy_server import ServedProcess
from tests.security.harness import Canary, raw_http, request_bytes
from tests.support.polling import until


async def test_canary_counts_a_connection() -> None:
    canary = await Canary().start()
    try:
        _, writer = await asyncio.open_connection(canary.host, canary.port)
        writer.write(b"hello")
        await writer.drain()
        writer.close()
        await writer.wait_closed()
        await until(lambda: canary.connections, "the canary reached", timeout=2, step=0.01)
        assert canary.connections == 1
    finally:
        await canary.stop()


async def test_raw_request_reaches_a_served_proxy(served: ServedProcess) -> None:
    host, port = served.url.removeprefix("http://").split(":")
    answer = await raw_http(host, int(port), request_bytes("GET", "/healthz"))
    assert answer.status == 200
