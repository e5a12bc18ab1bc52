"""An aiohttp app of the test's own served as an upstream, for the bytes no ``FakeUpstream`` script
sends."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

from aiohttp import web

from tests.fake_upstream import FakeUpstream


@contextlib.asynccontextmanager
async def app_upstream(
    app: web.Application, *, handler_cancellation: bool = False
) -> AsyncIterator[FakeUpstream]:
    """``app`` on a free loopback port, named as a ``FakeUpstream`` (its ``url``) for
    ``upstream_policy``; cleaned up on leaving."""
    runner = web.AppRunner(app, handler_cancellation=handler_cancellation)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    fake = FakeUpstream()
    fake.url = f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}"  # type: ignore[union-attr]
    try:
        yield fake
    finally:
        await runner.cleanup()
