"""The sliding-window counters: exact in memory with an injected clock, and the same answers
from the Redis script (real Redis: the suite's own, tests.support.redis_server)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from proxy.clients import caller_of
from proxy.limits.limiter import Admission, Limited, ratelimit_headers
from proxy.limits.windows import KEY_PREFIX, MemoryCounters, RedisCounters, Window, WindowState
from tests.support.redis_db import fresh_db
from tests.support.redis_server import redis_url

REDIS_URL = redis_url(14)


class Clock:
    def __init__(self, now: float = 1_000_020.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


@pytest.fixture
async def redis_counters() -> AsyncIterator[RedisCounters]:
    async with fresh_db(14, match=f"*{KEY_PREFIX}*test*") as client:
        yield RedisCounters(client)  # fresh_db closes the client it shares


async def admitted(counters: MemoryCounters | RedisCounters, window: Window, count: int) -> int:
    states = [(await counters.hit([(window, 1)], []))[0][0] for _ in range(count)]
    return sum(s.allowed for s in states)


async def test_60_rpm_admits_60_in_a_minute_and_slides_with_the_clock() -> None:
    clock = Clock(1_000_020.0 + 20)  # 20 s into a fixed window
    counters = MemoryCounters(clock=clock)
    window = Window("test:a:req", 60, 60)
    assert await admitted(counters, window, 80) == 60
    (state,), _ = await counters.hit([(window, 0)], [])
    assert state.remaining == 0 and state.reset_s == pytest.approx(40)
    clock.now += 60  # one window later the previous one still weighs (60 - 20) / 60 of its 60
    (state,), _ = await counters.hit([(window, 0)], [])
    assert state.remaining == 20
    clock.now += 30  # half its weight is gone: 10 of its 60 remain in the window, with 20 taken
    assert await admitted(counters, window, 0) == 0
    (state,), _ = await counters.hit([(window, 0)], [])
    assert state.remaining == 50
    assert await admitted(counters, window, 80) == 50
    (state,), _ = await counters.hit([(window, 0)], [])
    assert state.remaining == 0 and state.reset_s == pytest.approx(0.0)  # the fade has begun
    clock.now += 0.5  # the previous window's 60 fade by one a second: half of one is enough
    assert await admitted(counters, window, 2) == 1
    clock.now += 120  # two windows later nothing is left of it
    assert await admitted(counters, window, 80) == 60


async def test_a_request_takes_from_every_window_or_from_none() -> None:
    counters = MemoryCounters(clock=Clock())
    small, large = Window("test:s", 2, 60), Window("test:l", 100, 60)
    results = [(await counters.hit([(large, 1), (small, 1)], []))[0] for _ in range(3)]
    assert [[s.allowed for s in r] for r in results] == [[True, True], [True, True], [True, False]]
    assert results[-1][0].remaining == 98  # the refused request took nothing from the large window


async def test_a_share_divides_the_limit_and_corrections_move_the_window() -> None:
    counters = MemoryCounters(share=3, clock=Clock())
    window = Window("test:t", 90, 60)
    assert await admitted(counters, window, 40) == 30
    await counters.settle([(window, -10)], [("spend:client:a:day:2026-01-01", 1500)])
    (state,), spent = await counters.hit([(window, 0)], ["spend:client:a:day:2026-01-01"])
    assert state.remaining == 10 and spent == [1500]


async def test_the_redis_script_admits_exactly_the_limit_and_all_or_none(
    redis_counters: RedisCounters,
) -> None:
    window = Window("test:r:req", 60, 60)
    assert await admitted(redis_counters, window, 80) == 60
    small, large = Window("test:r:s", 2, 60), Window("test:r:l", 100, 60)
    results = [(await redis_counters.hit([(large, 1), (small, 1)], []))[0] for _ in range(3)]
    assert [[s.allowed for s in r] for r in results] == [[True, True], [True, True], [True, False]]
    assert results[-1][0].remaining == 98
    tokens = Window("test:r:tok", 1000, 60)
    (state,), _ = await redis_counters.hit([(tokens, 300)], [])
    assert state.remaining == 700
    await redis_counters.settle([(tokens, -100)], [("spend:client:test-r:day:2026-01-01", 2500)])
    await redis_counters.settle([(tokens, -10_000)], [("spend:client:test-r:day:2026-01-01", 2500)])
    (state,), spent = await redis_counters.hit([(tokens, 0)], ["spend:client:test-r:day:2026-01-01"])
    assert state.remaining == 1000  # never below zero
    assert spent == [5000]


async def test_reset_is_the_time_until_the_window_is_full_again() -> None:
    """OpenAI's ``x-ratelimit-reset-*`` is the time until the limit is back to its initial state:
    never ``0ms`` while units are taken (LiteLLM's router and the SDKs pace on it)."""
    clock = Clock(1_000_020.0 + 20)  # 20 s into a fixed window: 40 s left
    counters = MemoryCounters(clock=clock)
    window = Window("test:full", 60, 60)
    (state,), _ = await counters.hit([(window, 10)], [])
    # the 10 units move to the previous window in 40 s, then weigh below one after 54 s more
    assert state.remaining == 50 and state.full_s == pytest.approx(40 + 60 - 6)
    assert ratelimit_headers(_admission(window, state))["x-ratelimit-reset-requests"] == "1m34s"
    clock.now += 60  # now only the previous window's 10 weigh, at 40 / 60
    (state,), _ = await counters.hit([(window, 0)], [])
    assert state.remaining == 54 and state.full_s == pytest.approx(40 - 6)
    clock.now += 40 - 6 + 0.001
    (state,), _ = await counters.hit([(window, 0)], [])
    assert state.remaining == 60 and state.full_s == 0.0
    assert ratelimit_headers(_admission(window, state))["x-ratelimit-reset-requests"] == "0ms"


def _admission(window: Window, state: WindowState) -> Admission:
    return Admission(caller_of(None, {}, keyed=False), (Limited("client", "requests", window, 1, state),))
