"""The Redis outbox: every record the proxy writes to Redis that must survive an outage or a
crash (review stream entries, stored context, feedback records) goes through it, so a Redis
outage delays records instead of losing them.

* ``put`` never waits: the write joins a bounded in-memory queue (``DEFAULT_OUTBOX_BOUND``); when
  the queue is full the new write is dropped and counted (``on_drop``).
* With a spool directory each write is also appended to a file there, and delivery progress is
  recorded after every batch (``proxy.state.spool``); on start the undelivered writes are replayed.
* One background task sends the queue in order, up to ``BATCH`` writes per pipeline, and pops
  them once Redis acknowledged them. While Redis fails it retries with backoff (``RETRY_MIN_S``
  doubling to ``RETRY_MAX_S``); while idle it pings Redis every ``PING_INTERVAL_S`` so ``up``
  (the ``cognitive_redis_up`` gauge) is current.
* ``put_key`` returns a future that completes once Redis has the write, so a request can wait
  briefly for read-your-writes.

Exactly once: each write has an id ``<run>:<seq>`` (a random id per outbox, a sequence number in
queue order) and is applied by a Lua script that first reads ``MARK_PREFIX<run>`` (the highest
sequence number of that run Redis applied) and does nothing when the write is not newer, then
applies it and raises the mark, atomically. A resend after a timeout, or a replay after a crash
between Redis's answer and the spool's offset, is therefore skipped. Marks expire ``MARK_TTL_S``
after a run's last write: a spool replayed later than that can deliver its last batch twice.

In a Redis Cluster a script's keys must share a slot, so a run has a mark per slot it writes to
(``mark_key``: ``MARK_PREFIX<run>:{<tag of the target's slot>}``), each raised by the writes to
that slot. Exactly once still holds: the writes to one slot go to one master in queue order (their
sequence numbers rise), a write is skipped only when its own slot's mark reached it, and a write to
another slot never moves that mark. The price is up to 16,384 marks per run instead of one.

Durable (``--redis-durable-replicas N``, ``durable_replicas``): Redis replicates asynchronously,
so a write its master acknowledged is lost if the master dies before a replica got it. With N > 0
each batch ends with ``WAIT N REPLICA_WAIT_MS`` on the connection that carried its writes (in a
cluster one per master the batch wrote to, on that node's pipeline connection), and the batch is
popped only when every WAIT counted N replicas. Otherwise it stays queued (``on_short``) and is
resent after the backoff: the scripts skip what the master has, but a skip still refreshes its
mark's TTL, a write that replicates, so the resend's WAIT covers the original write too (a replica
applies the stream in order). Writes behind an unconfirmed batch wait, as during an outage: sent
ahead, a later write would raise its slot's mark past a held one, and a held write the master then
lost (failed over to a replica without it, restarted empty) would be skipped on resend. A
context write's future completes once the master has it (read-your-writes needs no more): no
request waits for a replica.

Breaker state, limits and stream sessions are not here: they are state, not records (see
docs/configuration.md, ``--spool-dir``).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, replace
from itertools import islice
from pathlib import Path
from typing import Any

import orjson
import structlog
from redis.cluster import PRIMARY
from redis.crc import key_slot
from redis.exceptions import (
    ClusterDownError,
    NoScriptError,
    ReadOnlyError,
    RedisClusterException,
    RedisError,
    ResponseError,
    TryAgainError,
)

from proxy.state.cluster_slots import slot_tag
from proxy.state.redis_client import RedisOptions, redis_client
from proxy.state.redis_cluster_client import ClusterUnavailable
from proxy.state.redis_defaults import DURABLE_REPLICAS
from proxy.state.spool import Spool

log = structlog.get_logger("proxy.outbox")

# At the default review.maxlen (10,000) a longer backlog would be trimmed from the stream anyway.
DEFAULT_OUTBOX_BOUND = 10_000
RETRY_MIN_S = 0.1
RETRY_MAX_S = 2.0
PING_INTERVAL_S = 1.0
REPLICA_WAIT_MS = 500
"""How long a batch's WAIT waits for its replicas: under the outbox's command timeout (1 s)."""
BATCH = 200
"""Writes per pipeline: one round trip each, and one fsync of the spool's offset."""
MARK_PREFIX = "cogproxy:outbox:"
MARK_TTL_S = 7 * 86_400
"""How long Redis remembers a run's mark after its last write (one key per outbox run)."""
SKIPPED = -1
"""What a script returns for a write Redis already had."""
QUOTA_PREFIX = "cogproxy:ctxquota:"
"""Per owner: ``{<owner>}:keys`` (a sorted set of its keys by write order) and ``{<owner>}:sizes``
(a hash of their sizes, with the running total under ``#total``). The owner is the hash tag of
its context keys too (``proxy.context.identity``): the quota script's keys share a slot. A key
that expired stays counted until it is the owner's oldest: the quota then bounds it as well."""

