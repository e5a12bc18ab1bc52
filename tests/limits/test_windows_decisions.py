"""The counters' decisions (``proxy.limits.windows``), in-process: the sliding-window arithmetic,
spend that adds up, the bounds of the in-memory tables, and Redis settlements (the suite's own
redis-server, tests.support.redis_server)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
import redis.asyncio as aioredis
import redis.exceptions

from proxy.limits.windows import (
    MAX_LOCAL_SPEND_KEYS,
    MAX_LOCAL_WINDOWS,
    SPEND_TTL_S,
    MemoryCounters,
    RedisCounters,
    Window,
    WindowState,
    spend_key,
    window_keys,
    window_state,
)
from tests.support.redis_db import fresh_db
from tests.support.redis_server import free_port, redis_url

REDIS_URL = redis_url(13)
DAY = "spend:client:c1:day:2026-11-27"
MONTH = "spend:client:c1:month:2026-11"


class Clock:
    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


@pytest.mark.parametrize(
    ("args", "state"),
    [
        # (allowed, limit, expiry, previous, current, into)
        ((True, 10, 60, 6, 2, 30.0), WindowState(True, 5, 0.0)),  # 6 * 30/60 + 2 = 5 < 10
        ((False, 10, 60, 1, 9, 30.0), WindowState(False, 1, 0.0)),  # 9.5 is floored
        ((True, 10, 60, 0, 10, 45.0), WindowState(True, 0, 45.0)),  # full: frees when it turns previous
        ((True, 10, 60, 20, 4, 30.0), WindowState(True, 0, 12.0)),  # previous fades: 30 - 6 * 60/20
        ((True, 10, 60, 20, 10, 30.0), WindowState(True, 0, 30.0)),  # current == limit: 30 + 60 * 0
        ((True, 10, 60, 0, 20, 30.0), WindowState(True, 0, 60.0)),  # 30 + 60 * (1 - 10/20)
        ((True, 10, 60, 20, 12, 30.0), WindowState(True, 0, 40.0)),  # over: 30 + 60 * (1 - 10/12)
    ],
)
def test_window_state_remaining_and_reset(
    args: tuple[bool, int, int, int, int, float], state: WindowState
) -> None:
    got = window_state(*args)
    assert (got.allowed, got.remaining) == (state.allowed, state.remaining)
    assert got.reset_s == pytest.approx(state.reset_s)


async def test_memory_spend_counters_add_up_rather_than_overwrite() -> None:
    counters = MemoryCounters(clock=Clock(1_000_000.0))
    await counters.settle([], [(DAY, 1_500), (MONTH, 1_500)])
    await counters.settle([], [(DAY, 250)])
    await counters.settle([], [(DAY, 0)])
    assert (await counters.hit([], [DAY, MONTH, "spend:client:other:day:2026-11-27"]))[1] == [1_750, 1_500, 0]


async def test_memory_spend_keys_are_bounded_oldest_first() -> None:
    counters = MemoryCounters(clock=Clock(1_000_000.0))
    await counters.settle([], [(f"spend:k{i}:day:d", 1) for i in range(MAX_LOCAL_SPEND_KEYS)])
    await counters.settle([], [("spend:k1:day:d", 1)])  # known: nothing is evicted
    assert (await counters.hit([], ["spend:k0:day:d", "spend:k1:day:d"]))[1] == [1, 2]
    await counters.settle([], [("spend:new:day:d", 5)])
    spent = (await counters.hit([], ["spend:k0:day:d", "spend:k1:day:d", "spend:new:day:d"]))[1]
    assert spent == [0, 2, 5]


async def test_memory_windows_are_bounded_oldest_first() -> None:
    counters = MemoryCounters(clock=Clock(1_000_000.0))
    full = [(Window(f"w{i}", 1, 60), 1) for i in range(MAX_LOCAL_WINDOWS)]
    states, _ = await counters.hit(full, [])
    assert all(s.allowed for s in states)
    (again,), _ = await counters.hit([(Window("w1", 1, 60), 0)], [])  # known: nothing is evicted
    assert again.remaining == 0
    await counters.hit([(Window("new", 1, 60), 1)], [])
    (second, first), _ = await counters.hit([(Window("w1", 1, 60), 0), (Window("w0", 1, 60), 0)], [])
    assert (first.remaining, second.remaining) == (1, 0)


@pytest.mark.parametrize(("share", "limit", "admitted"), [(1, 10, 10), (2, 10, 5), (3, 10, 3), (3, 2, 1)])
async def test_memory_share_divides_every_limit_and_keeps_at_least_one(
    share: int, limit: int, admitted: int
) -> None:
    counters = MemoryCounters(share=share, clock=Clock(1_000_000.0))
    window = Window("w", limit, 60)
    states = [(await counters.hit([(window, 1)], []))[0][0] for _ in range(limit + 2)]
    assert sum(s.allowed for s in states) == admitted
    assert states[0].remaining == admitted - 1


async def test_memory_windows_are_taken_all_or_none() -> None:
    counters = MemoryCounters(clock=Clock(1_000_000.0))
    roomy, tight = Window("roomy", 100, 60), Window("tight", 3, 60)
    (a, b), _ = await counters.hit([(roomy, 2), (tight, 3)], [])
    assert (a.allowed, a.remaining, b.allowed, b.remaining) == (True, 98, True, 0)
    (a, b), _ = await counters.hit([(roomy, 2), (tight, 1)], [])
    assert (a.allowed, b.allowed) == (True, False)
    assert (a.remaining, b.remaining) == (98, 0)  # the roomy window took nothing either
    (a,), _ = await counters.hit([(roomy, 98)], [])
    assert (a.allowed, a.remaining) == (True, 0)  # exactly the limit fits


async def test_memory_previous_window_weighs_only_the_next_window() -> None:
    clock = Clock(6_000.0)  # the start of a fixed 60 s window
    counters = MemoryCounters(clock=clock)
    window = Window("w", 10, 60)
    await counters.hit([(window, 10)], [])
    clock.now += 60 + 30  # half-way through the next window: 10 * 30/60 still weighs
    (state,), _ = await counters.hit([(window, 0)], [])
    assert state.remaining == 5
    clock.now += 60  # two windows on: nothing weighs
    (state,), _ = await counters.hit([(window, 0)], [])
    assert state.remaining == 10


async def test_memory_counts_two_windows_old_weigh_nothing() -> None:
    clock = Clock(6_000.0)
    counters = MemoryCounters(clock=clock)
    window = Window("w", 10, 60)
    await counters.hit([(window, 10)], [])
    clock.now += 120  # straight to the start of the window after next
    (state,), _ = await counters.hit([(window, 0)], [])
    assert state.remaining == 10


async def test_memory_corrections_add_and_give_back_but_never_below_zero() -> None:
    counters = MemoryCounters(clock=Clock(6_000.0))
    window = Window("w", 10, 60)
    await counters.hit([(window, 4)], [])
    await counters.settle([(window, 3)], [])
    assert (await counters.hit([(window, 0)], []))[0][0].remaining == 3
    await counters.settle([(window, -5)], [])
    assert (await counters.hit([(window, 0)], []))[0][0].remaining == 8
    await counters.settle([(window, -50)], [])
    assert (await counters.hit([(window, 0)], []))[0][0].remaining == 10
    await counters.settle([(window, 1)], [])
    assert (await counters.hit([(window, 0)], []))[0][0].remaining == 9


async def test_memory_aclose_forgets_the_windows() -> None:
    counters = MemoryCounters(clock=Clock(6_000.0))
    window = Window("w", 2, 60)
    await counters.hit([(window, 2)], [])
    await counters.aclose()
    assert (await counters.hit([(window, 0)], []))[0][0].remaining == 2


@pytest.fixture
async def client() -> AsyncIterator[aioredis.Redis]:
    async with fresh_db(13) as redis:
        yield redis


async def current(redis: aioredis.Redis, window: Window) -> int | None:
    value = await redis.get(window_keys(window.key)[1])
    return None if value is None else int(value)


async def test_redis_settlement_with_corrections_and_no_spend(client: aioredis.Redis) -> None:
    counters = RedisCounters(client)
    window, untouched = Window("w", 10, 60), Window("u", 10, 60)
    await counters.hit([(window, 4), (untouched, 1)], [])
    await counters.settle([(window, 3), (untouched, 0)], [])
    assert (await current(client, window), await current(client, untouched)) == (7, 1)
    await counters.settle([(window, -20)], [])  # never below zero
    assert await current(client, window) == 0
    fresh = Window("fresh", 10, 60)
    await counters.settle([(fresh, -2)], [])  # nothing to give back: no counter made
    assert await current(client, fresh) is None
    await counters.settle([(fresh, 2)], [])
    assert await current(client, fresh) == 2
    assert 0 < await client.pttl(window_keys("fresh")[1]) <= 120_000  # lives two windows
    assert await client.keys(spend_key("spend*")) == []


async def test_redis_spend_adds_up_and_expires_after_its_period(client: aioredis.Redis) -> None:
    counters = RedisCounters(client)
    window = Window("w", 10, 60)
    await counters.settle([], [(DAY, 1_500), (MONTH, 1_500)])
    await counters.settle([(window, 2)], [(DAY, 250)])
    assert (await counters.hit([], [DAY, MONTH, "spend:client:c2:day:2026-11-27"]))[1] == [1_750, 1_500, 0]
    assert await current(client, window) == 2
    day_ttl, month_ttl = await client.ttl(spend_key(DAY)), await client.ttl(spend_key(MONTH))
    assert SPEND_TTL_S["day"] - 5 <= day_ttl <= SPEND_TTL_S["day"]
    assert SPEND_TTL_S["month"] - 5 <= month_ttl <= SPEND_TTL_S["month"]


async def test_redis_settlement_with_nothing_moved_sends_nothing() -> None:
    """No corrections that move a counter and no spend: no round trip (this Redis is not there)."""
    client = aioredis.from_url(f"redis://127.0.0.1:{free_port()}/0")
    counters = RedisCounters(client)
    try:
        await counters.settle([], [])
        await counters.settle([(Window("w", 10, 60), 0)], [])
        with pytest.raises(redis.exceptions.ConnectionError):
            await counters.settle([(Window("w", 10, 60), 1)], [])
        with pytest.raises(redis.exceptions.ConnectionError):
            await counters.settle([], [(DAY, 1)])
    finally:
        await counters.aclose()


async def test_redis_hit_reports_state_and_reloads_a_flushed_script(client: aioredis.Redis) -> None:
    counters = RedisCounters(client)
    window = Window("w", 3, 60)
    await counters.settle([], [(DAY, 9)])
    states, spend = await counters.hit([(window, 2)], [DAY])
    assert (states[0].allowed, states[0].remaining, states[0].reset_s, spend) == (True, 1, 0.0, [9])
    (one, two), spent = await counters.hit([(Window("a", 5, 60), 1), (Window("b", 7, 60), 3)], [DAY])
    assert (one.remaining, two.remaining, spent) == (4, 4, [9])
    await client.script_flush()
    (state,), _ = await counters.hit([(window, 2)], [])
    assert (state.allowed, state.remaining) == (False, 1)
    (state,), _ = await counters.hit([(window, 1)], [])
    assert (state.allowed, state.remaining) == (True, 0)
    assert 59 < state.reset_s <= 60  # full: frees up once the counter turns previous


async def test_redis_current_counter_turns_previous_with_one_window_left(client: aioredis.Redis) -> None:
    counters = RedisCounters(client)
    window = Window("w", 4, 60)
    await counters.hit([(window, 4)], [])
    key = window_keys("w")[1]
    await client.pexpire(key, 40_000)  # as if 80 s had passed: it turns previous on the next hit
    (state,), _ = await counters.hit([(window, 0)], [])
    assert (state.allowed, state.remaining, state.reset_s) == (True, 2, 0.0)  # 4 * 40/60 weighs 2
    assert (await client.get(key + "/-1"), await client.get(key)) == (b"4", b"0")


async def test_redis_reset_without_a_current_counter_reads_the_previous(client: aioredis.Redis) -> None:
    counters = RedisCounters(client)
    await client.set(window_keys("w")[0], 8, px=30_000)
    (state,), _ = await counters.hit([(Window("w", 2, 60), 0)], [])
    assert (state.allowed, state.remaining) == (False, 0)  # 8 * 30/60 = 4 > 2
    assert 14 < state.reset_s <= 15  # 30 s left of the previous window, 2 of its 8 to fade: 30 - 15
