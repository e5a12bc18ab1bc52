"""Stream sessions: the chunks of a streamed answer, kept for a client that comes back.

A ``Session`` lives in the replica that runs the call: the producer appends chunks as they are
made, and every connection following it (the first one, or a resumed one) reads them from its
list. Finished sessions stay ``ttl_s`` for recovery, within a memory bound (oldest finished
evicted first; live sessions are bounded by the call's deadline). With ``--redis-url`` every
chunk is also appended, in order, to a Redis list with the same TTL by one writer task, in batches
(``stream_mirror``: everything pending of every session in one round trip); a retry
that lands on another replica replays that list and follows its tail by polling it every
``POLL_S`` (polling, not pub/sub: no connection held per follower, and a follower that starts
late needs the list anyway).

A mirror is whole or absent, never partial (#29.7): once one write of a session fails (a write
that timed out may still run when Redis wakes up) the session is never written again, only
deleted; each list entry carries its position and the done mark the number of entries, so a
reader refuses a list with a gap or an end that does not add up instead of serving it.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import hashlib
import hmac
import os
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import orjson
import structlog
from redis.exceptions import RedisError

from proxy.retained import retained
from proxy.state.redis_client import RedisOptions, redis_client
from proxy.state.stream_mirror import MIRROR_QUEUE_MAX, DropReason, Event, MirrorWriter
from proxy.stream.chunks import kind_of

log = structlog.get_logger("proxy.stream")

SESSION_PREFIX = "sess_"
SESSION_ID_BYTES = 16
"""128 random bits (spec §11.2): unguessable, so a session id is as good as a bearer token
for its own chunks only together with the client key it was started with."""
POLL_S = 0.05
"""How often a follower on another replica reads the Redis list (the latency of its tail)."""
REDIS_INDEX_MAX = 2**63 - 1
"""Redis list indexes are signed 64-bit: a larger one is an error, not an absent chunk."""
_KEY = "cogproxy:stream:{}:{}"

EVENT_OVERHEAD_BYTES = 160
"""Memory a kept chunk takes besides its JSON: the bytes object's header, the (kind, bytes)
tuple, its list slot and allocator rounding (measured with tracemalloc: ~110; the test
``test_the_memory_bound_counts_what_the_sessions_really_hold`` keeps this honest)."""
SESSION_OVERHEAD_BYTES = 2048
"""Memory a session takes before its first chunk: the object, its id, its asyncio.Event and
the hub's indexes (measured: ~1.5 KiB)."""


def event_bytes(event: Event) -> int:
    """What keeping ``event`` costs in memory, as the hub's bound counts it."""
    return len(event[1]) + EVENT_OVERHEAD_BYTES


@functools.lru_cache(maxsize=1024)  # a few identities (the keys file's): hashed once each
def client_hash(client: str) -> str:
    """What a session stores of its client's identity (``proxy.clients``' rule): its SHA-256."""
    return hashlib.sha256(client.encode("utf-8")).hexdigest()


def new_session_id() -> str:
    # os.urandom is what secrets.token_hex reads, without its two Python frames
    return SESSION_PREFIX + os.urandom(SESSION_ID_BYTES).hex()


def is_session_id(value: Any) -> bool:
    return (
        isinstance(value, str)
        and value.startswith(SESSION_PREFIX)
        and len(value) == len(SESSION_PREFIX) + 2 * SESSION_ID_BYTES
        and all(c in "0123456789abcdef" for c in value[len(SESSION_PREFIX) :])
    )


class Source(Protocol):
    """Where a connection reads a session's chunks from."""

    async def read(self, index: int, timeout: float) -> tuple[list[Event], bool]:
        """Chunks from position ``index`` on (waiting up to ``timeout`` for one) and whether
        the session is finished."""
        ...


