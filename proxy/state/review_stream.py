"""The review console's queue read from the policy's Redis review stream: every replica's answers
sent to review, and closing an item a fact every replica's console sees.

* Pending items are the stream's entries (``proxy.review.RedisStreamSink``, through the outbox)
  not closed yet, newest first. A page reads at most ``SCAN_MAX`` entries in batches of
  ``BATCH`` (``XREVRANGE`` with an exclusive start), envelopes left unparsed until an item is
  opened (``XRANGE id id``): a long stream costs a page a bounded read.
* Closures are two keys beside the stream (``closed_keys``): a hash, entry id -> who closed it,
  how and when (JSON), and a sorted set of the closed entry ids by their time. One Lua script
  closes an item: the entry must still be in the stream, and ``HSETNX`` lets one closure win;
  the other reviewer is told who came first. The script also forgets closures of entries the
  stream's ``MAXLEN`` trimmed, and both keys expire ``CLOSED_TTL_S`` after the last closure.
* In a Redis Cluster the script's three keys share the stream's slot: the closure keys carry a
  hash tag of that slot (``proxy.state.cluster_slots``), as the outbox's marks do.

Any Redis failure is ``QueueUnavailable``: the console says Redis is not answering.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

import orjson
from redis.exceptions import NoScriptError, RedisError

from proxy.jsonshape import as_dict
from proxy.state.cluster_slots import slot_tag
from proxy.state.redis_client import RedisOptions, redis_client
from proxy.state.review_queue import (
    CLOSED_KEPT,
    GONE,
    ClosedReview,
    Keeps,
    PendingReview,
    QueuePage,
    QueueUnavailable,
    pending_from_record,
)

PAGE_ITEMS = 50
"""Pending items a page lists."""
BATCH = 100
SCAN_MAX = 1000
"""Entries a page reads at most; past them it links to the next page (``older``)."""
AROUND_MAX = 200
"""Entries read to find an item's previous and next pending neighbours."""
CLOSED_PREFIX = "cogproxy:review:closed:"
CLOSED_TTL_S = 30 * 86_400
"""How long closures are kept after the last one (a stream nobody reviews for a month)."""
PRUNE_MAX = 100
"""Closures of trimmed entries a close forgets at most (the rest at the next close)."""
ENTRY_ID = re.compile(r"[0-9]{1,20}-[0-9]{1,20}")

CLOSE = """
if #redis.call('XRANGE', KEYS[1], ARGV[1], ARGV[1]) == 0 then return {0} end
if redis.call('HSETNX', KEYS[2], ARGV[1], ARGV[2]) == 0 then
  return {1, redis.call('HGET', KEYS[2], ARGV[1])}
end
redis.call('ZADD', KEYS[3], tonumber(string.match(ARGV[1], '^[0-9]+')), ARGV[1])
local first = redis.call('XRANGE', KEYS[1], '-', '+', 'COUNT', 1)[1]
if first then
  local fms, fseq = string.match(first[1], '^([0-9]+)-([0-9]+)$')
  fms, fseq = tonumber(fms), tonumber(fseq)
  local trimmed = {}
  for _, id in ipairs(redis.call('ZRANGEBYSCORE', KEYS[3], '-inf', fms, 'LIMIT', 0, tonumber(ARGV[4]))) do
    local ms, seq = string.match(id, '^([0-9]+)-([0-9]+)$')
    ms, seq = tonumber(ms), tonumber(seq)
    if ms < fms or (ms == fms and seq < fseq) then trimmed[#trimmed + 1] = id end
  end
  if #trimmed > 0 then
    redis.call('ZREM', KEYS[3], unpack(trimmed))
    redis.call('HDEL', KEYS[2], unpack(trimmed))
  end
end
redis.call('EXPIRE', KEYS[2], ARGV[3])
redis.call('EXPIRE', KEYS[3], ARGV[3])
return {2}
"""
"""KEYS: the stream, the closures hash, their order; ARGV: the entry id, the closure (JSON), the
keys' TTL, ``PRUNE_MAX``. Returns {0} gone from the stream, {1, closure} closed already, {2} closed now."""
CLOSE_SHA = hashlib.sha1(CLOSE.encode()).hexdigest()  # Redis names a loaded script by its SHA-1
_GONE, _TAKEN = 0, 1


