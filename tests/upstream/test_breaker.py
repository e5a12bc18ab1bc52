"""Breaker semantics (issue #11 findings 3 and 4) on both stores, memory and a real Redis, with an
injected clock: rate over a sliding window with a minimum volume, optional streak, epochs so that
only the half-open trial moves an open breaker."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from structlog.testing import capture_logs

from proxy.policy.model import BreakerPolicy, Failover, Target, Timeouts
from proxy.state.memory import MemoryBreakerStore
from proxy.state.redis_client import RedisOptions
from proxy.state.redis_store import RedisBreakerStore
from proxy.state.store import BreakerStore
from proxy.upstream.base import ProviderError
from proxy.upstream.breaker import Breakers, Ticket
from proxy.upstream.router import Router, RungFailed
from tests.support.redis_db import fresh_db
from tests.support.redis_server import redis_url
from tests.upstream.test_router import Clock, ScriptedProvider, run

REDIS_URL = redis_url(15)
DEFAULT = BreakerPolicy()
T = "p/m"


@pytest.fixture(params=["memory", "redis"])
async def store(request: pytest.FixtureRequest) -> AsyncIterator[BreakerStore]:
    if request.param == "memory":
        yield MemoryBreakerStore()
        return
    async with fresh_db(15):
        redis_store = RedisBreakerStore(RedisOptions(REDIS_URL))
        yield redis_store
        assert not redis_store.degraded, "the test ran on the memory fallback, not on Redis"
        await redis_store.aclose()


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def breakers(store: BreakerStore, clock: Clock) -> Breakers:
    return Breakers(store, clock=clock, refresh_s=0)


async def outcomes(b: Breakers, policy: BreakerPolicy, *failed: bool, protect: bool = False) -> None:
    for fail in failed:
        ticket = await b.admit(T, policy, 1.0)
        assert ticket.admission == "closed"
        await b.record(T, ticket, policy, failed=fail, protect=protect)


async def admission(b: Breakers, policy: BreakerPolicy = DEFAULT) -> str:
    return (await b.admit(T, policy, 1.0)).admission


async def test_a_success_admitted_before_the_breaker_opened_never_closes_it(breakers: Breakers) -> None:
    in_flight = [await breakers.admit(T, DEFAULT, 1.0) for _ in range(5)]
    await outcomes(breakers, DEFAULT, *[True] * DEFAULT.min_requests)
    assert await admission(breakers) == "open"
    for ticket in in_flight:  # requests sent before it opened answer now: they move nothing
        await breakers.record(T, ticket, DEFAULT, failed=False)
    assert await admission(breakers) == "open"


async def test_only_the_trial_closes_an_open_breaker(breakers: Breakers, clock: Clock) -> None:
    policy = BreakerPolicy(min_requests=2, open_s=10, half_open_requests=2)
    await outcomes(breakers, policy, True, True)
    stale = Ticket("closed", 0)
    clock.now += 10
    first, second = await breakers.admit(T, policy, 1.0), await breakers.admit(T, policy, 1.0)
    assert (first.admission, second.admission) == ("trial", "trial")
    assert await admission(breakers, policy) == "open"  # half_open_requests trials, no more
    await breakers.record(T, stale, policy, failed=False)
    await breakers.record(T, first, policy, failed=False)
    assert await admission(breakers, policy) == "open"  # one of two trials succeeded: still open
    await breakers.record(T, second, policy, failed=False)
    assert await admission(breakers, policy) == "closed"


async def test_a_failed_trial_reopens_for_open_s_and_late_tickets_of_it_are_ignored(
    breakers: Breakers, clock: Clock
) -> None:
    policy = BreakerPolicy(min_requests=1, open_s=10, half_open_requests=2)
    await outcomes(breakers, policy, True)
    clock.now += 10
    first, second = await breakers.admit(T, policy, 1.0), await breakers.admit(T, policy, 1.0)
    await breakers.record(T, first, policy, failed=True)
    ticket = await breakers.admit(T, policy, 1.0)
    assert ticket.admission == "open" and ticket.retry_in == pytest.approx(10)
    await breakers.record(T, second, policy, failed=False)  # a trial of the previous open period
    clock.now += 9.5
    assert (await breakers.admit(T, policy, 1.0)).retry_in == pytest.approx(0.5)
    clock.now += 0.5
    assert await admission(breakers, policy) == "trial"


async def test_the_rate_opens_only_once_the_window_holds_min_requests(breakers: Breakers) -> None:
    await outcomes(breakers, DEFAULT, *[True] * (DEFAULT.min_requests - 1))
    assert await admission(breakers) == "closed"  # 100% failures, but too few to judge
    await outcomes(breakers, DEFAULT, True)
    assert await admission(breakers) == "open"


async def test_failures_below_the_rate_never_open_whatever_the_volume(breakers: Breakers) -> None:
    await outcomes(breakers, DEFAULT, *([True, False, False] * 100))
    assert await admission(breakers) == "closed"  # a third of 300 outcomes fail


async def test_failures_leave_the_window_after_window_s(breakers: Breakers, clock: Clock) -> None:
    await outcomes(breakers, DEFAULT, *[False] * 16, *[True] * 14)
    clock.now += DEFAULT.window_s  # those 30 outcomes age out
    await outcomes(breakers, DEFAULT, *[False] * 10, *[True] * 9)
    assert await admission(breakers) == "closed"  # 9 of 19: too few to judge
    await outcomes(breakers, DEFAULT, True)
    assert await admission(breakers) == "open"  # 10 of 20 in the window (24 of 50 without the slide)


async def test_consecutive_failures_open_but_never_the_last_healthy_target_below_the_rate(
    breakers: Breakers,
) -> None:
    policy = BreakerPolicy(consecutive_failures=3)
    await outcomes(breakers, policy, *[False] * 10, True, True, True, protect=True)
    assert await admission(breakers, policy) == "closed"  # 3 in a row, but 3 of 13 < 50%
    await outcomes(breakers, policy, True, protect=False)
    assert await admission(breakers, policy) == "open"  # another target of the rung is healthy


FAILOVER = Failover(retries=2, timeouts=Timeouts(5, 600), breaker=BreakerPolicy(open_s=30))


async def test_a_provider_failing_every_request_is_skipped_after_min_requests_calls_then_probed_per_open_s(
    store: BreakerStore, clock: Clock
) -> None:
    router = Router(Breakers(store, clock=clock), clock=clock, sleep=clock.sleep, rng=lambda: 0.0)
    dead = ScriptedProvider(*[ProviderError("server_error", "503", status=503)] * 1000)
    healthy = ScriptedProvider(*["ok"] * 1000)
    rung = [Target("dead", "m"), Target("ok", "m")]
    providers = {"dead": dead, "ok": healthy}
    for _ in range(40):
        await run(router, providers, rung, FAILOVER, deadline=clock.now + 60)
    assert len(dead.calls) == FAILOVER.breaker.min_requests
    for _ in range(3):  # three open periods of 30 s, a request every second
        for _ in range(30):
            clock.now += 1
            await run(router, providers, rung, FAILOVER, deadline=clock.now + 60)
    assert len(dead.calls) == FAILOVER.breaker.min_requests + 3  # one trial per open_s, no retries
    assert len(healthy.calls) == 40 + 90


async def test_an_open_breaker_refusal_says_when_its_trial_comes(store: BreakerStore, clock: Clock) -> None:
    router = Router(Breakers(store, clock=clock), clock=clock, sleep=clock.sleep, rng=lambda: 0.0)
    failover = Failover(retries=0, breaker=BreakerPolicy(min_requests=1, open_s=30))
    with pytest.raises(RungFailed):
        await run(
            router, {"a": ScriptedProvider(ProviderError("connect", "down"))}, [Target("a", "m")], failover
        )
    clock.now += 12
    with pytest.raises(RungFailed) as info:
        await run(router, {"a": ScriptedProvider()}, [Target("a", "m")], failover)
    (skip,) = info.value.failures
    assert skip.kind == "circuit_open" and skip.retry_after == pytest.approx(18)


# --- exact tickets, transitions, logs, the local read cache ----------------------------------------


class Transitions(list[tuple[str, str]]):
    def __call__(self, target: str, to: str) -> None:
        self.append((target, to))


async def test_tickets_transitions_and_logs_through_open_trial_reopen_and_close(
    store: BreakerStore, clock: Clock
) -> None:
    seen = Transitions()
    breakers = Breakers(store, clock=clock, refresh_s=0, on_transition=seen)
    policy = BreakerPolicy(min_requests=1, open_s=10)
    first = await breakers.admit(T, policy, 2.0)
    assert first == Ticket("closed", 0)
    with capture_logs() as logs:
        await breakers.record(T, first, policy, failed=True)
    assert logs == [
        {
            "event": "proxy.breaker_opened",
            "log_level": "warning",
            "target": T,
            "open_until": 1010.0,
            "epoch": 1,
        }
    ]
    assert seen == [(T, "open")] and breakers.is_open(T)
    assert await breakers.admit(T, policy, 2.0) == Ticket("open", 1, 10.0)
    await breakers.record(T, first, policy, failed=True)  # a late outcome of the closed epoch
    assert seen == [(T, "open")]
    clock.now = 1010.0  # open_s passed: the trial
    trial = await breakers.admit(T, policy, 2.0)
    assert trial == Ticket("trial", 1)
    assert await breakers.admit(T, policy, 2.0) == Ticket("open", 1, 2.0)  # the trial is under way
    await breakers.record(T, trial, policy, failed=True)  # the trial fails: open again, a new epoch
    assert seen == [(T, "open"), (T, "open")]
    clock.now = 1020.0
    trial = await breakers.admit(T, policy, 2.0)
    assert trial == Ticket("trial", 2)
    with capture_logs() as logs:
        await breakers.record(T, trial, policy, failed=False)
    assert logs == [{"event": "proxy.breaker_closed", "log_level": "info", "target": T, "epoch": 2}]
    assert seen == [(T, "open"), (T, "open"), (T, "closed")]
    assert not breakers.is_open(T) and breakers.snapshot() == {T: False}


async def test_a_streak_opens_unless_the_caller_protects_the_target(breakers: Breakers) -> None:
    policy = BreakerPolicy(consecutive_failures=2)
    await outcomes(breakers, policy, *[False] * 10)  # 2 failures of 12 stay under the rate
    for _ in range(2):
        ticket = await breakers.admit(T, policy, 1.0)
        await breakers.record(T, ticket, policy, failed=True)  # protect defaults to False
    assert await admission(breakers, policy) == "open"


async def test_the_clock_origin_does_not_matter(store: BreakerStore) -> None:
    """Times are compared, never assumed large: a clock starting at 0 with open_s < 1 works."""
    clock = Clock()
    clock.now = 0.0
    seen = Transitions()
    breakers = Breakers(store, clock=clock, refresh_s=0, on_transition=seen)
    policy = BreakerPolicy(min_requests=1, open_s=0.5)
    stale = await breakers.admit(T, policy, 0.1)
    await breakers.record(T, stale, policy, failed=True)
    assert breakers.is_open(T) and breakers.snapshot() == {T: True}
    assert await breakers.admit(T, policy, 0.1) == Ticket("open", 1, 0.5)
    await breakers.record(T, stale, policy, failed=True)  # late: moves nothing
    clock.now = 0.5
    assert breakers.snapshot() == {T: False}  # open until 0.5, not at 0.5
    trial = await breakers.admit(T, policy, 0.1)
    await breakers.record(T, trial, policy, failed=False)
    assert seen == [(T, "open"), (T, "closed")]


async def test_nothing_is_open_before_anything_was_read(breakers: Breakers) -> None:
    assert not breakers.is_open(T) and breakers.snapshot() == {}
    await outcomes(breakers, DEFAULT, False)
    assert not breakers.is_open(T) and breakers.snapshot() == {T: False}


async def test_state_is_read_through_a_local_cache_for_refresh_s(store: BreakerStore, clock: Clock) -> None:
    """Another replica opens the breaker in the shared store: this one sees it once its cached read
    is ``refresh_s`` old, not before (the hot path does not wait on Redis every request)."""
    policy = BreakerPolicy(min_requests=1, open_s=30)
    here = Breakers(store, clock=clock, refresh_s=0.5)
    there = Breakers(store, clock=clock, refresh_s=0.5)
    assert await admission(here, policy) == "closed"  # read at 1000.0
    await outcomes(there, policy, True)
    assert await admission(there, policy) == "open"
    clock.now = 1000.49
    assert await admission(here, policy) == "closed"  # still the cached read
    assert not here.is_open(T)
    clock.now = 1000.5
    assert await admission(here, policy) == "open"
    assert here.is_open(T)


async def test_outcomes_on_a_closed_breaker_signal_nothing(store: BreakerStore, clock: Clock) -> None:
    seen = Transitions()
    breakers = Breakers(store, clock=clock, refresh_s=0, on_transition=seen)
    with capture_logs() as logs:
        await outcomes(breakers, DEFAULT, False, True, False)
    assert (seen, logs) == ([], [])