@dataclass(eq=False)
class Session:
    id: str
    client: str
    module: str
    ttl_s: float
    events: list[Event] = field(default_factory=list)
    size: int = SESSION_OVERHEAD_BYTES
    """What the session holds in memory: its chunks and its bookkeeping (``event_bytes``)."""
    done: bool = False
    expires: float = 0.0
    _waiters: list[asyncio.Future[None]] = field(default_factory=list)
    """The readers waiting for the next chunk (a future each: no event object per chunk)."""
    on_event: Callable[[Session, Event | None], None] | None = None
    mirror_lost: bool = False
    """A write to the Redis mirror failed (or was dropped): it is deleted, never written again."""

    def append(self, chunk: dict[str, Any]) -> None:
        event: Event = (kind_of(chunk), retained(orjson.dumps(chunk)))
        self.events.append(event)
        self.size += event_bytes(event)
        self._notify(event)

    def finish(self) -> None:
        if not self.done:
            self.done = True
            self.expires = time.monotonic() + self.ttl_s
            self._notify(None)

    def _notify(self, event: Event | None) -> None:
        if self._waiters:
            waiters, self._waiters = self._waiters, []
            for waiter in waiters:
                if not waiter.done():
                    waiter.set_result(None)
        if self.on_event is not None:
            self.on_event(self, event)

    async def read(self, index: int, timeout: float) -> tuple[list[Event], bool]:
        if index >= len(self.events) and not self.done:
            waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            self._waiters.append(waiter)
            # ``asyncio.timeout``, not ``wait_for`` (a task of its own): the reader runs on the
            # loop's next turn after an append, so a producer that yields once lets it write (#35).
            try:
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(timeout):
                        await waiter
            finally:
                if waiter.cancelled() and waiter in self._waiters:  # timed out, or the reader left
                    self._waiters.remove(waiter)
        return self.events[index:], self.done

    def chunk_at(self, seq: int) -> dict[str, Any] | None:
        if not 1 <= seq <= len(self.events):
            return None
        value: dict[str, Any] = orjson.loads(self.events[seq - 1][1])
        return value


class MirrorGap(Exception):
    """The Redis copy of a session is not whole (a write was lost): it is not served."""


class RedisSource:
    """A session another replica runs, read from Redis; raises ``MirrorGap`` rather than serve a
    copy with a hole, a foreign entry or a done mark that does not add up."""

    def __init__(self, redis: Any, session_id: str) -> None:
        self._redis = redis
        self._events = _KEY.format(session_id, "events")
        self._info = _KEY.format(session_id, "info")

    async def read(self, index: int, timeout: float) -> tuple[list[Event], bool]:
        deadline = time.monotonic() + timeout
        while True:
            client, done, count = await self._redis.hmget(self._info, ["client", "done", "count"])
            raw = await self._redis.lrange(self._events, index, -1)
            if client is None:
                raise MirrorGap("the session is no longer in Redis")
            events = [_decode(item, index + offset) for offset, item in enumerate(raw)]
            finished = done == b"1"
            if finished and count != str(index + len(events)).encode():  # as the writer spells it
                raise MirrorGap(f"marked done with {count!r} chunks, {index + len(events)} stored")
            if events or finished or time.monotonic() >= deadline:
                return events, finished
            await asyncio.sleep(min(POLL_S, max(0.0, deadline - time.monotonic())))

    async def chunk_at(self, seq: int) -> dict[str, Any] | None:
        if not 1 <= seq <= REDIS_INDEX_MAX:
            return None  # a seq no list can hold: the session never had it
        raw = await self._redis.lindex(self._events, seq - 1)
        if raw is None:
            return None
        value: dict[str, Any] = orjson.loads(_decode(raw, seq - 1)[1])
        return value

    async def whole(self) -> bool:
        """Whether the copy so far has no gap (a finished one: all of it)."""
        try:
            await self.read(0, 0.0)
        except MirrorGap:
            return False
        return True


def _decode(raw: bytes, index: int) -> Event:
    """An entry written by ``stream_mirror.encode_entry``, which must be the one of position ``index``."""
    stored, _, rest = raw.partition(b" ")
    if stored != b"%d" % index:
        raise MirrorGap(f"position {index} holds entry {stored[:20]!r}")
    kind, _, payload = rest.partition(b" ")
    return kind.decode(), payload  # type: ignore[return-value]  # written by encode_entry


@dataclass(frozen=True, slots=True)
class Found:
    """A session a recovery request named."""

    client: str
    module: str
    source: Source
    chunk_at: Callable[[int], Awaitable[dict[str, Any] | None]]


