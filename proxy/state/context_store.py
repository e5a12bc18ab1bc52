"""Context in Redis (``--redis-url``): the ``ContextStore`` of ``proxy.context.store`` over the
app's outbox, shared by the replicas.

Read-your-writes (docs/context.md, "Consistency"): a write joins the outbox at once and stays in
this replica's overlay of pending writes until Redis acknowledges it; every read on this replica
answers a pending write's value in place of Redis's, so the session's next call on the same replica
sees it whatever Redis does (slow, down, restarting). A call that writes waits for the
acknowledgement at most the ``context`` purpose's timeout (the time after which a context read
calls Redis down): within it, the next call on any replica sees the write too."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from typing import Any

import structlog
from redis.exceptions import RedisError

from proxy.context.identity import namespace_in
from proxy.context.store import ClientQuota, Clock, ContextUnavailable
from proxy.module.context_spec import TTL_PERSISTENT
from proxy.retained import retained
from proxy.state.outbox import KeyWrite, RedisOutbox
from proxy.state.redis_client import RedisOptions, redis_client

log = structlog.get_logger("proxy.context")


@dataclass(frozen=True, slots=True)
class _Pending:
    """A write of this replica Redis has not acknowledged yet."""

    value: bytes
    expires: float
    """On the store's clock (``inf``: a persistent item)."""


class RedisContextStore:
    """Context in Redis: TTL by Redis expiry, persistent items with none. Reads go to Redis (with
    the ``context`` timeout: a Redis that does not answer within it is down, and reads skip it,
    answering "not available", for its retry interval), except for keys with a pending write of
    this replica, answered from it. Writes go through the app's outbox, in order with the other
    Redis writes. Only writes a read waits for (``wait``: the session's context) are kept pending,
    one per key, bounded by the outbox's bound; a result-cache entry is not (a miss does no harm)."""

    def __init__(self, options: RedisOptions, outbox: RedisOutbox, *, clock: Clock = time.monotonic) -> None:
        self._redis: Any = redis_client(options, "context")
        self._outbox = outbox
        self._health = options.health("context", clock)
        self._clock = clock
        self._ack_wait_s = options.timeout_s("context")
        """How long a write waits for Redis's acknowledgement: the context purpose's timeout."""
        self._pending: dict[str, _Pending] = {}

    @property
    def degraded(self) -> bool:
        return self._health.down

    def pending(self, keys: Iterable[str]) -> dict[str, bytes]:
        now = self._clock()
        return {
            key: write.value
            for key in keys
            if (write := self._pending.get(key)) is not None and write.expires > now
        }

    async def get(self, key: str) -> bytes | None:
        written = self.pending((key,))
        if written:
            return written[key]
        if self.degraded:
            raise ContextUnavailable("the context store (Redis) is down")
        try:
            value: bytes | None = await self._redis.get(key)
        except (RedisError, OSError) as exc:
            raise self._unavailable(exc) from exc
        return value

    async def get_many(self, keys: Sequence[str]) -> dict[str, bytes | None]:
        written = self.pending(keys)  # before the read is sent: the writes it may not see
        unread = [key for key in keys if key not in written]
        if not unread:
            return dict(written)
        if self.degraded:
            raise ContextUnavailable("the context store (Redis) is down")
        try:
            values: list[bytes | None] = await self._redis.mget(unread)  # one slot: the client's tag
        except (RedisError, OSError) as exc:
            raise self._unavailable(exc) from exc
        return {**dict(zip(unread, values, strict=True)), **written}

    def _unavailable(self, exc: BaseException) -> ContextUnavailable:
        if self._health.failed():
            log.warning("proxy.context_store_unavailable", error=str(exc) or type(exc).__name__)
        return ContextUnavailable("the context store (Redis) is down")

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
        if delivered is None or not wait:
            return  # the outbox is full (dropped and counted there), or a write no read waits for
        expires = float("inf") if ttl == TTL_PERSISTENT else self._clock() + ttl
        pending = self._pending[key] = _Pending(retained(value), expires)
        delivered.add_done_callback(lambda _: self._acknowledged(key, pending))
        if not self._outbox.up:
            return  # Redis is down: delivered later, in order; this replica reads it meanwhile
        with contextlib.suppress(TimeoutError):  # past it: delivered later, in order
            await asyncio.wait_for(asyncio.shield(delivered), self._ack_wait_s)

    def _acknowledged(self, key: str, write: _Pending) -> None:
        """Redis has the write (or refused it): reads go to Redis again, unless a later write of
        the key is pending."""
        if self._pending.get(key) is write:
            del self._pending[key]

    async def aclose(self) -> None:
        await self._redis.aclose()
