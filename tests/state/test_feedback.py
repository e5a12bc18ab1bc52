"""The feedback stores: the bounded, expiring memory LRU and Redis shared between replicas."""

from __future__ import annotations

import asyncio
import gc
import math
import time
import tracemalloc
import uuid
from collections.abc import AsyncIterator
from dataclasses import replace
from typing import Any

import orjson
import pytest
from structlog.testing import capture_logs

from proxy.state.feedback import (
    KEY_PREFIX,
    MAX_PATH,
    RECORD_MAX_BYTES,
    REDIS_RECORD_BYTES,
    AnswerRecord,
    MemoryFeedbackStore,
    RedisFeedbackStore,
    from_redis,
    pack_path,
    path_steps,
    scan_records,
    with_verdict,
)
from proxy.state.outbox import RedisOutbox
from proxy.state.redis_client import RedisOptions
from tests.support.redis_db import fresh_db
from tests.support.redis_server import redis_url

REDIS_URL = redis_url(15)
SHARED = RedisOptions(REDIS_URL)
DELIVERY_S = 10.0


def record(
    trace_id: str, at: float = 1000.0, window: float = 60.0, client: str = "anonymous"
) -> AnswerRecord:
    return AnswerRecord(
        trace_id,
        "code-reviewer",
        "decision",
        "fast",
        "up",
        "cheap",
        0.9,
        0.6,
        "low",
        "accept",
        0.7,
        at,
        at + window,
        client,
    )


def as_shared(answer: AnswerRecord) -> AnswerRecord:
    """``answer`` as another replica reads it from Redis: what verdicts and calibration need."""
    return replace(answer, rung="", at=0.0, expires=float(math.ceil(answer.expires)))


class Clock:
    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


async def test_memory_store_expires_with_the_window() -> None:
    clock = Clock(1000.0)
    store = MemoryFeedbackStore(clock)
    store.remember(record("t1"), 10)
    assert await store.get("anonymous", "t1") == record("t1")
    clock.now = 1059.9
    assert await store.get("anonymous", "t1") is not None
    clock.now = 1060.0
    assert await store.get("anonymous", "t1") is None
    assert len(store) == 0  # dropped, not only hidden


async def test_memory_store_is_a_bounded_lru() -> None:
    store = MemoryFeedbackStore(Clock(1000.0))
    for i in range(5):
        store.remember(record(f"t{i}"), 3)
    assert len(store) == 3
    assert [await store.get("anonymous", f"t{i}") is not None for i in range(5)] == [
        False,
        False,
        True,
        True,
        True,
    ]
    store.remember(record("t2"), 3)  # written again: the newest
    store.remember(record("t5"), 3)
    assert [r.trace_id for r in store.records()] == ["t4", "t2", "t5"]


async def test_memory_store_judged_keeps_the_expiry_and_ignores_evicted() -> None:
    store = MemoryFeedbackStore(Clock(1000.0))
    store.remember(record("t1"), 1)
    await store.judged(replace(record("t1"), verdict="correct", score=1.0, verdicts=1))
    got = await store.get("anonymous", "t1")
    assert got is not None and (got.verdict, got.expires) == ("correct", 1060.0)
    store.remember(record("t2"), 1)
    await store.judged(replace(record("t1"), verdict="incorrect"))  # evicted: not brought back
    assert await store.get("anonymous", "t1") is None


@pytest.fixture
async def redis_keys() -> AsyncIterator[tuple[str, Any]]:
    """A unique trace-id prefix; the keys written under it are deleted afterwards."""
    prefix = f"test-{uuid.uuid4().hex[:8]}-"
    async with fresh_db(15, match=f"{KEY_PREFIX}{prefix}*") as client:
        yield prefix, client


async def test_redis_store_shares_answers_between_replicas_and_expires_them(
    redis_keys: tuple[str, Any],
) -> None:
    prefix, client = redis_keys
    now = time.time()  # Redis expires the key at the record's own expiry, on its clock
    clock = Clock(now)
    outbox = RedisOutbox(SHARED)
    outbox.start()
    one, two = RedisFeedbackStore(SHARED, outbox, clock), RedisFeedbackStore(SHARED, outbox, clock)
    try:
        one.remember(record(prefix + "a", at=now, window=30.0), 10)
        await outbox.flush(DELIVERY_S)
        assert len(outbox) == 0
        ttl = await client.pttl(KEY_PREFIX + prefix + "a")
        assert 29_000 < ttl <= 30_000
        assert await two.get("anonymous", prefix + "a") == as_shared(
            record(prefix + "a", at=now, window=30.0)
        )  # the other replica
        judged = replace(record(prefix + "a", at=now, window=30.0), verdict="correct", score=1.0, verdicts=1)
        await two.judged(judged)
        await outbox.flush(DELIVERY_S)
        assert await one.get("anonymous", prefix + "a") == record(
            prefix + "a", at=now, window=30.0
        )  # its own cache is older
        fresh = RedisFeedbackStore(SHARED, outbox, clock)
        assert await fresh.get("anonymous", prefix + "a") == as_shared(judged)
        await fresh.aclose()
        assert [r async for r in scan_records(SHARED) if r.trace_id.startswith(prefix)] == [as_shared(judged)]
        clock.now = now + 31.0
        assert (
            await two.get("anonymous", prefix + "a") is None
        )  # past the window even before Redis expires it
    finally:
        await one.aclose()
        await two.aclose()
        await outbox.aclose()