class SessionHub:
    """The sessions of this replica, their producer tasks, and the Redis mirror."""

    def __init__(
        self,
        *,
        ttl_s: float,
        max_bytes: int,
        redis: RedisOptions | None = None,
        mirror_max_pending: int = MIRROR_QUEUE_MAX,
        on_mirror_drop: Callable[[DropReason], None] = lambda reason: None,
    ) -> None:
        """``on_mirror_drop``: a session left the Redis copy (not resumable on another replica)."""
        self.ttl_s = ttl_s
        self.max_bytes = max_bytes
        self._sessions: dict[str, Session] = {}
        self._finished: OrderedDict[str, Session] = OrderedDict()
        """Finished sessions in the order they finished: the order they expire in (one TTL)."""
        self._finished_of: dict[str, OrderedDict[str, Session]] = {}
        """client -> its finished sessions, oldest first (what the memory bound evicts)."""
        self._held: dict[str, int] = {}
        """client -> the bytes of its sessions, live ones included."""
        self._used = 0
        self.tasks: set[asyncio.Task[Any]] = set()
        self._redis: Any = redis_client(redis, "streams") if redis is not None else None
        self._mirror: MirrorWriter | None = None
        if self._redis is not None:
            self._mirror = MirrorWriter(
                self._redis,
                ttl_s=ttl_s,
                keys=lambda sid: (_KEY.format(sid, "info"), _KEY.format(sid, "events")),
                max_pending=mirror_max_pending,
                on_drop=on_mirror_drop,
            )

    @property
    def live(self) -> int:
        return len(self._sessions) - len(self._finished)

    @property
    def used_bytes(self) -> int:
        return self._used

    def create(self, client: str, module: str) -> Session:
        """A session of ``client`` (an identity, never a key)."""
        self._purge()
        session = Session(new_session_id(), client_hash(client), module, self.ttl_s)
        session.on_event = self._on_event
        self._sessions[session.id] = session
        self._add(session.client, session.size)
        if self._used > self.max_bytes:
            self._evict()
        if self._mirror is not None:
            self._mirror.changed(session, appended=False)
        return session

    def spawn(self, work: Awaitable[Any]) -> asyncio.Task[Any]:
        """Run a producer that outlives the connection that started it."""
        task = asyncio.ensure_future(work)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)
        return task

    async def find(self, session_id: str) -> Found | None:
        self._purge()
        local = self._sessions.get(session_id)
        if local is not None:

            async def local_chunk(seq: int) -> dict[str, Any] | None:
                return local.chunk_at(seq)

            return Found(local.client, local.module, local, local_chunk)
        if self._redis is None or not is_session_id(session_id):
            return None
        try:
            client, module = await self._redis.hmget(_KEY.format(session_id, "info"), ["client", "module"])
        except (RedisError, OSError) as exc:
            log.warning("proxy.stream_recovery_lookup_failed", error=str(exc))
            return None
        if client is None or module is None:
            return None
        source = RedisSource(self._redis, session_id)
        try:
            whole = await source.whole()
        except (RedisError, OSError) as exc:
            log.warning("proxy.stream_recovery_lookup_failed", error=str(exc))
            return None
        if not whole:  # a write was lost: as good as unknown (the retry starts a new stream)
            log.warning("proxy.stream_recovery_gap", session=session_id[:12])
            return None
        return Found(client.decode(), module.decode(), source, source.chunk_at)

    @staticmethod
    def same_client(stored: str, client: str) -> bool:
        return hmac.compare_digest(stored, client_hash(client))

    def _on_event(self, session: Session, event: Event | None) -> None:
        if event is not None:
            self._add(session.client, event_bytes(event))
        elif session.id in self._sessions:  # finished (and not already dropped)
            self._finished[session.id] = session
            self._finished_of.setdefault(session.client, OrderedDict())[session.id] = session
        if self._used > self.max_bytes:
            self._evict()
        if self._mirror is not None:
            self._mirror.changed(session, appended=event is not None)

    def _add(self, client: str, size: int) -> None:
        self._used += size
        self._held[client] = self._held.get(client, 0) + size

    def _purge(self) -> None:
        """Drop expired sessions: the oldest finished first, so only the expired ones are read."""
        now = time.monotonic()
        while self._finished:
            oldest = next(iter(self._finished.values()))
            if oldest.expires > now:
                return
            self._drop(oldest)

    def _evict(self) -> None:
        """Finished sessions until the bound holds again: the oldest of the client holding the
        most bytes (live sessions counted) first, so one client's streams never cost another
        client its recovery (issue #26 attack pass). Clients are the keys file's: few."""
        while self._used > self.max_bytes and self._finished_of:
            heaviest = max(self._finished_of, key=lambda client: self._held.get(client, 0))
            self._drop(next(iter(self._finished_of[heaviest].values())))

    def _drop(self, session: Session) -> None:
        if self._sessions.pop(session.id, None) is None:
            return
        self._used -= session.size
        held = self._held.get(session.client, 0) - session.size
        if held > 0:
            self._held[session.client] = held
        else:
            self._held.pop(session.client, None)
        if self._finished.pop(session.id, None) is not None:
            mine = self._finished_of[session.client]
            del mine[session.id]
            if not mine:
                del self._finished_of[session.client]

    async def aclose(self) -> None:
        if self.tasks:
            # A task cancelled before its first step never runs its own ``except CancelledError``
            # (the producer's interrupted chunk and the session mark's release): one turn of the
            # loop lets every producer spawned so far start.
            await asyncio.sleep(0)
        for task in list(self.tasks):
            task.cancel()
        if self.tasks:
            await asyncio.gather(*self.tasks, return_exceptions=True)
        if self._mirror is not None:
            await self._mirror.aclose()
        if self._redis is not None:
            await self._redis.aclose()