def closed_keys(stream: str, *, cluster: bool) -> tuple[str, str]:
    """(the closures hash, their sorted set) of ``stream``; in a cluster on the stream's slot."""
    base = CLOSED_PREFIX + (f"{{{slot_tag(stream)}}}" if cluster else stream)
    return base + ":by", base + ":order"


def entry_time(entry: str) -> float:
    """Epoch seconds of a stream entry id (its milliseconds part)."""
    return int(entry.partition("-")[0]) / 1000


def _json(fields: Mapping[str, str], name: str) -> dict[str, Any]:
    try:
        return as_dict(orjson.loads(fields.get(name, "{}")))
    except orjson.JSONDecodeError:
        return {}


def pending_from_entry(entry: str, fields: Mapping[str, str], *, envelope: bool) -> PendingReview:
    """The item of a stream entry (``envelope``: parse it too, for the item's page)."""
    raw = fields.get("envelope", "{}") if envelope else "{}"
    record = {
        "trace_id": fields.get("trace_id", ""),
        "client": fields.get("client", ""),
        "module": fields.get("module", ""),
        "tier": fields.get("tier", ""),
        "decision": fields.get("decision", "review"),
        "meta": _json(fields, "meta"),
        "answer": _json(fields, "answer"),
        "envelope": _json({"envelope": raw}, "envelope"),
        "recorded_at": entry_time(entry),
    }
    item = pending_from_record(record, len(raw) if envelope else 0)
    return replace(item, entry=entry)


def closure(item: PendingReview, outcome: str, by: str, at: float) -> str:
    return orjson.dumps(
        {
            "trace_id": item.trace_id,
            "client": item.client,
            "module": item.module,
            "tier": item.tier,
            "queued_at": item.at,
            "outcome": outcome,
            "by": by,
            "at": at,
        }
    ).decode()


def closed_from(entry: str, text: str) -> ClosedReview:
    """A closure as the hash keeps it."""
    data = as_dict(orjson.loads(text))
    item = PendingReview(
        trace_id=str(data.get("trace_id", "")),
        client=str(data.get("client", "")),
        module=str(data.get("module", "")),
        tier=str(data.get("tier", "")),
        decision="review",
        envelope={},
        at=float(data.get("queued_at") or entry_time(entry)),
        entry=entry,
    )
    return ClosedReview(
        item, str(data.get("outcome", "")), str(data.get("by", "")), float(data.get("at") or 0.0)
    )


class ReviewStreams:
    """The console's Redis client (purpose ``review``): a ``StreamItems`` per stream name."""

    def __init__(self, options: RedisOptions) -> None:
        self._redis: Any = redis_client(options, "review")
        self._cluster = options.cluster

    def items(self, stream: str) -> StreamItems:
        return StreamItems(self._redis, stream, cluster=self._cluster)

    async def aclose(self) -> None:
        await self._redis.aclose()


