"""The Redis copy of stream sessions: one writer task that, per round trip, writes everything
pending of every session in one pipeline (one ``RPUSH`` of its new chunks per session, the
``EXPIRE``\\s, the done mark), so the copy keeps up however many sessions stream at once.

Nothing is copied to wait for Redis: a session's chunks are in its own list already, and the
writer keeps per session how many of them Redis has. What waits is bounded (``max_pending``
chunks); a session whose chunk does not fit, or whose write fails, is lost to the copy (deleted,
never written again: whole or absent, #29.7) — counted through ``on_drop`` and logged once per
episode, never silently.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal, Protocol

import structlog
from redis.exceptions import RedisError

from proxy.stream.chunks import Kind

log = structlog.get_logger("proxy.stream")

MIRROR_QUEUE_MAX = 10_000
"""Chunks waiting for Redis at most; beyond it a session stops being resumable elsewhere."""
MIRROR_DRAIN_S = 2.0
"""At shutdown, how long chunks still waiting for Redis get to be written."""

Event = tuple[Kind, bytes]
DropReason = Literal["behind", "failed"]
"""Why a session left the copy: the chunks waiting for Redis reached the bound, or a write failed."""


class Mirrored(Protocol):
    """What the writer reads of a session (``stream_sessions.Session``)."""

    id: str
    client: str
    module: str
    events: list[Event]
    done: bool
    mirror_lost: bool


def encode_entry(index: int, event: Event) -> bytes:
    """A list entry: its position, the chunk's kind, the chunk (``stream_sessions`` decodes it)."""
    return b"%d %s %s" % (index, event[0].encode(), event[1])


@dataclass(eq=False)
class _Copy:
    """How far one session's Redis copy has got."""

    session: Mirrored
    info: str
    events: str
    written: int = 0
    """Chunks Redis has (the next one's position)."""
    created: bool = False


@dataclass(frozen=True, slots=True)
class _Planned:
    """The commands one session put in a round trip's pipeline."""

    copy: _Copy
    commands: int
    chunks: int
    closes: bool