async def test_redis_store_keeps_serving_and_queues_while_redis_is_down() -> None:
    down = "redis://127.0.0.1:1/0"  # nothing listens on port 1
    outbox = RedisOutbox(RedisOptions(down))
    outbox.start()
    store = RedisFeedbackStore(RedisOptions(down), outbox, Clock(1000.0))
    try:
        store.remember(record("down"), 10)
        assert await store.get("anonymous", "down") == record("down")  # from this replica's memory
        assert await store.get("anonymous", "elsewhere") is None  # the lookup failed: unknown, not a crash
        await asyncio.sleep(0)  # the writer tries (and fails) in the background
        assert len(outbox) == 1
    finally:
        await store.aclose()
        await outbox.aclose()


async def test_memory_store_keys_records_by_client_and_trace_id() -> None:
    """Two clients choosing one trace id keep two records; ``find`` (an admin's) sees both."""
    store = MemoryFeedbackStore(Clock(1000.0))
    alice, bob = record("same", client="alice"), replace(record("same", client="bob"), confidence=0.5)
    store.remember(alice, 10)
    store.remember(bob, 10)
    assert (await store.get("alice", "same"), await store.get("bob", "same")) == (alice, bob)
    assert await store.get("carol", "same") is None
    assert await store.find("same") == [alice, bob]
    await store.judged(replace(bob, verdict="correct"))
    assert (await store.get("alice", "same")) == alice  # untouched by bob's verdict
    store.remember(record("other", client="alice"), 2)  # evicts the oldest: alice's "same"
    assert await store.find("same") == [replace(bob, verdict="correct")]


async def test_redis_store_keeps_each_clients_record_of_one_trace_id(redis_keys: tuple[str, Any]) -> None:
    prefix, client = redis_keys
    now = time.time()
    clock = Clock(now)
    outbox = RedisOutbox(SHARED)
    outbox.start()
    one, two = RedisFeedbackStore(SHARED, outbox, clock), RedisFeedbackStore(SHARED, outbox, clock)
    try:
        alice, bob = record(prefix + "t", now, client="alice"), record(prefix + "t", now, client="bob")
        one.remember(alice, 10)
        one.remember(bob, 10)
        await outbox.flush(DELIVERY_S)
        assert set(await client.hkeys(KEY_PREFIX + prefix + "t")) == {b"alice", b"bob"}
        shared = [as_shared(alice), as_shared(bob)]
        assert [await two.get("alice", prefix + "t"), await two.get("bob", prefix + "t")] == shared
        assert await two.get("carol", prefix + "t") is None
        assert await two.find(prefix + "t") == shared
        # a field whose record names another client or trace id is not taken for it
        await client.hset(KEY_PREFIX + prefix + "t", "carol", alice.dumps())
        assert await two.get("carol", prefix + "t") is None
    finally:
        await one.aclose()
        await two.aclose()
        await outbox.aclose()


def test_a_record_of_the_previous_version_still_loads_for_calibration() -> None:
    old = {**orjson.loads(record("t").dumps()), "key_hash": "ab" * 32}
    del old["client"]
    assert AnswerRecord.loads(orjson.dumps(old)) == record("t")


def test_a_remembered_answer_takes_at_most_record_max_bytes() -> None:
    """Issue #29 finding 5: the store was bounded by count only, at "~0.5 KiB a record"; a judged
    record with the longest note, source and trace id the API accepts takes ~2.1 KiB. Measured
    with tracemalloc, such records stay within ``RECORD_MAX_BYTES`` each, the figure
    ``proxy.memory_budget`` multiplies ``feedback.max_entries`` by."""
    store = MemoryFeedbackStore(clock=lambda: 1000.0)
    count = 2000
    module, provider, model = "code-reviewer", "openai", "gpt-4o-mini"  # the policy's own strings
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for n in range(count):
            answer = replace(record(f"{n:0128x}"), module=module, provider=provider, model=model)
            judged = with_verdict(answer, "incorrect", 0.0, f"{n:064x}", f"{n:01000x}")
            store.remember(judged, count)
        gc.collect()
        held = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert len(store) == count
    assert held <= count * RECORD_MAX_BYTES, f"{held / count:.0f} bytes a record"