_ONCE = """
local mark, seq = KEYS[1], tonumber(ARGV[1])
if tonumber(redis.call('GET', mark) or '-1') >= seq then
  redis.call('EXPIRE', mark, ARGV[2])
  return -1
end
local result = 0
{body}
redis.call('SET', mark, seq, 'EX', ARGV[2])
return result
"""
"""KEYS[1] the run's mark, ARGV[1] the write's sequence number, ARGV[2] the mark's TTL; the
body's own keys and arguments follow (KEYS[2], ARGV[3]). A skipped write refreshes the mark: a write
that replicates, for the resend's WAIT (the module docstring, Durable)."""
_XADD = "redis.call('XADD', KEYS[2], 'MAXLEN', '~', ARGV[3], '*', unpack(ARGV, 4))"
_SET = """
if tonumber(ARGV[4]) > 0 then redis.call('SET', KEYS[2], ARGV[3], 'EX', ARGV[4])
else redis.call('SET', KEYS[2], ARGV[3]) end
"""
_HSET = "redis.call('HSET', KEYS[2], ARGV[3], ARGV[4]) redis.call('PEXPIREAT', KEYS[2], ARGV[5])"
_ZREM = "redis.call('ZREM', KEYS[2], ARGV[3]) redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', ARGV[4])"
_QUOTA_SET = """
local key, idx, sizes = KEYS[2], KEYS[3], KEYS[4]
local value, ttl, max_n, max_b = ARGV[3], tonumber(ARGV[4]), tonumber(ARGV[5]), tonumber(ARGV[6])
if ttl > 0 then redis.call('SET', key, value, 'EX', ttl) else redis.call('SET', key, value) end
local old = tonumber(redis.call('HGET', sizes, key) or '0')
local order = redis.call('HINCRBY', sizes, '#seq', 1)
redis.call('ZADD', idx, order, key)
redis.call('HSET', sizes, key, #value)
local total = redis.call('HINCRBY', sizes, '#total', #value - old)
local n = redis.call('ZCARD', idx)
while n > max_n or total > max_b do
  local oldest = redis.call('ZRANGE', idx, 0, 0)[1]
  if oldest == nil or oldest == key then break end
  local size = tonumber(redis.call('HGET', sizes, oldest) or '0')
  redis.call('ZREM', idx, oldest)
  redis.call('HDEL', sizes, oldest)
  total = redis.call('HINCRBY', sizes, '#total', -size)
  result = result + redis.call('DEL', oldest)
  n = n - 1
end
"""
SCRIPTS = {
    name: _ONCE.format(body=body)
    for name, body in {"xadd": _XADD, "set": _SET, "hset": _HSET, "quota": _QUOTA_SET, "zrem": _ZREM}.items()
}
"""The Lua of each kind of write, loaded once per connection to Redis and called by its sha."""


@dataclass(frozen=True, slots=True)
class StreamWrite:
    """One XADD: ``fields`` to ``stream`` with approximate ``maxlen``."""

    stream: str
    fields: dict[str, str]
    maxlen: int
    id: str = ""


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


@dataclass(frozen=True, slots=True)
class HashWrite:
    """One HSET of ``field`` in the hash ``key``, which then expires at ``expires_at_ms`` (epoch
    milliseconds, Redis's clock): however late it is delivered, never past its record's window."""

    key: str
    field: str
    value: str
    expires_at_ms: int
    id: str = ""


@dataclass(frozen=True, slots=True)
class MarkDone:
    """One ZREM of ``member`` from the sorted set ``key`` (a session call's pending-write mark,
    ``proxy.context.store.Mark``), with the set's members past ``now_ms`` (dead marks) pruned."""

    key: str
    member: str
    now_ms: int
    id: str = ""


Write = StreamWrite | KeyWrite | HashWrite | MarkDone


