"""Redis round trips per request kind, counted by Redis itself (``INFO commandstats``) and on the
wire by the relay (``RedisRelay.turns``: a pipeline is one round trip), not timed.

The proxy reaches the suite's private Redis through a relay (``tests.redis_relay``). A request is
held at the fake upstream: the commands counted by then are the ones the answer waited on before
the provider was asked. The relay is then frozen (nothing reaches Redis, no reply comes back) and the
upstream released: the answer must come all the same, so nothing between the provider's answer and
the client's waits on Redis. Redis timeouts are long here, so a wait would hang, not fall back."""

from __future__ import annotations

import asyncio
import hashlib
from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path
from types import MappingProxyType
from typing import Any

import aiohttp
import pytest

import proxy.state.redis_client as redis_client
from proxy.api.app_keys import OUTBOX
from proxy.api.limits import LIMITER
from proxy.limits import windows
from proxy.state.outbox import SCRIPTS, KeyWrite
from tests.context.helpers import FIX, LOGIN, REVIEWER, execute, reviewer_answer, sent_inputs
from tests.fake_upstream import FakeUpstream
from tests.paths import ROOT
from tests.proxy_server import RunningProxy, running_proxy, upstream_policy
from tests.redis_relay import RedisRelay
from tests.support.commandstats import calls_since, quiet, round_trips, script_commands
from tests.support.polling import eventually
from tests.support.redis_server import redis_url

DB = 15
HANG_S = 30.0
"""Every Redis timeout of the proxy under test: a wait on a frozen Redis hangs rather than falls back."""
ANSWER_BOUND_S = 10.0
"""How long the answer may take with Redis frozen before the test calls it a wait on Redis."""
LIMITS = {"global": {"rpm": 100000, "tpm": 100000000}}
IN_SCRIPTS = script_commands(ROOT)
CHAT = {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "hi"}]}


