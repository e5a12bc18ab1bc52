"""Review sinks: where answers decided ``review`` are recorded. Every record carries the
answer's trace id, so a review tool can send its verdict straight back (``POST /v1/feedback``).
A sink never fails or delays the request: the log sink writes a line; the Redis stream sink
queues an XADD in the Redis outbox (``proxy.state.outbox``: kept and re-sent in order while Redis
is away); the webhook sink POSTs in the background with retries."""

from __future__ import annotations

import asyncio
import random
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from typing import Any, Protocol

import aiohttp
import orjson
import structlog

from proxy.policy.model import Backoff, ReviewPolicy
from proxy.state.outbox import RedisOutbox, StreamWrite

log = structlog.get_logger("proxy.review")

# Between webhook delivery retries: the router's full-jitter backoff, 0.2 s doubling up to 5 s.
WEBHOOK_BACKOFF = Backoff(base_ms=200.0, max_ms=5000.0)


def review_record(
    module: str,
    tier: str,
    trace_id: str,
    decision: str,
    envelope: dict[str, Any],
    client: str,
    answer: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """What every sink records for one answer sent to review; ``client`` is the caller's identity
    (a name or a key hash, never a key), which an admin verdict names when trace ids collide;
    ``answer``: how the answer was decided (rung, target, reported and calibrated confidence,
    the risks, cost), what the review console shows beside the envelope."""
    meta = envelope.get("meta") if isinstance(envelope.get("meta"), dict) else {}
    return {
        "module": module,
        "tier": tier,
        "trace_id": trace_id,
        "client": client,
        "decision": decision,
        "meta": meta,
        "envelope": envelope,
        "recorded_at": time.time(),
        "answer": dict(answer or {}),
    }


class ReviewSink(Protocol):
    async def submit(self, record: dict[str, Any]) -> None:
        """Record ``record``; never raises."""
        ...

    async def aclose(self) -> None: ...


class LogSink:
    async def submit(self, record: dict[str, Any]) -> None:
        log.warning(
            "proxy.review",
            trace_id=record["trace_id"],
            client=record["client"],
            module=record["module"],
            tier=record["tier"],
            confidence=record["meta"].get("confidence"),
            risk=record["meta"].get("risk"),
            explain=record["meta"].get("explain"),
        )

    async def aclose(self) -> None:
        return None


class _Background(ABC):
    """Deliveries run as tasks, so the answer never waits for the sink."""

    def __init__(self, on_failure: Callable[[str], None]) -> None:
        self._tasks: set[asyncio.Task[None]] = set()
        self._on_failure = on_failure

    async def submit(self, record: dict[str, Any]) -> None:
        task = asyncio.create_task(self._deliver(record))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    @abstractmethod
    async def _deliver(self, record: dict[str, Any]) -> None: ...

    async def drain(self, timeout: float = 2.0) -> None:
        """Wait for pending deliveries up to ``timeout``, then cancel the rest."""
        if self._tasks:
            _, pending = await asyncio.wait(set(self._tasks), timeout=timeout)
            for task in pending:
                task.cancel()


class RedisStreamSink:
    """XADD to a stream (approximate MAXLEN) with fields module, tier, trace_id, client, decision,
    meta, envelope, answer (how it was decided: what the review console shows) and the outbox's
    ``outbox_id``, through the app's Redis outbox."""

    def __init__(self, outbox: RedisOutbox, stream: str, maxlen: int) -> None:
        self._outbox = outbox
        self._stream = stream
        self._maxlen = maxlen

    async def submit(self, record: dict[str, Any]) -> None:
        fields = {
            "module": record["module"],
            "tier": record["tier"],
            "trace_id": record["trace_id"],
            "client": record["client"],
            "decision": record["decision"],
            "meta": orjson.dumps(record["meta"]).decode(),
            "envelope": orjson.dumps(record["envelope"]).decode(),
            "answer": orjson.dumps(record["answer"]).decode(),
        }
        if not self._outbox.put(StreamWrite(self._stream, fields, self._maxlen)):
            log.error(
                "proxy.review_dropped", sink="redis-stream", reason="outbox full", trace_id=record["trace_id"]
            )
            await LogSink().submit(record)  # not in the stream, but not lost: it is in the log

    async def aclose(self) -> None:
        return None  # the outbox belongs to the app and outlives a reload


class WebhookSink(_Background):
    """POST the record as JSON; retried in the background with the router's backoff (``Backoff.wait_s``)."""

    def __init__(
        self,
        session: aiohttp.ClientSession,
        url: str,
        timeout_s: float,
        retries: int,
        on_failure: Callable[[str], None],
    ) -> None:
        super().__init__(on_failure)
        self._session = session
        self._url = url
        self._timeout = aiohttp.ClientTimeout(total=timeout_s)
        self._retries = retries

    async def _deliver(self, record: dict[str, Any]) -> None:
        body = orjson.dumps(record)
        for attempt in range(self._retries + 1):
            try:
                async with self._session.post(
                    self._url, data=body, timeout=self._timeout, headers={"Content-Type": "application/json"}
                ) as resp:
                    if resp.status < 400:
                        return
                    error = f"status {resp.status}"
            except (aiohttp.ClientError, TimeoutError) as exc:
                error = str(exc) or type(exc).__name__
            if attempt < self._retries:
                await asyncio.sleep(WEBHOOK_BACKOFF.wait_s(attempt, random.random))
        log.error("proxy.review_sink_failed", sink="webhook", error=error, trace_id=record["trace_id"])
        self._on_failure("webhook")
        await LogSink().submit(record)

    async def aclose(self) -> None:
        await self.drain()


def build_sink(
    policy: ReviewPolicy,
    session: aiohttp.ClientSession,
    outbox: RedisOutbox | None,
    on_failure: Callable[[str], None] = lambda sink: None,
) -> ReviewSink:
    """The sink the policy names; ``on_failure(sink)`` is called for each webhook record not
    delivered (the outbox counts the redis-stream ones)."""
    if policy.sink == "redis-stream":
        if outbox is None:
            log.error(
                "proxy.review_sink_unconfigured", sink="redis-stream", reason="no --redis-url; using log"
            )
            return LogSink()
        return RedisStreamSink(outbox, policy.stream, policy.maxlen)
    if policy.sink == "webhook" and policy.url:
        return WebhookSink(session, policy.url, policy.timeout_s, policy.retries, on_failure)
    return LogSink()


class QueueingSink:
    """``sink``, and every record also in the review console's in-process queue (``queue(record)``):
    for every sink but the Redis stream, which the console reads itself."""

    def __init__(self, sink: ReviewSink, queue: Callable[[dict[str, Any]], None]) -> None:
        self.sink = sink
        self._queue = queue

    async def submit(self, record: dict[str, Any]) -> None:
        self._queue(record)
        await self.sink.submit(record)

    async def aclose(self) -> None:
        await self.sink.aclose()