class MirrorWriter:
    """Copies sessions to Redis in batches; ``changed`` after each chunk, the create and the end."""

    def __init__(
        self,
        redis: Any,
        *,
        ttl_s: float,
        keys: Callable[[str], tuple[str, str]],
        max_pending: int = MIRROR_QUEUE_MAX,
        on_drop: Callable[[DropReason], None] = lambda reason: None,
    ) -> None:
        self._redis = redis
        self._ttl = max(1, int(ttl_s))
        self._keys = keys
        self._max_pending = max_pending
        self._on_drop = on_drop
        self._copies: dict[str, _Copy] = {}
        self._dirty: dict[str, _Copy] = {}
        """Sessions with something to write, in the order they first had it."""
        self._pending = 0
        """Chunks of sessions still copied that Redis does not have yet."""
        self._wake = asyncio.Event()
        self._idle = asyncio.Event()
        self._idle.set()
        self._task: asyncio.Task[None] | None = None
        self._failed_writes = 0
        """Round trips failed since the last one that went through (0: Redis answers)."""
        self._dropped_behind = 0
        """Sessions dropped since the copy fell behind (0: it keeps up). The episode ends when a
        round trip leaves at most half the bound waiting (under load it is never exactly 0)."""

    def changed(self, session: Mirrored, *, appended: bool) -> None:
        copy = self._copies.get(session.id)
        if copy is None:
            copy = self._copies[session.id] = _Copy(session, *self._keys(session.id))
        if appended and not session.mirror_lost:
            self._pending += 1
            if self._pending > self._max_pending:
                self._behind(copy)
        self._dirty.setdefault(session.id, copy)
        self._idle.clear()
        self._wake.set()
        if self._task is None:
            # A context of its own: the writer serves every request, so its lines must not carry
            # the trace id of the request that happened to start it.
            self._task = asyncio.get_running_loop().create_task(self._run(), context=contextvars.Context())

    def _lose(self, copy: _Copy, reason: DropReason) -> None:
        session = copy.session
        if session.mirror_lost:
            return
        session.mirror_lost = True
        self._pending -= len(session.events) - copy.written
        self._on_drop(reason)

    def _behind(self, copy: _Copy) -> None:
        """One warning per episode (the first session dropped); ``_caught_up`` ends it."""
        if self._dropped_behind == 0:
            log.warning(
                "proxy.stream_mirror_behind",
                pending=self._pending - 1,
                session=copy.session.id[:12],
                note="sessions dropped from the Redis copy are not resumable on another replica",
            )
        self._dropped_behind += 1
        self._lose(copy, "behind")

    async def _run(self) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            batch, self._dirty = list(self._dirty.values()), {}
            await self._write(batch)
            if not self._dirty:
                self._idle.set()

    async def _write(self, batch: Sequence[_Copy]) -> None:
        pipe = self._redis.pipeline(transaction=False)
        planned = [self._plan(pipe, copy) for copy in batch]
        try:
            results = await pipe.execute(raise_on_error=False)
        except (RedisError, OSError) as exc:
            for plan in planned:
                self._failed(plan.copy, exc)
            return
        start = 0
        for plan in planned:
            errors = [r for r in results[start : start + plan.commands] if isinstance(r, Exception)]
            start += plan.commands
            if errors:
                self._failed(plan.copy, errors[0])
            else:
                self._written(plan)

    def _plan(self, pipe: Any, copy: _Copy) -> _Planned:
        """Queue ``copy``'s pending writes on ``pipe``: in order, so Redis applies them in order."""
        session = copy.session
        if session.mirror_lost:
            # Again on each change: a write that timed out may have run after the last delete.
            # Readers refuse what is left meanwhile (positions, count).
            pipe.delete(copy.info, copy.events)
            return _Planned(copy, 1, 0, session.done)
        commands = 0
        if not copy.created:
            pipe.hset(copy.info, mapping={"client": session.client, "module": session.module, "done": "0"})
            commands += 1
        new = session.events[copy.written :]
        if new:
            pipe.rpush(copy.events, *(encode_entry(copy.written + n, e) for n, e in enumerate(new)))
            pipe.expire(copy.events, self._ttl)
            commands += 2
        if session.done:  # the done mark: how many entries there are
            pipe.hset(copy.info, mapping={"done": "1", "count": copy.written + len(new)})
            commands += 1
        pipe.expire(copy.info, self._ttl)
        return _Planned(copy, commands + 1, len(new), session.done)

    def _written(self, plan: _Planned) -> None:
        copy = plan.copy
        if not copy.session.mirror_lost:
            copy.created = True
            copy.written += plan.chunks
            self._pending -= plan.chunks
        if plan.closes:
            self._copies.pop(copy.session.id, None)
        if self._failed_writes:
            log.info("proxy.stream_mirror_recovered", failed_writes=self._failed_writes)
            self._failed_writes = 0
        if self._dropped_behind and self._pending <= self._max_pending // 2:
            log.info("proxy.stream_mirror_caught_up", dropped_sessions=self._dropped_behind)
            self._dropped_behind = 0

    def _failed(self, copy: _Copy, exc: Exception) -> None:
        """One warning per outage (the first failed write), not one per session or chunk."""
        if self._failed_writes == 0:
            log.warning("proxy.stream_mirror_failed", session=copy.session.id[:12], error=str(exc))
        self._failed_writes += 1
        self._lose(copy, "failed")
        if copy.session.done:
            self._copies.pop(copy.session.id, None)

    async def aclose(self) -> None:
        """Write what is pending (for up to ``MIRROR_DRAIN_S``), then stop."""
        if self._task is None:
            return
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._idle.wait(), MIRROR_DRAIN_S)
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task