@pytest.fixture(autouse=True)
def _redis_waits_hang(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(
        redis_client, "TIMEOUTS_S", MappingProxyType(dict.fromkeys(redis_client.TIMEOUTS_S, HANG_S))
    )


async def _post(session: aiohttp.ClientSession, px: RunningProxy) -> int:
    async with session.post(px.base + "/chat/completions", json=CHAT) as resp:
        await resp.read()
        return resp.status


async def _counted(
    px: RunningProxy, fake: FakeUpstream, relay: RedisRelay, redis_db: Any
) -> tuple[Counter[str], Counter[str]]:
    """The commands of one chat request before the provider was asked, and after it (its answer
    received meanwhile with Redis frozen), after a first request warmed connections and scripts up."""
    async with aiohttp.ClientSession() as session:
        assert await _post(session, px) == 200
        before = await quiet(redis_db)
        gate = fake.hold()
        answer = asyncio.create_task(_post(session, px))
        await gate.reached.wait()
        asked = await calls_since(redis_db, before)
        relay.freeze()
        gate.release()
        try:
            async with asyncio.timeout(ANSWER_BOUND_S):
                assert await answer == 200, "the answer came while Redis was frozen"
        finally:
            relay.restore()
        after = await quiet(redis_db)  # what the answer did not wait for has reached Redis
        after.subtract(before)
        after.subtract(asked)
        return asked, +after


@pytest.fixture
async def relay() -> AsyncIterator[RedisRelay]:
    async with RedisRelay.start() as running:
        yield running


async def test_a_plain_chat_without_limits_cache_or_context_sends_nothing_to_redis_before_its_answer(
    fake_upstream: FakeUpstream, tmp_path: Path, relay: RedisRelay, redis_db: Any
) -> None:
    policy = upstream_policy(fake_upstream)
    async with running_proxy(tmp_path, policy, redis_url=relay.url(DB), redis_limits_timeout_s=HANG_S) as px:
        asked, answered = await _counted(px, fake_upstream, relay, redis_db)
    assert asked == Counter()  # no breaker read or record on the answer path
    assert answered == Counter()  # a success publishes nothing


async def test_a_plain_chat_with_limits_waits_on_one_round_trip_and_settles_after_its_answer(
    fake_upstream: FakeUpstream, tmp_path: Path, relay: RedisRelay, redis_db: Any
) -> None:
    policy = upstream_policy(fake_upstream, limits=LIMITS)
    async with running_proxy(tmp_path, policy, redis_url=relay.url(DB), redis_limits_timeout_s=HANG_S) as px:
        asked, answered = await _counted(px, fake_upstream, relay, redis_db)
    assert round_trips(asked, IN_SCRIPTS) == 1 and asked["evalsha"] == 1  # the limits check, one script
    assert round_trips(answered, IN_SCRIPTS) == 1 and answered["evalsha"] == 1  # the settle, after it


async def test_back_to_back_requests_do_not_wait_on_the_previous_requests_settle(
    fake_upstream: FakeUpstream, tmp_path: Path, relay: RedisRelay
) -> None:
    """``make bench --redis-paths``'s pattern (c=1, each request sent as the previous answer
    arrives): the previous request's settle is still in flight when the next check goes out. The
    check takes a connection of its own, so each answer waits on its own check alone (here every
    settle's reply is held until the end: a check queued behind one would hang)."""
    policy = upstream_policy(fake_upstream, limits=LIMITS)
    settle = hashlib.sha1(windows._SETTLE.encode()).hexdigest().encode()
    async with (
        running_proxy(tmp_path, policy, redis_url=relay.url(DB), redis_limits_timeout_s=HANG_S) as px,
        aiohttp.ClientSession() as session,
    ):
        assert await _post(session, px) == 200  # connections and scripts
        await px.app[LIMITER].settled()
        relay.hold_replies(lambda data: settle in data)
        try:
            async with asyncio.timeout(ANSWER_BOUND_S):
                statuses = [await _post(session, px) for _ in range(3)]
            held = relay.held
        finally:
            relay.restore()
    assert statuses == [200, 200, 200]
    assert held >= 2  # the first two settles at least were held while the next answers came


CACHED = {"modules": {REVIEWER: {"ttl_s": 600}}}
PREFETCH = ["EVALSHA", "MGET"]
"""The one round trip before a module call's model: the limits check and the call's reads."""
SESSION_PREFETCH = ["EVALSHA", "ZRANGEBYSCORE", "MGET", "ZADD", "PEXPIRE"]
"""A session call's: its session's pending-write marks read before its reads, its own added after
(``proxy.state.pipelined.queue_marked_read``)."""
OUTBOX_SHAS = [hashlib.sha1(lua.encode()).hexdigest().encode() for lua in SCRIPTS.values()]


def outbox_writes(data: bytes) -> bool:
    """A round trip of the outbox's (its scripts' shas)."""
    return any(sha in data for sha in OUTBOX_SHAS)


async def _settled(px: RunningProxy, redis_db: Any) -> Counter[str]:
    """Redis's counts once what the proxy sends after an answer (the outbox's records, the limits
    settle) has reached it."""
    outbox = px.app[OUTBOX]

    async def delivered() -> bool:
        return len(outbox) == 0

    await eventually(delivered, "the outbox delivered")
    await px.app[LIMITER].settled()
    return await quiet(redis_db)


def _session(name: str) -> dict[str, str]:
    return {"X-Cognitive-Session": name}


@pytest.mark.parametrize("delay_s", [0.0, 0.02])
async def test_a_session_module_call_with_limits_cache_and_context_waits_on_one_round_trip(
    fake_upstream: FakeUpstream, tmp_path: Path, relay: RedisRelay, redis_db: Any, delay_s: float
) -> None:
    """The limits check, the session's state and previous result, the cache entry and the
    session's pending-write mark go out in one pipeline before the model is asked (a slow Redis
    changes the time, not the count); after the model the answer waits on nothing: the session's
    writes, the cache entry, the settle and the feedback record are all sent after it (every
    round trip after the first is held here until the answer came)."""
    relay.delay_s = delay_s
    fake_upstream.script("cheap", reviewer_answer(1, "review"), reviewer_answer(2, "fix"))
    policy = upstream_policy(fake_upstream, limits=LIMITS, cache=CACHED)
    async with running_proxy(tmp_path, policy, redis_url=relay.url(DB), redis_limits_timeout_s=HANG_S) as px:
        assert (await execute(px.url, REVIEWER, LOGIN, _session("s1")))[0] == 200  # connections, scripts
        before = await _settled(px, redis_db)
        start = len(relay.counted())
        relay.allow_turns(1)  # every round trip after the first is held
        gate = fake_upstream.hold()
        call = asyncio.create_task(execute(px.url, REVIEWER, FIX, _session("s1")))
        try:
            async with asyncio.timeout(ANSWER_BOUND_S):
                await gate.reached.wait()  # the model is asked after one round trip
            asked = await calls_since(redis_db, before)
            assert relay.counted()[start] == SESSION_PREFETCH
            # Redis ran the limits script, one MGET and one mark, nothing else
            assert (asked["evalsha"], asked["mget"], asked["zadd"], asked["zrangebyscore"]) == (1, 1, 1, 1)
            gate.release()
            async with asyncio.timeout(ANSWER_BOUND_S):
                status, headers, _ = await call
            later = relay.counted()[start + 1 :]
        finally:
            gate.release()
            relay.restore()
        await _settled(px, redis_db)
        marks = [key async for key in redis_db.scan_iter(match="*s1:#writing")]
        left = [await redis_db.zcard(key) for key in marks]
    assert status == 200 and headers["X-Cognitive-Cache"] == "miss"
    assert "session_state=session" in headers["X-Cognitive-Context"]  # read ahead, and used
    assert sent_inputs(fake_upstream)[-1]["_context"]["session_state"]["last_action"] == "review"
    # Sent, held, not awaited: the settle (EVALSHA), and the breakers' background read of their
    # shared state (HMGET, at most every 0.5 s: on a loaded machine the two calls are further apart).
    assert all(set(turn) <= {"EVALSHA", "HMGET"} for turn in later)
    assert left in ([], [0])  # the mark went after the writes


async def test_a_session_call_is_answered_while_the_outboxs_previous_batch_is_in_flight(
    fake_upstream: FakeUpstream, tmp_path: Path, relay: RedisRelay, redis_db: Any
) -> None:
    """The previous call's records (its feedback record, its cache entry) go out in an outbox
    batch as the next call of the session starts: the next call's read (limits, context, cache,
    mark) is its own round trip, on another connection, and its answer comes while that batch's
    reply is held (its own writes queue behind the batch: nothing waits for them)."""
    fake_upstream.script("cheap", reviewer_answer(1, "review"), reviewer_answer(2, "fix"))
    policy = upstream_policy(fake_upstream, limits=LIMITS, cache=CACHED)
    async with running_proxy(tmp_path, policy, redis_url=relay.url(DB), redis_limits_timeout_s=HANG_S) as px:
        assert (await execute(px.url, REVIEWER, LOGIN, _session("ob")))[0] == 200
        await _settled(px, redis_db)
        relay.hold_replies(outbox_writes)
        px.app[OUTBOX].put(KeyWrite("cogproxy:test:in-flight", "x", 60))  # a batch in flight, held

        async def in_flight() -> bool:
            return relay.held == 1

        await eventually(in_flight, "the outbox's batch sent, its reply held")
        start = len(relay.counted())
        try:
            async with asyncio.timeout(ANSWER_BOUND_S):
                status, headers, _ = await execute(px.url, REVIEWER, FIX, _session("ob"))
            asked = [turn for turn in relay.counted()[start:] if "MGET" in turn]
            still_held = relay.held
        finally:
            relay.restore()
    assert status == 200 and "session_state=session" in headers["X-Cognitive-Context"]
    assert asked == [SESSION_PREFETCH] and still_held == 1


async def _streamed(base: str, value: Any, headers: dict[str, str]) -> bytes:
    async with (
        aiohttp.ClientSession() as session,
        session.post(
            f"{base}/v1/modules/{REVIEWER}/execute",
            json={"input": value},
            headers={"Accept": "text/event-stream", **headers},
        ) as resp,
    ):
        assert resp.status == 200
        return await resp.read()


async def test_a_streamed_module_call_reads_its_keys_with_the_limits_check_at_the_edge(
    fake_upstream: FakeUpstream, tmp_path: Path, relay: RedisRelay, redis_db: Any
) -> None:
    """A streamed call is admitted before its stream starts, its context and cache keys read in
    that round trip; its producer reads nothing more before the model (the stream's own copy to
    Redis and a breaker refresh go in the background)."""
    fake_upstream.script("cheap", reviewer_answer(1, "review"), reviewer_answer(2, "fix"))
    policy = upstream_policy(fake_upstream, limits=LIMITS, cache=CACHED)
    async with running_proxy(tmp_path, policy, redis_url=relay.url(DB), redis_limits_timeout_s=HANG_S) as px:
        await _streamed(px.url, LOGIN, _session("st"))
        before = await _settled(px, redis_db)
        start = len(relay.counted())
        gate = fake_upstream.hold()
        call = asyncio.create_task(_streamed(px.url, FIX, _session("st")))
        try:
            async with asyncio.timeout(ANSWER_BOUND_S):
                await gate.reached.wait()
            asked = await calls_since(redis_db, before)
            limits_and_reads = [t for t in relay.counted()[start:] if {"EVALSHA", "MGET", "GET"} & set(t)]
        finally:
            gate.release()
        body = await call
    assert limits_and_reads == [SESSION_PREFETCH]
    assert (asked["evalsha"], asked["mget"]) == (1, 1)  # one script: no other limits check
    assert b'"decision": "accept"' in body or b'"decision":"accept"' in body
    assert sent_inputs(fake_upstream)[-1]["_context"]["session_state"]["last_action"] == "review"


async def test_a_cache_hit_waits_on_one_round_trip_for_its_answer(
    fake_upstream: FakeUpstream, tmp_path: Path, relay: RedisRelay, redis_db: Any
) -> None:
    """A repeated call is answered from the entry read with the limits check: one round trip, the
    answer coming while every later one is held."""
    fake_upstream.script("cheap", reviewer_answer(1, "review"))
    policy = upstream_policy(fake_upstream, limits=LIMITS, cache=CACHED)
    async with running_proxy(tmp_path, policy, redis_url=relay.url(DB), redis_limits_timeout_s=HANG_S) as px:
        assert (await execute(px.url, REVIEWER, LOGIN))[2]["ok"]
        await _settled(px, redis_db)  # the entry reached Redis
        start = len(relay.counted())
        relay.allow_turns(1)
        try:
            async with asyncio.timeout(ANSWER_BOUND_S):
                status, headers, _ = await execute(px.url, REVIEWER, LOGIN)
            asked = relay.counted()[start:]
        finally:
            relay.restore()
    assert (status, headers["X-Cognitive-Cache"]) == (200, "hit")
    assert asked[0] == PREFETCH and fake_upstream.count("/v1/chat/completions") == 1


async def test_the_next_call_of_a_session_reads_its_writes_on_this_replica_and_another(
    fake_upstream: FakeUpstream, tmp_path: Path, redis_db: Any
) -> None:
    """Read-your-writes without a fixed wait: the call that wrote returned once Redis had the
    writes, so the session's next call, on this replica or another, sees them at once."""
    fake_upstream.script(
        "cheap", reviewer_answer(1, "review"), reviewer_answer(2, "fix"), reviewer_answer(0, "done")
    )
    policy = upstream_policy(fake_upstream, limits=LIMITS, cache=CACHED)
    url = redis_url(DB)
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    async with (
        running_proxy(tmp_path / "a", policy, redis_url=url) as one,
        running_proxy(tmp_path / "b", policy, redis_url=url) as two,
    ):
        await execute(one.url, REVIEWER, LOGIN, _session("ryw"))
        _, same, _ = await execute(one.url, REVIEWER, FIX, _session("ryw"))
        seen_here = sent_inputs(fake_upstream)[-1]["_context"]["session_state"]["last_action"]
        _, other, _ = await execute(two.url, REVIEWER, LOGIN, _session("ryw"))
        seen_there = sent_inputs(fake_upstream)[-1]["_context"]["session_state"]["last_action"]
    assert (seen_here, seen_there) == ("review", "fix")
    assert "previous_result=session" in same["X-Cognitive-Context"]
    assert "previous_result=session" in other["X-Cognitive-Context"]


async def test_a_replica_reads_its_own_session_writes_while_redis_does_not_answer(
    fake_upstream: FakeUpstream,
    tmp_path: Path,
    relay: RedisRelay,
    redis_db: Any,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Redis hung: the writing call waits for the acknowledgement only its context timeout, and
    the session's next call on the replica reads the writes still in flight (its overlay), not
    "not available"; once Redis answers again they are delivered."""
    timeouts = dict.fromkeys(redis_client.TIMEOUTS_S, HANG_S) | {"context": 0.2}
    monkeypatch.setattr(redis_client, "TIMEOUTS_S", MappingProxyType(timeouts))
    fake_upstream.script(
        "cheap", *(reviewer_answer(n, action) for n, action in enumerate(["warm", "review", "fix"]))
    )
    async with running_proxy(tmp_path, upstream_policy(fake_upstream), redis_url=relay.url(DB)) as px:
        await execute(px.url, REVIEWER, {"code": "warm-up"})  # connections open before the freeze
        relay.freeze()
        try:
            first = await execute(px.url, REVIEWER, LOGIN, _session("hung"))
            second = await execute(px.url, REVIEWER, FIX, _session("hung"))
        finally:
            relay.restore()
        state_key = "*hung:session_state"

        async def delivered() -> bool:
            return bool([k async for k in redis_db.scan_iter(match=state_key)])

        await eventually(delivered, "the session's writes reached Redis")
    assert (first[0], second[0]) == (200, 200)
    assert sent_inputs(fake_upstream)[-1]["_context"]["session_state"]["last_action"] == "review"
    assert "session_state=session" in second[1]["X-Cognitive-Context"]


async def test_a_plain_chat_of_a_client_without_limits_of_its_own_sends_nothing_to_redis(
    fake_upstream: FakeUpstream, tmp_path: Path, relay: RedisRelay, redis_db: Any
) -> None:
    """Limits configured for another client only (no team, no global, no default): this caller
    has no window and no budget to check, so no limits script either."""
    policy = upstream_policy(
        fake_upstream, limits={"clients": {"someone-else": {"rpm": 10, "usd_per_day": 1}}}
    )
    async with running_proxy(tmp_path, policy, redis_url=relay.url(DB), redis_limits_timeout_s=HANG_S) as px:
        asked, answered = await _counted(px, fake_upstream, relay, redis_db)
    assert asked == Counter()
    assert answered == Counter()


def _state_seen(fake: FakeUpstream) -> Any:
    """The session state the last model call was shown."""
    return sent_inputs(fake)[-1]["_context"].get("session_state", {}).get("last_action")


def _rereads(relay: RedisRelay, start: int) -> int:
    """Round trips since ``start`` that re-read a session's keys while a mark of another replica
    was alive (the marks, then the keys: no mark added)."""
    return sum(1 for turn in relay.counted()[start:] if turn == ["ZRANGEBYSCORE", "MGET"])


async def test_another_replica_reads_a_session_write_still_in_flight_when_the_answer_came(
    fake_upstream: FakeUpstream, tmp_path: Path, relay: RedisRelay
) -> None:
    """Replica one answers a session call while its writes (and its mark's removal) are held
    before Redis; the session's next call, on replica two, sees replica one's mark, re-reads until
    it is gone, and reads the write: read-your-writes across replicas, with no wait in the answer
    of the call that wrote (here the context timeout is long: a wait would hang)."""
    fake_upstream.script(
        "cheap", reviewer_answer(1, "review"), reviewer_answer(2, "fix"), reviewer_answer(0, "done")
    )
    policy = upstream_policy(fake_upstream)
    (tmp_path / "one").mkdir()
    (tmp_path / "two").mkdir()
    async with (
        RedisRelay.start() as other,
        running_proxy(tmp_path / "one", policy, redis_url=relay.url(DB)) as one,
        running_proxy(tmp_path / "two", policy, redis_url=other.url(DB)) as two,
    ):
        await execute(one.url, REVIEWER, LOGIN, _session("x"))
        relay.hold_requests(outbox_writes)
        try:
            async with asyncio.timeout(ANSWER_BOUND_S):
                first = await execute(one.url, REVIEWER, FIX, _session("x"))  # its writes held
            start = len(other.counted())
            second = asyncio.create_task(execute(two.url, REVIEWER, LOGIN, _session("x")))

            async def waiting() -> bool:
                return _rereads(other, start) > 0

            await eventually(waiting, "replica two re-reads while replica one's mark is alive")
        finally:
            relay.restore()  # the writes reach Redis, then the mark's removal
        async with asyncio.timeout(ANSWER_BOUND_S):
            status, headers, _ = await second
    assert first[0] == 200 and status == 200
    assert _state_seen(fake_upstream) == "fix"
    assert "previous_result=session" in headers["X-Cognitive-Context"]


async def test_the_same_replica_reads_its_session_write_held_before_redis_without_waiting(
    fake_upstream: FakeUpstream, tmp_path: Path, relay: RedisRelay
) -> None:
    """The writes of a call are held before Redis (a hung outbox connection): the session's next
    call on the same replica reads them from its overlay, and does not wait on its own replica's
    mark (the context timeout is long here: a wait would hang)."""
    fake_upstream.script(
        "cheap", *(reviewer_answer(n, action) for n, action in enumerate(["warm", "review", "fix"]))
    )
    async with running_proxy(tmp_path, upstream_policy(fake_upstream), redis_url=relay.url(DB)) as px:
        await execute(px.url, REVIEWER, {"code": "warm-up"})
        relay.hold_requests(outbox_writes)
        start = len(relay.counted())
        try:
            async with asyncio.timeout(ANSWER_BOUND_S):
                first = await execute(px.url, REVIEWER, LOGIN, _session("own"))
                second = await execute(px.url, REVIEWER, FIX, _session("own"))
            rereads = _rereads(relay, start)
        finally:
            relay.restore()
    assert (first[0], second[0]) == (200, 200)
    assert _state_seen(fake_upstream) == "review"
    assert "session_state=session" in second[1]["X-Cognitive-Context"]
    assert rereads == 0


async def test_a_mark_whose_writer_never_answers_delays_a_reader_by_the_context_timeout_at_most(
    fake_upstream: FakeUpstream, tmp_path: Path, relay: RedisRelay, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Replica one added its mark and never answers (it died mid-call, or is still running: a
    parallel call of the session). Replica two's call of the session re-reads while the mark is
    alive, for the context timeout at most, then proceeds with what Redis has."""
    timeouts = dict.fromkeys(redis_client.TIMEOUTS_S, HANG_S) | {"context": 0.2}
    monkeypatch.setattr(redis_client, "TIMEOUTS_S", MappingProxyType(timeouts))
    fake_upstream.script("cheap", reviewer_answer(1, "review"), reviewer_answer(2, "stuck"))
    fake_upstream.script("strong", reviewer_answer(3, "other"))
    (tmp_path / "one").mkdir()
    (tmp_path / "two").mkdir()
    other_ladder = [{"name": "fast", "targets": ["up/strong"]}, {"name": "strong", "targets": ["up/cheap"]}]
    async with (
        RedisRelay.start() as other,
        running_proxy(tmp_path / "one", upstream_policy(fake_upstream), redis_url=relay.url(DB)) as one,
        running_proxy(
            tmp_path / "two", upstream_policy(fake_upstream, ladder=other_ladder), redis_url=other.url(DB)
        ) as two,
    ):
        await execute(one.url, REVIEWER, LOGIN, _session("dead"))
        gate = fake_upstream.hold("cheap")
        stuck = asyncio.create_task(execute(one.url, REVIEWER, FIX, _session("dead")))
        try:
            await gate.reached.wait()  # replica one's mark is in Redis, its model never answers
            start = len(other.counted())
            async with asyncio.timeout(ANSWER_BOUND_S):
                status, headers, _ = await execute(two.url, REVIEWER, LOGIN, _session("dead"))
            rereads = _rereads(other, start)
        finally:
            gate.release()
        assert (await stuck)[0] == 200
    assert status == 200 and "session_state=session" in headers["X-Cognitive-Context"]
    assert _state_seen(fake_upstream) in ("review", "stuck")  # the stuck call's answer may have come
    # re-read while the mark lived, backing off from 1 ms to 20 ms: a bounded number in 0.2 s
    assert 1 <= rereads <= 20