class StreamItems:
    """``ReviewItems`` over one review stream."""

    shared = True

    def __init__(self, redis: Any, stream: str, *, cluster: bool) -> None:
        self._redis = redis
        self._stream = stream
        self._closures, self._order = closed_keys(stream, cluster=cluster)

    async def _call(self, command: str, *args: Any) -> Any:
        try:
            return await self._redis.execute_command(command, *args)
        except (RedisError, OSError, TimeoutError) as exc:
            raise QueueUnavailable(f"Redis did not answer {command}: {type(exc).__name__}") from exc

    async def _batch(
        self, command: str, start: str, end: str, count: int
    ) -> list[tuple[str, dict[str, str]]]:
        """Entries with the ids of those already closed left out."""
        entries = await self._call(command, self._stream, start, end, "COUNT", count)
        if not entries:
            return []
        ids = [entry for entry, _ in entries]
        closed = await self._call("HMGET", self._closures, *ids)
        return [
            (entry, dict(fields))
            for (entry, fields), done in zip(entries, closed, strict=True)
            if done is None
        ]

    async def page(self, keeps: Keeps, older_than: str | None) -> QueuePage:
        start = "+" if older_than is None else "(" + older_than
        items: list[PendingReview] = []
        scanned, cursor, exhausted = 0, older_than, False
        while not exhausted and scanned < SCAN_MAX and len(items) < PAGE_ITEMS:
            entries = await self._call("XREVRANGE", self._stream, start, "-", "COUNT", BATCH)
            if not entries:
                exhausted = True
                break
            closed = await self._call("HMGET", self._closures, *(entry for entry, _ in entries))
            for (entry, fields), done in zip(entries, closed, strict=True):
                scanned, cursor = scanned + 1, entry
                if done is None and keeps(item := pending_from_entry(entry, dict(fields), envelope=False)):
                    items.append(item)
                    if len(items) == PAGE_ITEMS:
                        break
            else:
                exhausted = len(entries) < BATCH
            start = f"({cursor}"
        length = await self._call("XLEN", self._stream)
        closed_count = await self._call("ZCARD", self._order)
        return QueuePage(tuple(items), max(0, int(length) - int(closed_count)), None if exhausted else cursor)

    async def item(self, client: str, trace_id: str, entry: str) -> PendingReview | None:
        if not ENTRY_ID.fullmatch(entry):
            return None
        found = await self._batch("XRANGE", entry, entry, 1)
        if not found:
            return None
        item = pending_from_entry(entry, found[0][1], envelope=True)
        return item if (item.client, item.trace_id) == (client, trace_id) else None

    async def neighbours(self, item: PendingReview) -> tuple[PendingReview | None, PendingReview | None]:
        """The newer pending entry (listed before it) and the older one (after it)."""
        newer = await self._batch("XRANGE", "(" + item.entry, "+", AROUND_MAX)
        older = await self._batch("XREVRANGE", "(" + item.entry, "-", AROUND_MAX)
        return (
            pending_from_entry(*newer[0], envelope=False) if newer else None,
            pending_from_entry(*older[0], envelope=False) if older else None,
        )

    async def claim(self, item: PendingReview, outcome: str, by: str, at: float) -> ClosedReview | None:
        keys = (self._stream, self._closures, self._order)
        args = (item.entry, closure(item, outcome, by, at), CLOSED_TTL_S, PRUNE_MAX)
        try:  # EVALSHA, the script loaded when Redis lacks it (the documented ACL rule has no EVAL)
            try:
                answer = await self._redis.evalsha(CLOSE_SHA, len(keys), *keys, *args)
            except NoScriptError:
                await self._redis.script_load(CLOSE)
                answer = await self._redis.evalsha(CLOSE_SHA, len(keys), *keys, *args)
        except (RedisError, OSError, TimeoutError) as exc:
            raise QueueUnavailable(f"Redis did not answer EVALSHA: {type(exc).__name__}") from exc
        if int(answer[0]) == _GONE:
            return ClosedReview(item, GONE, "", at)
        if int(answer[0]) == _TAKEN:
            return closed_from(item.entry, answer[1])
        return None

    async def release(self, item: PendingReview) -> None:
        """The closure this claim set (``HSETNX`` made it this process's) is taken back."""
        await self._call("HDEL", self._closures, item.entry)
        await self._call("ZREM", self._order, item.entry)

    async def close_answer(self, client: str, trace_id: str, outcome: str, by: str, at: float) -> bool:
        """The answer's pending entry among the newest ``SCAN_MAX`` (no index by trace id: a
        verdict on an older entry leaves it listed), closed as a claim closes it."""
        start = "+"
        for _ in range(SCAN_MAX // BATCH):
            entries = await self._call("XREVRANGE", self._stream, start, "-", "COUNT", BATCH)
            for entry, fields in entries or ():
                found = dict(fields)
                if (found.get("client"), found.get("trace_id")) == (client, trace_id):
                    item = pending_from_entry(entry, found, envelope=False)
                    return await self.claim(item, outcome, by, at) is None
            if not entries or len(entries) < BATCH:
                return False
            start = f"({entries[-1][0]}"
        return False

    async def closed(self) -> Sequence[ClosedReview]:
        ids = await self._call("ZREVRANGE", self._order, 0, CLOSED_KEPT - 1)
        if not ids:
            return ()
        texts = await self._call("HMGET", self._closures, *ids)
        return tuple(closed_from(entry, text) for entry, text in zip(ids, texts, strict=True) if text)