async def test_a_record_delivered_long_after_it_was_queued_still_expires_with_its_window(
    redis_keys: tuple[str, Any],
) -> None:
    """Issue #32: the key's TTL was taken when the record was queued, so a record delivered after
    an outage (or replayed from the spool) was kept a whole window past its delivery. It expires
    at the record's own ``expires`` (Redis's clock), however late it arrives."""
    prefix, client = redis_keys
    now = time.time()
    clock = Clock(now - 25.0)  # queued 25 s ago, in a 30 s window: 5 s left
    outbox = RedisOutbox(SHARED)
    store = RedisFeedbackStore(SHARED, outbox, clock)
    try:
        store.remember(record(prefix + "late", at=now - 25.0, window=30.0), 10)
        clock.now = now
        outbox.start()  # Redis "comes back": delivered now
        await outbox.flush(DELIVERY_S)
        assert len(outbox) == 0
        assert 0 < await client.pttl(KEY_PREFIX + prefix + "late") <= 5_000
    finally:
        await store.aclose()
        await outbox.aclose()


async def test_scan_records_leaves_out_records_past_their_window(redis_keys: tuple[str, Any]) -> None:
    """A hash holds one record per client and expires with the latest one written: an older
    client's record in it is past its own window before the key goes, and calibration must not
    count it."""
    prefix, client = redis_keys
    now = time.time()
    gone, live = (
        record(prefix + "t", at=now - 100.0, client="alice"),
        record(prefix + "t", at=now, client="bob"),
    )
    await client.hset(KEY_PREFIX + prefix + "t", mapping={"alice": gone.dumps(), "bob": live.dumps()})
    await client.expire(KEY_PREFIX + prefix + "t", 60)
    found = [r async for r in scan_records(SHARED) if r.trace_id.startswith(prefix)]
    assert [r.client for r in found] == ["bob"]


async def test_an_answer_takes_at_most_redis_record_bytes_in_redis(redis_keys: tuple[str, Any]) -> None:
    """Issue #32: a record took ~700 bytes of Redis (``MEMORY USAGE``), ~780 of ``used_memory``,
    for 7 days. Written through the store, a typical unjudged answer (a 32-hex trace id, a hashed
    client key, the reference module's names) stays within ``REDIS_RECORD_BYTES``, the figure
    docs/deployment.md sizes Redis by."""
    prefix, client = redis_keys
    now = time.time()
    outbox = RedisOutbox(SHARED)
    outbox.start()
    store = RedisFeedbackStore(SHARED, outbox, Clock(now))
    try:
        answer = replace(
            record(prefix + uuid.uuid4().hex, at=now, window=7 * 86_400.0, client="key-0123456789abcdef"),
            provider="openai",
            model="gpt-4o-mini",
            confidence=0.87,
            calibrated=0.8123456789012345,
        )
        store.remember(answer, 10)
        await outbox.flush(DELIVERY_S)
        assert len(outbox) == 0
        used = await client.memory_usage(KEY_PREFIX + answer.trace_id)
        assert 0 < used <= REDIS_RECORD_BYTES, f"{used} bytes"
    finally:
        await store.aclose()
        await outbox.aclose()


async def test_records_the_previous_version_wrote_are_read_through_their_window(
    redis_keys: tuple[str, Any],
) -> None:
    """Records stored whole (a JSON object per field) before the packed form stay judgeable and
    counted by calibration until they expire."""
    prefix, client = redis_keys
    now = time.time()
    old = record(prefix + "old", at=now, client="alice")
    await client.hset(KEY_PREFIX + old.trace_id, "alice", old.dumps())
    await client.expire(KEY_PREFIX + old.trace_id, 60)
    outbox = RedisOutbox(SHARED)
    store = RedisFeedbackStore(SHARED, outbox, Clock(now))
    try:
        assert await store.get("alice", old.trace_id) == old
        assert [r async for r in scan_records(SHARED) if r.trace_id.startswith(prefix)] == [old]
    finally:
        await store.aclose()
        await outbox.aclose()


