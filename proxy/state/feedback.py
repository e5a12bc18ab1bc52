"""Module answers remembered for ``POST /v1/feedback``, and the verdicts they received.

* ``MemoryFeedbackStore``: an LRU bounded by ``feedback.max_entries`` and by time
  (``feedback.window_s``, read against an injected clock).
* ``RedisFeedbackStore``: the same memory LRU in front (this replica's answers are found without a
  round trip, and survive a Redis outage) plus one Redis key per answer,
  ``cogproxy:feedback:<trace id>``, expiring with the window, so a verdict can reach any replica.
  Writes never wait: they join a bounded queue that one background task sends in pipelines,
  retried with backoff while Redis is away (the oldest are dropped past ``WRITE_QUEUE_BOUND``).

A record keeps a SHA-256 of the client key that made the call, never the key.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import OrderedDict, deque
from collections.abc import AsyncIterator, Callable
from dataclasses import asdict, dataclass, replace
from typing import Any, Protocol

import orjson
import redis.asyncio as aioredis
import structlog
from redis.exceptions import RedisError

log = structlog.get_logger("proxy.feedback")

KEY_PREFIX = "cogproxy:feedback:"
# Answers in the last seconds of an outage: enough for ~10 s at 1,000 module calls/s.
WRITE_QUEUE_BOUND = 10_000
WRITE_BATCH = 500
"""Writes per pipeline: one round trip per batch."""
REDIS_OP_TIMEOUT_S = 0.25
RETRY_MIN_S = 0.1
RETRY_MAX_S = 2.0
SCAN_COUNT = 1000

Clock = Callable[[], float]


@dataclass(frozen=True, slots=True)
class AnswerRecord:
    """One module answer as feedback needs it, and its latest verdict."""

    trace_id: str
    module: str
    tier: str
    rung: str
    provider: str
    model: str
    confidence: float
    """Reported by the model."""
    calibrated: float
    """Through the target's calibration map: what was decided on."""
    risk: str
    decision: str
    min_confidence: float
    """The threshold the answer was decided against (its module's tier, overrides applied)."""
    at: float
    """Epoch seconds of the answer."""
    expires: float
    key_hash: str | None = None
    verdict: str | None = None
    score: float | None = None
    """Correctness in [0, 1]: the verdict's (1, 0, 0.5 for partially_correct) unless given."""
    source: str | None = None
    note: str | None = None
    verdicts: int = 0
    """How many verdicts it received (the latest replaces the others)."""

    def dumps(self) -> bytes:
        return orjson.dumps(asdict(self))

    @classmethod
    def loads(cls, raw: bytes | str) -> AnswerRecord:
        return cls(**orjson.loads(raw))


class FeedbackStore(Protocol):
    def remember(self, record: AnswerRecord, max_entries: int) -> None:
        """Keep ``record`` until ``record.expires`` (never waits, never raises)."""
        ...

    async def get(self, trace_id: str) -> AnswerRecord | None:
        """The record of ``trace_id``; None when unknown or expired."""
        ...

    async def judged(self, record: AnswerRecord) -> None:
        """Store ``record`` (with its new verdict) in place of the old one, same expiry."""
        ...

    async def aclose(self) -> None: ...


class MemoryFeedbackStore:
    """Bounded LRU in process; expiry read against ``clock`` (epoch seconds)."""

    def __init__(self, clock: Clock = time.time) -> None:
        self._clock = clock
        self._records: OrderedDict[str, AnswerRecord] = OrderedDict()

    def __len__(self) -> int:
        return len(self._records)

    def remember(self, record: AnswerRecord, max_entries: int) -> None:
        records = self._records
        records[record.trace_id] = record
        records.move_to_end(record.trace_id)
        while len(records) > max_entries:
            records.popitem(last=False)

    async def get(self, trace_id: str) -> AnswerRecord | None:
        return self.peek(trace_id)

    def peek(self, trace_id: str) -> AnswerRecord | None:
        record = self._records.get(trace_id)
        if record is not None and record.expires <= self._clock():
            del self._records[trace_id]
            return None
        return record

    async def judged(self, record: AnswerRecord) -> None:
        if record.trace_id in self._records:
            self._records[record.trace_id] = record

    def records(self) -> list[AnswerRecord]:
        now = self._clock()
        return [r for r in self._records.values() if r.expires > now]

    async def aclose(self) -> None:
        return None