def _from_spool(raw: dict[str, Any]) -> Write:
    """A write as ``_to_spool`` wrote it; TypeError (or KeyError, ValueError) for any other shape,
    which Redis would refuse or the delivery task choke on, blocking every write behind it."""
    if "member" in raw:
        return MarkDone(_text(raw, "key"), _text(raw, "member"), int(raw["now_ms"]), _text(raw, "id"))
    if "field" in raw:
        return HashWrite(
            _text(raw, "key"), _text(raw, "field"), _text(raw, "value"), _expires_at_ms(raw), _text(raw, "id")
        )
    if "key" in raw:
        ttl = raw["ttl"]
        return KeyWrite(
            _text(raw, "key"),
            _text(raw, "value"),
            None if ttl is None else int(ttl),
            _text(raw, "id"),
            str(raw.get("owner", "")),
            int(raw.get("max_entries", 0)),
            int(raw.get("max_bytes", 0)),
        )
    fields = raw["fields"]
    if not isinstance(fields, dict) or not all(isinstance(v, str) for v in fields.values()):
        raise TypeError("fields is not an object of strings")
    return StreamWrite(_text(raw, "stream"), fields, int(raw["maxlen"]), _text(raw, "id"))


def _expires_at_ms(raw: dict[str, Any]) -> int:
    """A hash write's expiry; a spool of the previous version holds a TTL counted from delivery."""
    if "ttl_ms" in raw:
        return int(time.time() * 1000) + int(raw["ttl_ms"])
    return int(raw["expires_at_ms"])


def _text(raw: dict[str, Any], name: str) -> str:
    value = raw[name]
    if not isinstance(value, str):
        raise TypeError(f"{name} is not a string")
    return value


def _to_spool(write: Write) -> bytes:
    return orjson.dumps(asdict(write))


def _call_of(write: Write) -> tuple[str, list[str], list[Any]]:
    """(script, keys after the mark, arguments after the sequence number and TTL)."""
    if isinstance(write, StreamWrite):
        pairs = [part for name, value in write.fields.items() for part in (name, value)]
        return "xadd", [write.stream], [write.maxlen, *pairs, "outbox_id", write.id]
    if isinstance(write, HashWrite):
        return "hset", [write.key], [write.field, write.value, write.expires_at_ms]
    if isinstance(write, MarkDone):
        return "zrem", [write.key], [write.member, write.now_ms]
    if not write.owner:
        return "set", [write.key], [write.value, write.ttl or -1]
    base = f"{QUOTA_PREFIX}{{{write.owner}}}"
    keys = [write.key, base + ":keys", base + ":sizes"]
    return "quota", keys, [write.value, write.ttl or -1, write.max_entries, write.max_bytes]


def mark_key(run: str, target: str, *, cluster: bool) -> str:
    """The mark of ``run`` guarding a write to ``target``: one per run, or in a Redis Cluster one
    per run and slot, on ``target``'s slot (the module docstring)."""
    return f"{MARK_PREFIX}{run}:{{{slot_tag(target)}}}" if cluster else MARK_PREFIX + run


def _run_and_seq(write_id: str) -> tuple[str, int]:
    """A write id's run and sequence number (an older version's spool holds bare uuids: each its own run)."""
    run, _, seq = write_id.rpartition(":")
    return (run, int(seq)) if run and seq.isdigit() else (write_id, 0)


OUTAGE_REPLIES = (ClusterDownError, TryAgainError, ReadOnlyError)
"""Error replies that say Redis cannot take writes now, not that it refuses this one: a cluster
without a master for some slot (``CLUSTERDOWN``, failing over), a slot being moved (``TRYAGAIN``),
a demoted primary (``READONLY``). The batch is resent like after a lost connection."""


