"""A clean database of the suite's own Redis (:mod:`tests.support.redis_server`) for one test: the
one factory behind every Redis fixture of the suite.

``fresh_db(db)`` empties database ``db`` before and after (``match``: only the keys matching that
pattern, for tests that share a database with others); the ``redis_db`` fixture is database 15,
answering ``str``. Nothing here can reach a Redis the suite did not start.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import pytest
import redis.asyncio as aioredis

from tests.support.redis_server import redis_url


async def _empty(client: aioredis.Redis, match: str | None) -> None:
    if match is None:
        await client.flushdb()
        return
    keys = [key async for key in client.scan_iter(match=match)]
    if keys:
        await client.delete(*keys)


@asynccontextmanager
async def fresh_db(db: int = 15, *, match: str | None = None, decode: bool = False) -> AsyncIterator[Any]:
    """A client on database ``db``, emptied (of the keys matching ``match``) before and after;
    ``decode``: answers are ``str`` rather than ``bytes``."""
    client: Any = aioredis.Redis.from_url(redis_url(db), decode_responses=decode)
    try:
        await _empty(client, match)
        yield client
        await _empty(client, match)
    finally:
        await client.aclose()


@pytest.fixture
async def redis_db() -> AsyncIterator[Any]:
    """The test's own Redis database (15), emptied before and after; answers are ``str``."""
    async with fresh_db(15, decode=True) as client:
        yield client