class RedisFeedbackStore:
    """The memory LRU in front of Redis keys that expire with the window."""

    def __init__(self, url: str, clock: Clock = time.time) -> None:
        self._redis: Any = aioredis.Redis.from_url(
            url, socket_timeout=REDIS_OP_TIMEOUT_S, socket_connect_timeout=REDIS_OP_TIMEOUT_S
        )
        self._clock = clock
        self._local = MemoryFeedbackStore(clock)
        self._queue: deque[AnswerRecord] = deque(maxlen=WRITE_QUEUE_BOUND)
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._run())

    @property
    def pending(self) -> int:
        return len(self._queue)

    def remember(self, record: AnswerRecord, max_entries: int) -> None:
        self._local.remember(record, max_entries)
        self._queue.append(record)
        self._wake.set()

    async def get(self, trace_id: str) -> AnswerRecord | None:
        record = self._local.peek(trace_id)
        if record is not None:
            return record
        try:
            raw = await self._redis.get(KEY_PREFIX + trace_id)
        except (RedisError, OSError) as exc:
            log.warning("proxy.redis_unavailable", error=str(exc), store="feedback")
            return None
        if raw is None:
            return None
        try:
            found = AnswerRecord.loads(raw)
        except (orjson.JSONDecodeError, TypeError):  # written by another version: not judgeable here
            return None
        return found if found.expires > self._clock() else None

    async def judged(self, record: AnswerRecord) -> None:
        await self._local.judged(record)
        self._queue.append(record)
        self._wake.set()

    async def _run(self) -> None:
        delay = RETRY_MIN_S
        while True:
            if not self._queue:
                self._wake.clear()
                await self._wake.wait()
            batch = [self._queue[i] for i in range(min(WRITE_BATCH, len(self._queue)))]
            now = self._clock()
            try:
                async with self._redis.pipeline(transaction=False) as pipe:
                    for record in batch:
                        ttl_ms = int((record.expires - now) * 1000)
                        if ttl_ms > 0:
                            pipe.set(KEY_PREFIX + record.trace_id, record.dumps(), px=ttl_ms)
                    await pipe.execute()
            except (RedisError, OSError) as exc:
                log.warning("proxy.redis_unavailable", error=str(exc), store="feedback", retry_in_s=delay)
                await asyncio.sleep(delay)
                delay = min(delay * 2, RETRY_MAX_S)
                continue
            delay = RETRY_MIN_S
            for _ in batch:
                if self._queue:
                    self._queue.popleft()

    async def flush(self, timeout: float = 2.0) -> None:
        """Wait until the queue is sent (up to ``timeout``)."""
        deadline = time.monotonic() + timeout
        while self._queue and time.monotonic() < deadline:
            await asyncio.sleep(0.01)

    async def aclose(self) -> None:
        await self.flush()
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        await self._redis.aclose()


async def scan_records(url: str) -> AsyncIterator[AnswerRecord]:
    """Every unexpired record in the Redis at ``url`` (for ``cogproxy calibration``)."""
    client: Any = aioredis.Redis.from_url(url)
    try:
        async for key in client.scan_iter(match=KEY_PREFIX + "*", count=SCAN_COUNT):
            raw = await client.get(key)
            if raw is None:
                continue
            try:
                yield AnswerRecord.loads(raw)
            except (orjson.JSONDecodeError, TypeError):
                log.warning("proxy.feedback_record_skipped", key=str(key))  # not written by this version
    finally:
        await client.aclose()


def with_verdict(
    record: AnswerRecord, verdict: str, score: float, source: str | None, note: str | None
) -> AnswerRecord:
    return replace(
        record, verdict=verdict, score=score, source=source, note=note, verdicts=record.verdicts + 1
    )