@pytest.mark.parametrize("confidence", [0.57, 0.69996, 0.7, 0.70004, 0.8123456789, 0.99999, 1.0, 0.0])
def test_packed_confidences_compare_with_thresholds_and_bin_edges_as_before(confidence: float) -> None:
    answer = replace(record("t", at=time.time()), confidence=confidence, calibrated=confidence)
    shared = from_redis(with_verdict(answer, "correct", 1.0, "qa", "fine").packed(), "anonymous", "t")
    assert abs(shared.calibrated - confidence) < 1e-4
    for edge in (0.57, 0.6, 0.7, 0.7001, 0.9, 1.0):
        assert (shared.calibrated >= edge) == (confidence >= edge)
        assert (shared.confidence >= edge) == (confidence >= edge)
    assert (shared.verdict, shared.score, shared.source, shared.note, shared.verdicts) == (
        "correct",
        1.0,
        "qa",
        "fine",
        1,
    )


async def test_past_the_daily_cap_answers_stay_in_memory_only_counted_and_logged_once_a_day(
    redis_keys: tuple[str, Any],
) -> None:
    """Issue #32: ``feedback.max_per_day`` bounds what one replica adds to Redis in a UTC day;
    past it an answer is kept in this replica's memory only, each one counted, one log line a day.
    A verdict on a record already shared is still written."""
    prefix, client = redis_keys
    day = 86_400.0 * (int(time.time() // 86_400) + 1)  # the start of tomorrow (UTC)
    clock = Clock(day - 10.0)
    capped: list[int] = []
    outbox = RedisOutbox(SHARED)
    outbox.start()
    store = RedisFeedbackStore(SHARED, outbox, clock, on_capped=lambda: capped.append(1))
    try:
        with capture_logs() as logs:
            for n in range(4):
                store.remember(record(f"{prefix}{n}", at=clock.now), 10, max_per_day=2)
            await store.judged(with_verdict(record(f"{prefix}0", at=clock.now), "correct", 1.0, None, None))
            clock.now = day + 1.0  # a new day: two more
            for n in range(4, 7):
                store.remember(record(f"{prefix}{n}", at=clock.now), 10, max_per_day=2)
        await outbox.flush(DELIVERY_S)
        shared = sorted(
            key.decode().removeprefix(KEY_PREFIX + prefix)
            for key in await client.keys(KEY_PREFIX + prefix + "*")
        )
        assert shared == ["0", "1", "4", "5"]
        assert (await store.get("anonymous", f"{prefix}3")) is not None  # still judgeable here
        assert len(capped) == 3
        assert [log["event"] for log in logs].count("proxy.feedback_daily_cap_reached") == 2
        verdict = await client.hget(KEY_PREFIX + prefix + "0", "anonymous")
        assert from_redis(verdict, "anonymous", prefix + "0").verdict == "correct"
    finally:
        await store.aclose()
        await outbox.aclose()


def test_the_path_keeps_the_latest_earlier_rungs_cut_to_four_decimals() -> None:
    steps = [(f"p/m{i}", 0.123456, "medium") for i in range(MAX_PATH + 2)]
    kept = path_steps(pack_path(steps))
    assert kept == [(f"p/m{i}", 0.1234, "medium") for i in range(2, MAX_PATH + 2)]
    assert pack_path([]) == "" and path_steps("") == [] and path_steps(None) is None


def test_risk_and_path_travel_through_redis_and_older_rows_say_they_have_neither() -> None:
    escalated = replace(
        record("t"), decision="escalated", risk="medium", path=pack_path([("up/cheap", 0.55, "low")])
    )
    for stored in (escalated, with_verdict(escalated, "correct", 1.0, None, None)):
        back = from_redis(stored.packed(), stored.client, "t")
        assert (back.risk, path_steps(back.path)) == ("medium", [("up/cheap", 0.55, "low")])
    first_rung = from_redis(record("t").packed(), "anonymous", "t")
    assert (first_rung.risk, first_rung.path) == ("low", "")
    # 0.4 packed 8 fields (13 judged) and kept no risk nor path: unknown, not "first rung"
    row = orjson.loads(escalated.packed())
    old = [*row[:8], "correct", 1.0, 1, None, None]
    back = from_redis(orjson.dumps(old), "anonymous", "t")
    assert (back.risk, back.path, back.verdict) == ("", None, "correct")
    whole = orjson.loads(record("t").dumps())
    del whole["path"]  # 0.3 to 0.4 stored the record whole, without a path
    assert AnswerRecord.loads(orjson.dumps(whole)).path is None


@pytest.mark.parametrize(
    "path",
    [
        '[["up/cheap", 1.5, "l"]]',
        '[["up/cheap", 0.5]]',
        '[[1, 0.5, "l"]]',
        '{"a": 1}',
        "[" + '["a",0.1,"l"],' * 4 + "]",
    ],
)
def test_a_stored_path_that_is_not_one_is_refused(path: str) -> None:
    row = orjson.loads(record("t").packed())
    row[9] = orjson.Fragment(path.replace(",]", "]"))
    with pytest.raises((ValueError, TypeError)):
        from_redis(orjson.dumps(row), "anonymous", "t")