class RedisOutbox:
    def __init__(
        self,
        redis: RedisOptions,
        *,
        bound: int = DEFAULT_OUTBOX_BOUND,
        spool_dir: Path | None = None,
        on_drop: Callable[[Write], None] = lambda write: None,
        on_first_failure: Callable[[Write], None] = lambda write: None,
        on_evict: Callable[[int], None] = lambda count: None,
        durable_replicas: int = DURABLE_REPLICAS,
        on_short: Callable[[int], None] = lambda acked: None,
    ) -> None:
        self._redis: Any = redis_client(redis, "outbox")
        self._cluster = redis.cluster
        self._bound = bound
        self._queue: deque[Write] = deque()
        self._waiters: dict[str, asyncio.Future[bool]] = {}
        self._spool = Spool(spool_dir) if spool_dir is not None else None
        self._run_id = uuid.uuid4().hex
        self._seq = 0
        self._shas: dict[str, str] = {}
        self._delivered_since_rewrite = 0
        self._on_drop = on_drop
        self._on_first_failure = on_first_failure
        self._on_evict = on_evict
        self._durable_replicas = durable_replicas
        self._on_short = on_short
        self._short = False
        """Whether the last batch's replicas fell short (logged once per episode)."""
        self._reported: set[str] = set()
        """Ids of queued writes whose first failure was reported (bounded by the queue)."""
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self.up = True
        self.failures = 0
        """Delivery attempts failed since Redis last took a batch."""
        if self._spool is not None:
            self._replay(self._spool)

    def _replay(self, spool: Spool) -> None:
        for line in spool.pending():
            try:
                write = _from_spool(orjson.loads(line))
            except (orjson.JSONDecodeError, KeyError, TypeError, ValueError, AttributeError):
                log.warning("proxy.outbox_spool_line_skipped", path=str(spool.path))  # a torn last append
                continue
            if len(self._queue) >= self._bound:
                self._on_drop(write)
                continue
            self._queue.append(write)
        if self._queue:
            log.info("proxy.outbox_replayed", writes=len(self._queue), path=str(spool.path))

    def __len__(self) -> int:
        return len(self._queue)

    def put(self, write: Write) -> bool:
        """Queue ``write`` for delivery; False (and ``on_drop``) when the outbox is full."""
        return self._enqueue(write) is not None

    def put_key(self, write: KeyWrite | MarkDone) -> asyncio.Future[bool] | None:
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
        write = replace(write, id=f"{self._run_id}:{self._seq}")
        self._seq += 1
        self._queue.append(write)
        if self._spool is not None:
            self._spool.append(_to_spool(write))
        self._wake.set()
        return write

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
                await self._send_batch()
            except (RedisError, OSError) as exc:  # the batch is resent: the marks skip what Redis has
                self.failures += 1
                self._down(exc, islice(self._queue, BATCH))
                await asyncio.sleep(delay)
                delay = min(delay * 2, RETRY_MAX_S)
                continue
            self.failures = 0
            if self._short:  # the master has the batch, its replicas not yet: resend after the backoff
                await asyncio.sleep(delay)
                delay = min(delay * 2, RETRY_MAX_S)
                continue
            delay = RETRY_MIN_S

    async def _send_batch(self) -> None:
        batch = list(islice(self._queue, BATCH))
        if not self._shas:
            self._shas = {name: await self._redis.script_load(lua) for name, lua in SCRIPTS.items()}
        nodes = await self._masters_of(batch) if self._durable_replicas and self._cluster else []
        async with self._redis.pipeline(transaction=False) as pipe:
            for write in batch:
                script, keys, args = _call_of(write)
                run, seq = _run_and_seq(write.id)
                mark = mark_key(run, keys[0], cluster=self._cluster)
                # execute_command: a cluster pipeline refuses its evalsha method (scripts without
                # keys have no slot), not the command, which it routes by the keys
                pipe.execute_command(
                    "EVALSHA", self._shas[script], len(keys) + 1, mark, *keys, seq, MARK_TTL_S, *args
                )
            self._queue_waits(pipe, nodes)
            results = await pipe.execute(raise_on_error=False)
        waits = len(results) - len(batch)
        acked = self._acked(results[len(batch) :], nodes)
        results = results[: len(batch)]
        confirmed = acked >= self._durable_replicas
        if waits and not confirmed:
            self._fell_short(acked)
        elif waits and self._short:
            log.info("proxy.outbox_replicas_caught_up", replicas=acked, pending=len(self._queue))
        self._short = bool(waits) and not confirmed
        done: Write | None = None
        count = 0
        outage: Exception | None = None
        for write, result in zip(batch, results, strict=True):
            if isinstance(result, NoScriptError):  # Redis restarted without them: load and resend
                self._shas = {}
                break
            if isinstance(result, Exception) and (
                isinstance(result, OUTAGE_REPLIES) or not isinstance(result, ResponseError)
            ):  # this write and the ones behind it are resent (in order) once Redis takes writes
                outage = result
                break
            if not confirmed:  # the master answered: a waiter may read it; the queue keeps it
                self._settle(write, not isinstance(result, ResponseError))
                self._answered()
                continue
            if isinstance(result, ResponseError):  # Redis answered "no" (e.g. the key is not a stream)
                self._refused(write, result)
            else:
                self._delivered(write, int(result))
            done, count = write, count + 1
        if done is not None:
            self._progress(done, count)
        if outage is not None:
            raise outage

    def _queue_waits(self, pipe: Any, nodes: list[Any]) -> None:
        """The batch's WAITs: one on a single Redis's connection, or one per master in ``nodes``
        (a cluster pipeline sends each node's commands on one connection, WAIT last)."""
        if not self._durable_replicas:
            return
        wait = ("WAIT", self._durable_replicas, REPLICA_WAIT_MS)
        if not self._cluster:
            pipe.execute_command(*wait)
        for node in nodes:
            pipe.execute_command(*wait, target_nodes=node)

    async def _masters_of(self, batch: list[Write]) -> list[Any]:
        """The masters the batch writes to. Each is waited on, whether or not the slot map lists
        a replica: Redis 7.0 leaves out of ``CLUSTER SLOTS`` a replica it has no offset for yet,
        and a master truly without one holds its writes, like a single Redis without one."""
        if self._redis._initialize:  # the slot map is read on first use
            try:
                await self._redis.initialize()
            except RedisClusterException as exc:
                raise ClusterUnavailable(str(exc)) from exc
        manager = self._redis.nodes_manager
        masters: dict[str, Any] = {}
        for write in batch:
            shard = manager.slots_cache.get(key_slot(_call_of(write)[1][0].encode()))
            if shard:  # none: the pipeline finds no node either, and fails the batch (resent)
                masters.setdefault(shard[0].name, shard[0])
        return list(masters.values())

    def _acked(self, replies: list[Any], nodes: list[Any]) -> int:
        """The fewest replicas any WAIT counted (``durable_replicas`` without a WAIT); an error
        reply counts none. A master whose slots moved meanwhile counts none either: a write
        redirected to another node was not on the connection its WAIT covered."""
        counts = [reply if isinstance(reply, int) else 0 for reply in replies]
        if nodes and any(self._moved(node) for node in nodes):
            counts.append(0)
        return min(counts, default=self._durable_replicas)

    def _moved(self, node: Any) -> bool:
        """Whether the slot map no longer shows ``node`` as a master."""
        current = self._redis.nodes_manager.nodes_cache.get(node.name)
        return current is None or current.server_type != PRIMARY

    def _fell_short(self, acked: int) -> None:
        if not self._short:
            log.warning(
                "proxy.outbox_replicas_behind",
                wanted=self._durable_replicas,
                acked=acked,
                pending=len(self._queue),
                hint="writes kept and resent until the replicas confirm them",
            )
        self._on_short(acked)

    def _delivered(self, write: Write, result: int) -> None:
        self._settle(self._queue.popleft(), True)
        if result > 0:  # the quota script's evictions
            self._on_evict(result)
        self._answered()

    def _answered(self) -> None:
        if not self.up:
            log.info("proxy.redis_available", pending=len(self._queue))
        self.up = True

    def _refused(self, write: Write, exc: ResponseError) -> None:
        """Redis is up but refuses the write: resending cannot help and would block every write
        behind it, so it is dropped (and counted)."""
        where = write.stream if isinstance(write, StreamWrite) else write.key
        log.error("proxy.outbox_write_refused", target=where, error=str(exc), outbox_id=write.id)
        self._on_drop(write)
        self._settle(self._queue.popleft(), False)

    def _settle(self, write: Write, delivered: bool) -> None:
        self._reported.discard(write.id)
        future = self._waiters.pop(write.id, None)
        if future is not None and not future.done():
            future.set_result(delivered)

    def _progress(self, last: Write, count: int) -> None:
        """Record in the spool that every write up to ``last`` (``count`` more) is done:
        delivered or refused."""
        if self._spool is None:
            return
        self._delivered_since_rewrite += count
        if not self._queue or self._delivered_since_rewrite >= self._bound:
            self._spool.rewrite(_to_spool(w) for w in self._queue)  # never more than ~2 bounds
            self._delivered_since_rewrite = 0
        else:
            self._spool.delivered(last.id)

    def _down(self, exc: Exception, batch: Iterable[Write]) -> None:
        for write in batch:  # each write of the failed batch, the first time it fails
            if write.id not in self._reported:
                self._reported.add(write.id)
                self._on_first_failure(write)
        if self.up:
            log.warning(
                "proxy.redis_unavailable", error=str(exc) or type(exc).__name__, pending=len(self._queue)
            )
        self.up = False

    async def _ping(self) -> None:
        try:
            await self._redis.ping()
        except (RedisError, OSError) as exc:
            self._down(exc, ())
        else:
            if not self.up:
                log.info("proxy.redis_available", pending=len(self._queue))
            self.up = True

    async def flush(self, timeout: float) -> None:
        """Wait until the queue is delivered, Redis is down, or ``timeout`` passed."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while self._queue and self.up and loop.time() < deadline:
            await asyncio.sleep(0.01)

    async def aclose(self, timeout: float = 2.0) -> None:
        """Try to deliver what is queued for up to ``timeout``; the spool keeps the rest (and
        only the rest)."""
        if self._task is not None:
            await self.flush(timeout)
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        if self._queue and self._spool is None:
            log.error("proxy.outbox_lost_on_shutdown", writes=len(self._queue), hint="set --spool-dir")
        if self._spool is not None:
            self._spool.close(_to_spool(w) for w in self._queue)
        await self._redis.aclose()
