"""Context in Redis (``--redis-url``): the ``ContextStore`` of ``proxy.context.store`` over the
app's outbox, shared by the replicas."""

from __future__ import annotations

import asyncio
import contextlib
import time
from dataclasses import replace
from typing import Any

import structlog
from redis.exceptions import RedisError

from proxy.context.identity import namespace_in
from proxy.context.store import ClientQuota, Clock, ContextUnavailable
from proxy.module.context_spec import TTL_PERSISTENT
from proxy.state.outbox import KeyWrite, RedisOutbox
from proxy.state.redis_client import RedisOptions, redis_client

log = structlog.get_logger("proxy.context")

WRITE_WAIT_S = 0.25
"""How long a request waits for its context writes to reach Redis (read-your-writes for the
next call of the session); past it the outbox delivers them later."""


class RedisContextStore:
    """Context in Redis: TTL by Redis expiry, persistent items with none. Reads go straight to
    Redis (with the ``context`` timeout: a Redis that does not answer within it is down, and reads
    skip it, answering "not available", for its retry interval); writes go through the app's
    outbox, in order with the other Redis writes, and the request waits up to ``WRITE_WAIT_S``."""

    def __init__(self, options: RedisOptions, outbox: RedisOutbox, *, clock: Clock = time.monotonic) -> None:
        self._redis: Any = redis_client(options, "context")
        self._outbox = outbox
        self._health = options.health("context", clock)

    @property
    def degraded(self) -> bool:
        return self._health.down

    async def get(self, key: str) -> bytes | None:
        if self.degraded:
            raise ContextUnavailable("the context store (Redis) is down")
        try:
            value: bytes | None = await self._redis.get(key)
        except (RedisError, OSError) as exc:
            if self._health.failed():
                log.warning("proxy.context_store_unavailable", error=str(exc) or type(exc).__name__)
            raise ContextUnavailable("the context store (Redis) is down") from exc
        return value

    async def put(
        self, key: str, value: bytes, ttl: int, *, wait: bool = True, quota: ClientQuota | None = None
    ) -> None:
        if ttl == 0:
            return
        if quota is not None and len(value) > quota.max_bytes:
            return
        write = KeyWrite(key, value.decode(), None if ttl == TTL_PERSISTENT else ttl)
        if quota is not None:
            write = replace(
                write, owner=namespace_in(key), max_entries=quota.max_entries, max_bytes=quota.max_bytes
            )
        delivered = self._outbox.put_key(write)
        if delivered is None or not wait or not self._outbox.up:
            return  # full (dropped and counted there), or Redis is down: delivered later, in order
        with contextlib.suppress(TimeoutError):  # past the wait: delivered later, in order
            await asyncio.wait_for(asyncio.shield(delivered), WRITE_WAIT_S)

    async def aclose(self) -> None:
        await self._redis.aclose()
