"""The Redis outbox: every record the proxy writes to Redis (review stream entries, stored
context) goes through it, so a Redis outage delays records instead of losing them.

* ``put`` never waits: the write joins a bounded in-memory queue (``DEFAULT_OUTBOX_BOUND``); when
  the queue is full the new write is dropped and counted (``on_drop``).
* With a spool directory each write is also appended to ``outbox.jsonl`` there (flushed to the
  OS on every append, so a killed process loses nothing; fsync'ed on truncation and shutdown, so
  a host crash can lose the appends of the last moments). On start the spool is replayed.
* One background task sends the queue in order and pops a write once Redis acknowledged it. While
  Redis fails it retries with backoff (``RETRY_MIN_S`` doubling to ``RETRY_MAX_S``); while idle it
  pings Redis every ``PING_INTERVAL_S`` so ``up`` (the ``cognitive_redis_up`` gauge) is current.
* A ``KeyWrite`` (a context item: SET with optional expiry) is idempotent; ``put_key`` returns a
  future that completes once Redis has it, so a request can wait briefly for read-your-writes.
* Delivery of stream entries is at least once, made exactly once where it can be: each carries an
  ``outbox_id`` field; after an ambiguous failure (a timeout: Redis may have applied it) and after
  a replay, the stream's newest entries are checked for the head's id before it is sent again.

Breaker state is not here: it is state, not records, and falls back to local memory instead
(``proxy.state.redis_store``).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import uuid
from collections import deque
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import IO, Any

import orjson
import redis.asyncio as aioredis
import structlog
from redis.exceptions import RedisError, ResponseError
from redis.exceptions import TimeoutError as RedisTimeout

log = structlog.get_logger("proxy.outbox")

# At the default review.maxlen (10,000) a longer backlog would be trimmed from the stream anyway.
DEFAULT_OUTBOX_BOUND = 10_000
OUTBOX_OP_TIMEOUT_S = 1.0
RETRY_MIN_S = 0.1
RETRY_MAX_S = 2.0
PING_INTERVAL_S = 1.0
# Entries of the stream searched for a write that may already be there (replicas share the stream).
DEDUP_SCAN = 200
SPOOL_FILE = "outbox.jsonl"
QUOTA_PREFIX = "cogproxy:ctxquota:"
"""Per owner: ``<owner>:keys`` (a sorted set of its keys by write order) and ``<owner>:sizes``
(a hash of their sizes, with the running total under ``#total``). A key that expired stays
counted until it is the owner's oldest: the quota then bounds it as well."""
_QUOTA_SET = """
local key, idx, sizes = KEYS[1], KEYS[2], KEYS[3]
local value, ttl, max_n, max_b = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
if ttl > 0 then redis.call('SET', key, value, 'EX', ttl) else redis.call('SET', key, value) end
local old = tonumber(redis.call('HGET', sizes, key) or '0')
local seq = redis.call('HINCRBY', sizes, '#seq', 1)
redis.call('ZADD', idx, seq, key)
redis.call('HSET', sizes, key, #value)
local total = redis.call('HINCRBY', sizes, '#total', #value - old)
local n = redis.call('ZCARD', idx)
local evicted = 0
while n > max_n or total > max_b do
  local oldest = redis.call('ZRANGE', idx, 0, 0)[1]
  if oldest == nil or oldest == key then break end
  local size = tonumber(redis.call('HGET', sizes, oldest) or '0')
  redis.call('ZREM', idx, oldest)
  redis.call('HDEL', sizes, oldest)
  total = redis.call('HINCRBY', sizes, '#total', -size)
  evicted = evicted + redis.call('DEL', oldest)
  n = n - 1
end
return evicted
"""


@dataclass(frozen=True, slots=True)
class StreamWrite:
    """One XADD: ``fields`` to ``stream`` with approximate ``maxlen``."""

    stream: str
    fields: dict[str, str]
    maxlen: int
    id: str = ""

    def with_id(self) -> StreamWrite:
        return self if self.id else StreamWrite(self.stream, self.fields, self.maxlen, uuid.uuid4().hex)


@dataclass(frozen=True, slots=True)
class KeyWrite:
    """One SET: ``value`` at ``key``, expiring after ``ttl`` seconds (None: never). With an
    ``owner`` (a client namespace) the write is counted against its quota in the same script:
    past ``max_entries`` or ``max_bytes`` the owner's oldest keys are deleted (``QUOTA_PREFIX``)."""

    key: str
    value: str
    ttl: int | None
    id: str = ""
    owner: str = ""
    max_entries: int = 0
    max_bytes: int = 0

    def with_id(self) -> KeyWrite:
        return self if self.id else replace(self, id=uuid.uuid4().hex)


Write = StreamWrite | KeyWrite


def spool_dir_of(base: Path, slot: int | None) -> Path:
    """The ``--spool-dir`` of worker ``slot`` of ``serve --workers`` (slot 0 and a single process
    use ``base`` itself): two processes appending to and truncating one file would lose records."""
    return base if not slot else base / f"worker-{slot}"


def adopt_spools(base: Path, workers: int) -> None:
    """Append the spools of slots this run has no worker for (``--workers`` went down) to slot
    0's, which replays them. Called before any process of this run opens a spool."""
    for directory in sorted(base.glob("worker-*")):
        slot = directory.name.removeprefix("worker-")
        if not slot.isdigit() or int(slot) < workers:
            continue
        spool, target = directory / SPOOL_FILE, base / SPOOL_FILE
        if spool.exists():
            with target.open("ab") as out:
                if out.tell() and not target.read_bytes().endswith(b"\n"):
                    out.write(b"\n")  # a torn last append stays its own (skipped) line
                out.write(spool.read_bytes())
            log.info("proxy.outbox_spool_adopted", source=str(spool), target=str(target))
        shutil.rmtree(directory)


def _from_spool(raw: dict[str, Any]) -> Write:
    if "key" in raw:
        ttl = raw["ttl"]
        return KeyWrite(
            str(raw["key"]),
            str(raw["value"]),
            None if ttl is None else int(ttl),
            raw["id"],
            str(raw.get("owner", "")),
            int(raw.get("max_entries", 0)),
            int(raw.get("max_bytes", 0)),
        )
    return StreamWrite(raw["stream"], dict(raw["fields"]), int(raw["maxlen"]), raw["id"])


class _Spool:
    """The append-only file mirroring the queue."""

    def __init__(self, directory: Path) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        self.path = directory / SPOOL_FILE
        self._file: IO[bytes] = self.path.open("ab")

    def replay(self) -> list[Write]:
        writes = []
        for line in self.path.read_bytes().splitlines():
            try:
                writes.append(_from_spool(orjson.loads(line)))
            except (orjson.JSONDecodeError, KeyError, TypeError, ValueError):
                log.warning("proxy.outbox_spool_line_skipped", path=str(self.path))  # a torn last append
        return writes

    def append(self, write: Write) -> None:
        self._file.write(orjson.dumps(asdict(write)) + b"\n")
        self._file.flush()

    def rewrite(self, writes: deque[Write]) -> None:
        """Keep only ``writes`` (the undelivered ones)."""
        tmp = self.path.with_suffix(".tmp")
        with tmp.open("wb") as out:
            out.writelines(orjson.dumps(asdict(w)) + b"\n" for w in writes)
            out.flush()
            os.fsync(out.fileno())
        self._file.close()
        tmp.replace(self.path)
        self._file = self.path.open("ab")

    def close(self) -> None:
        self._file.flush()
        os.fsync(self._file.fileno())
        self._file.close()


class RedisOutbox:
    def __init__(
        self,
        redis_url: str,
        *,
        bound: int = DEFAULT_OUTBOX_BOUND,
        spool_dir: Path | None = None,
        on_drop: Callable[[Write], None] = lambda write: None,
        on_first_failure: Callable[[Write], None] = lambda write: None,
        on_evict: Callable[[int], None] = lambda count: None,
    ) -> None:
        self._redis: Any = aioredis.Redis.from_url(
            redis_url,
            socket_timeout=OUTBOX_OP_TIMEOUT_S,
            socket_connect_timeout=OUTBOX_OP_TIMEOUT_S,
            decode_responses=True,
        )
        self._bound = bound
        self._queue: deque[Write] = deque()
        self._waiters: dict[str, asyncio.Future[bool]] = {}
        self._spool = _Spool(spool_dir) if spool_dir is not None else None
        self._delivered_since_rewrite = 0
        self._on_drop = on_drop
        self._on_first_failure = on_first_failure
        self._on_evict = on_evict
        self._quota_set = self._redis.register_script(_QUOTA_SET)
        self._failed_head: str | None = None
        self._uncertain = False
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self.up = True
        if self._spool is not None:
            replayed = self._spool.replay()
            self._queue.extend(replayed[: self._bound])
            self._uncertain = bool(replayed)  # some may have been delivered before the restart
            if replayed:
                log.info("proxy.outbox_replayed", writes=len(self._queue), path=str(self._spool.path))

    def __len__(self) -> int:
        return len(self._queue)

    def put(self, write: Write) -> bool:
        """Queue ``write`` for delivery; False (and ``on_drop``) when the outbox is full."""
        return self._enqueue(write) is not None

    def put_key(self, write: KeyWrite) -> asyncio.Future[bool] | None:
        """Queue ``write``; the future completes (True) once Redis acknowledged it, or False when
        Redis refused it. None (and ``on_drop``) when the outbox is full."""
        queued = self._enqueue(write)
        if queued is None:
            return None
        future: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        self._waiters[queued.id] = future
        return future

    def _enqueue(self, write: Write) -> Write | None:
        if len(self._queue) >= self._bound:
            self._on_drop(write)
            return None
        write = write.with_id()
        self._queue.append(write)
        if self._spool is not None:
            self._spool.append(write)
        self._wake.set()
        return write

    def _settle(self, write: Write, delivered: bool) -> None:
        future = self._waiters.pop(write.id, None)
        if future is not None and not future.done():
            future.set_result(delivered)

    def start(self) -> None:
        self._task = asyncio.create_task(self._run())

    async def _run(self) -> None:
        delay = RETRY_MIN_S
        while True:
            if not self._queue:
                self._wake.clear()
                try:
                    await asyncio.wait_for(self._wake.wait(), PING_INTERVAL_S)
                except TimeoutError:
                    await self._ping()
                continue
            try:
                await self._send_head()
            except ResponseError as exc:  # Redis answered "no" (e.g. the key is not a stream)
                self._refused(exc)
                continue
            except (RedisError, OSError) as exc:
                self._uncertain = self._uncertain or isinstance(exc, (RedisTimeout, TimeoutError))
                self._down(exc)
                await asyncio.sleep(delay)
                delay = min(delay * 2, RETRY_MAX_S)
                continue
            delay = RETRY_MIN_S
            self._delivered()

    async def _send_head(self) -> None:
        head = self._queue[0]
        if isinstance(head, KeyWrite):  # idempotent: resending after an ambiguous failure is safe
            if not head.owner:
                await self._redis.set(head.key, head.value, ex=head.ttl)
                return
            base = QUOTA_PREFIX + head.owner
            evicted = await self._quota_set(
                keys=[head.key, base + ":keys", base + ":sizes"],
                args=[head.value, head.ttl or -1, head.max_entries, head.max_bytes],
            )
            if evicted:
                self._on_evict(int(evicted))
            return
        if self._uncertain:
            newest = await self._redis.xrevrange(head.stream, count=DEDUP_SCAN)
            self._uncertain = False
            if any(fields.get("outbox_id") == head.id for _, fields in newest):
                self._uncertain = True  # the next write may be there too
                return
        await self._redis.xadd(
            head.stream, {**head.fields, "outbox_id": head.id}, maxlen=head.maxlen, approximate=True
        )

    def _delivered(self, ok: bool = True) -> None:
        self._settle(self._queue.popleft(), ok)
        if not self.up:
            log.info("proxy.redis_available", pending=len(self._queue))
        self.up = True
        if self._spool is None:
            return
        self._delivered_since_rewrite += 1
        if not self._queue or self._delivered_since_rewrite >= self._bound:
            self._spool.rewrite(self._queue)  # the file never holds more than ~2 bounds
            self._delivered_since_rewrite = 0

    def _refused(self, exc: ResponseError) -> None:
        """Redis is up but refuses the head: resending cannot help and would block every write
        behind it, so it is dropped (and counted)."""
        head = self._queue[0]
        where = head.stream if isinstance(head, StreamWrite) else head.key
        log.error("proxy.outbox_write_refused", target=where, error=str(exc), outbox_id=head.id)
        self._on_drop(head)
        self._delivered(ok=False)

    def _down(self, exc: Exception) -> None:
        head = self._queue[0] if self._queue else None
        if head is not None and head.id != self._failed_head:
            self._failed_head = head.id
            self._on_first_failure(head)
        if self.up:
            log.warning(
                "proxy.redis_unavailable", error=str(exc) or type(exc).__name__, pending=len(self._queue)
            )
        self.up = False

    async def _ping(self) -> None:
        try:
            await self._redis.ping()
        except (RedisError, OSError) as exc:
            self._down(exc)
        else:
            if not self.up:
                log.info("proxy.redis_available", pending=len(self._queue))
            self.up = True

    async def aclose(self, timeout: float = 2.0) -> None:
        """Try to deliver what is queued for up to ``timeout``; the spool keeps the rest."""
        if self._task is not None:
            deadline = asyncio.get_running_loop().time() + timeout
            while self._queue and self.up and asyncio.get_running_loop().time() < deadline:
                await asyncio.sleep(0.01)
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        if self._queue and self._spool is None:
            log.error("proxy.outbox_lost_on_shutdown", writes=len(self._queue), hint="set --spool-dir")
        if self._spool is not None:
            self._spool.close()
        await self._redis.aclose()
