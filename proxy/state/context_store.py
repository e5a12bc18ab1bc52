"""Context in Redis (``--redis-url``): the ``ContextStore`` of ``proxy.context.store`` over the
app's outbox, shared by the replicas.

Read-your-writes (docs/context.md, "Consistency"): a write joins the outbox at once and stays in
this replica's overlay of pending writes until Redis acknowledges it; every read on this replica
answers a pending write's value in place of Redis's, so the session's next call on the same replica
sees it whatever Redis does (slow, down, restarting). Another replica's next call sees it through
the session's pending-write marks (``proxy.context.store.Mark``; ``SessionMarks`` here): the call
that writes added its mark before its model was asked, its writes go without a wait, and the mark
goes after them; a reader that sees the mark re-reads until it is gone, at most the ``context``
purpose's timeout (the time after which a context read calls Redis down). A write no mark covers
(no session read ahead, a call past its mark's life) waits for the acknowledgement instead, that
long at most."""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace
from typing import Any

import structlog
from redis.exceptions import RedisError

from proxy.context.identity import Identity, namespace_in
from proxy.context.store import (
    MARK_MARGIN_S,
    MARK_TTL_S,
    ClientQuota,
    Clock,
    ContextUnavailable,
    Mark,
    SessionMarks,
    marks_of,
)
from proxy.module.context_spec import TTL_PERSISTENT
from proxy.retained import retained
from proxy.state.outbox import KeyWrite, MarkDone, RedisOutbox
from proxy.state.pipelined import marked_values, queue_marked_read
from proxy.state.redis_client import RedisOptions, redis_client

log = structlog.get_logger("proxy.context")

POLL_FIRST_S = 0.001
POLL_MAX_S = 0.02
"""A reader waiting for another replica's mark re-reads after 1 ms, then twice as long each time
up to 20 ms (each re-read one round trip), until the mark is gone or the context timeout passed."""
MAX_OWN_MARKS = 100_000
"""Marks of this replica remembered at most (one per session call in flight; a backstop)."""


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

    def __init__(
        self,
        options: RedisOptions,
        outbox: RedisOutbox,
        *,
        clock: Clock = time.monotonic,
        on_mark_wait: Callable[[str, float], None] | None = None,
    ) -> None:
        """``on_mark_wait(result, seconds)``: a read waited on another replica's marks, ``seen``
        gone within the bound or ``not_seen`` (the proxy's ``cognitive_context_mark_wait_seconds``)."""
        self._on_mark_wait = on_mark_wait
        self._redis: Any = redis_client(options, "context")
        self._outbox = outbox
        self._health = options.health("context", clock)
        self._clock = clock
        self._ack_wait_s = options.timeout_s("context") or 0.25
        """How long a write waits for Redis's acknowledgement, and a reader for another replica's
        mark: the context purpose's timeout."""
        self._pending: dict[str, _Pending] = {}
        self._own: dict[str, float] = {}
        """This replica's marks not known removed, and when they expire (the store's clock):
        never waited for (this replica's writes are in its overlay)."""
        self._wall: Clock = time.time

    @property
    def degraded(self) -> bool:
        return self._health.down

    def marks(self) -> SessionMarks | None:
        return self

    def mark(self, identity: Identity) -> Mark | None:
        if identity.session_id is None:
            return None
        now = self._clock()
        if len(self._own) >= MAX_OWN_MARKS:
            self._own = {member: until for member, until in self._own.items() if until > now}
        member = uuid.uuid4().hex
        self._own[member] = now + MARK_TTL_S
        deadline_ms = int((self._wall() + MARK_TTL_S) * 1000)
        scope = identity.key(identity.session_id, "")
        return Mark(scope + "#writing", member, deadline_ms, now, scope)

    async def read_marked(self, keys: Sequence[str], mark: Mark) -> dict[str, bytes | None]:
        if self.degraded:
            raise ContextUnavailable("the context store (Redis) is down")
        try:
            async with self._redis.pipeline(transaction=False) as pipe:
                queue_marked_read(pipe, keys, mark)
                replies = await pipe.execute(raise_on_error=False)
        except (RedisError, OSError) as exc:
            raise self._unavailable(exc) from exc
        read = marked_values(replies, keys, mark)
        if isinstance(read, BaseException):
            raise self._unavailable(read) from read
        return read

    async def wait_for_writes(
        self, keys: Sequence[str], mark: Mark, alive: frozenset[str]
    ) -> dict[str, bytes | None] | None:
        waiting = {member for member in alive if member not in self._own}
        if not waiting:
            return None
        began = self._clock()
        deadline = began + self._ack_wait_s
        pause, values = POLL_FIRST_S, None
        while waiting and self._clock() < deadline:
            await asyncio.sleep(min(pause, max(0.0, deadline - self._clock())))
            pause = min(pause * 2, POLL_MAX_S)
            try:
                async with self._redis.pipeline(transaction=False) as pipe:
                    queue_marked_read(pipe, keys, replace(mark, deadline_ms=self._deadline_ms()), add=False)
                    read = marked_values(await pipe.execute(raise_on_error=False), keys, mark)
            except (RedisError, OSError):
                break  # Redis is failing: what was read stands, as when it is slow
            if isinstance(read, BaseException) or mark.key not in read:
                break
            waiting &= marks_of(read, mark)
            values = read
        if waiting:
            log.info("proxy.context_write_not_seen", waited_s=self._ack_wait_s, marks=len(waiting))
        if self._on_mark_wait is not None:
            self._on_mark_wait("not_seen" if waiting else "seen", self._clock() - began)
        return values

    def _deadline_ms(self) -> int:
        """A mark's deadline if added now (what ``queue_marked_read`` counts back from)."""
        return int((self._wall() + MARK_TTL_S) * 1000)

    def covers(self, mark: Mark) -> bool:
        return self._clock() < mark.started + MARK_TTL_S - MARK_MARGIN_S

    def release(self, mark: Mark) -> None:
        done = self._outbox.put_key(MarkDone(mark.key, mark.member, int(self._wall() * 1000)))
        if done is None:  # dropped (the outbox is full): it expires on its own
            self._own.pop(mark.member, None)
            return
        done.add_done_callback(lambda _: self._own.pop(mark.member, None))

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
        self,
        key: str,
        value: bytes,
        ttl: int,
        *,
        wait: bool = True,
        quota: ClientQuota | None = None,
        ack: bool = True,
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
        if not ack or not self._outbox.up:  # a mark covers it, or Redis is down
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
