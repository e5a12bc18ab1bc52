"""The router and breaker pieces in isolation: real objects, a recorded clock instead of sleeping."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest

from proxy.policy.model import Backoff, BreakerPolicy, Failover, ProviderConfig, RetryBudget, Target, Timeouts
from proxy.state.memory import MemoryBreakerStore
from proxy.upstream.base import CallInfo, ProviderError
from proxy.upstream.breaker import Breakers
from proxy.upstream.router import RetryBudgetTracker, Router, RungFailed, Try, backoff_s


class ScriptedProvider:
    """A provider whose answers are a list: values are returned, ProviderErrors raised."""

    def __init__(self, *outcomes: Any) -> None:
        self.config = ProviderConfig("p", "offline")
        self.outcomes = list(outcomes)
        self.calls: list[float] = []

    async def complete(
        self, body: dict[str, Any], model: str, ctx: CallInfo, timeout: float
    ) -> dict[str, Any]:
        self.calls.append(timeout)
        outcome = self.outcomes.pop(0)
        if isinstance(outcome, ProviderError):
            raise outcome
        return {"model": model, "value": outcome}

    async def relay(self, body: dict[str, Any], model: str, ctx: CallInfo, timeout: float) -> bytes:
        return b"{}"

    async def stream(
        self, body: dict[str, Any], model: str, ctx: CallInfo, timeout: float, *, bound_reads: bool = True
    ) -> AsyncIterator[bytes]:
        yield b""


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0
        self.slept: list[float] = []

    def __call__(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds


def make_router(clock: Clock) -> Router:
    return Router(
        Breakers(MemoryBreakerStore(), clock=clock), clock=clock, sleep=clock.sleep, rng=lambda: 1.0
    )


FAILOVER = Failover(
    retries=2,
    backoff=Backoff(100, 1000),
    timeouts=Timeouts(5, 60),
    breaker=BreakerPolicy(consecutive_failures=3, window_s=30, open_s=10),
    budget=RetryBudget(20, 3),
)


async def run(
    router: Router,
    providers: dict[str, Any],
    targets: list[Target],
    failover: Failover = FAILOVER,
    deadline: float = 1060.0,
) -> tuple[Any, list[Try]]:
    tries: list[Try] = []

    async def op(provider: Any, target: Target, timeout: float) -> Any:
        return await provider.complete({}, target.model, CallInfo(), timeout)

    routed = await router.call(targets, providers, op, failover, deadline, tries.append)
    return routed, tries


async def test_retries_with_exponential_backoff_then_succeeds() -> None:
    clock = Clock()
    p = ScriptedProvider(ProviderError("server_error", "boom"), ProviderError("connect", "down"), "ok")
    routed, tries = await run(make_router(clock), {"a": p}, [Target("a", "m")])
    assert routed.value["value"] == "ok"
    assert clock.slept == [0.1, 0.2]  # full jitter with rng=1.0: the ceilings base*2**n
    assert [t.retry for t in tries] == [False, True, True]


async def test_retry_after_wins_over_backoff_and_is_read_on_every_attempt() -> None:
    clock = Clock()
    p = ScriptedProvider(
        ProviderError("rate_limited", "slow down", retry_after=3),
        ProviderError("rate_limited", "still", retry_after=7),
        "ok",
    )
    await run(make_router(clock), {"a": p}, [Target("a", "m")])
    assert clock.slept == [3 + 1, 7 + 1]  # Retry-After plus the jitter (rng 1.0 x max_ms 1 s)


async def test_a_wait_past_the_deadline_fails_over_instead() -> None:
    clock = Clock()
    a = ScriptedProvider(ProviderError("rate_limited", "later", retry_after=100))
    b = ScriptedProvider("from b")
    routed, _ = await run(make_router(clock), {"a": a, "b": b}, [Target("a", "m"), Target("b", "m")])
    assert routed.target == Target("b", "m") and clock.slept == []


async def test_targets_are_visited_once_a_fallback_never_restarts_counts() -> None:
    clock = Clock()
    errors = [ProviderError("server_error", f"e{i}") for i in range(3)]
    a, b = ScriptedProvider(*errors), ScriptedProvider(*errors)
    with pytest.raises(RungFailed) as info:
        await run(make_router(clock), {"a": a, "b": b}, [Target("a", "m"), Target("b", "m")])
    assert len(a.calls) == 3 and len(b.calls) == 3  # 1 + retries each, never back to a
    assert len(info.value.failures) == 6


async def test_non_retryable_failure_fails_over_at_once() -> None:
    clock = Clock()
    a = ScriptedProvider(ProviderError("client_error", "bad request", status=400))
    b = ScriptedProvider("ok")
    routed, _ = await run(make_router(clock), {"a": a, "b": b}, [Target("a", "m"), Target("b", "m")])
    assert len(a.calls) == 1 and routed.target.provider == "b"


async def test_per_try_timeout_is_capped_by_the_remaining_deadline() -> None:
    clock = Clock()
    p = ScriptedProvider("ok")
    await run(make_router(clock), {"a": p}, [Target("a", "m")], deadline=clock.now + 2)
    assert p.calls == [2.0]


async def test_spent_deadline_stops_everything() -> None:
    clock = Clock()
    with pytest.raises(RungFailed) as info:
        await run(make_router(clock), {"a": ScriptedProvider("ok")}, [Target("a", "m")], deadline=clock.now)
    assert info.value.deadline_spent


def test_retry_budget_is_a_share_of_requests_in_flight() -> None:
    budget = RetryBudget(percent=20, min_concurrency=3)
    tracker = RetryBudgetTracker()
    tracker.requests, tracker.retries = 100, 19
    assert tracker.allows_retry(budget, granted=1)
    tracker.retries = 20
    assert not tracker.allows_retry(budget, granted=1)
    tracker.requests, tracker.retries = 1, 2
    assert tracker.allows_retry(budget, granted=1)  # min_concurrency always allowed


@pytest.mark.parametrize(
    ("min_per_target", "granted", "allowed"),
    [(1, 0, True), (1, 1, False), (2, 1, True), (2, 2, False), (0, 0, False)],
)
def test_a_requests_first_retries_are_outside_the_shared_budget(
    min_per_target: int, granted: int, allowed: bool
) -> None:
    """#29.3: the shared budget is full (16 requests, 4 retries in flight against 20% and 3), yet a
    request that has had fewer than ``min_per_target`` retries may retry."""
    budget = RetryBudget(percent=20, min_concurrency=3, min_per_target=min_per_target)
    tracker = RetryBudgetTracker()
    tracker.requests, tracker.retries = 16, 4
    assert tracker.allows_retry(budget, granted) is allowed


NO_SHARED_BUDGET = Failover(
    retries=2, backoff=Backoff(100, 1000), timeouts=Timeouts(5, 60), budget=RetryBudget(0, 0, 1)
)


async def test_a_burst_of_failures_each_gets_its_floor_retry_and_no_more() -> None:
    """16 requests fail at once with a shared budget of nothing: each still retries once (the floor
    is per request and target, so the burst cannot use it up); a second retry is the shared budget's to give,
    and is refused."""
    clock = Clock()
    router = make_router(clock)
    once = [ScriptedProvider(ProviderError("server_error", "boom"), "ok") for _ in range(16)]
    results = await asyncio.gather(  # a target each: the breaker stays out of it
        *(
            run(router, {f"p{i}": p}, [Target(f"p{i}", "m")], NO_SHARED_BUDGET, clock.now + 60)
            for i, p in enumerate(once)
        )
    )
    assert all(routed.value["value"] == "ok" for routed, _ in results)
    twice = ScriptedProvider(ProviderError("server_error", "1"), ProviderError("server_error", "2"), "ok")
    with pytest.raises(RungFailed):
        await run(router, {"a": twice}, [Target("a", "m")], NO_SHARED_BUDGET, clock.now + 60)
    assert len(twice.calls) == 2
    assert router.budget.retries == 0 and router.budget.requests == 0  # nothing leaks


async def test_the_floor_is_per_target() -> None:
    """The floor retry spent on the first target leaves the second target its own: a request that
    failed over is not left with first tries only when the shared budget gives nothing."""
    clock = Clock()
    a = ScriptedProvider(ProviderError("server_error", "a1"), ProviderError("server_error", "a2"))
    b = ScriptedProvider(ProviderError("server_error", "b1"), "ok")
    routed, _ = await run(
        make_router(clock), {"a": a, "b": b}, [Target("a", "m"), Target("b", "m")], NO_SHARED_BUDGET
    )
    assert routed.value["value"] == "ok"
    assert (len(a.calls), len(b.calls)) == (2, 2)


DEFAULT_BREAKER = Failover(retries=2, backoff=Backoff(100, 1000), timeouts=Timeouts(5, 60))


async def test_an_always_failing_target_gets_min_requests_tries_then_one_trial_per_open_s() -> None:
    """#29.3: the budget's floor adds retries, yet a target failing every request is tried exactly
    ``min_requests`` times (retries included) before its breaker opens, then once per ``open_s`` (the
    half-open trial, never retried), one request at a time."""
    clock = Clock()
    router = make_router(clock)
    policy = DEFAULT_BREAKER.breaker
    dead = ScriptedProvider(*(ProviderError("server_error", f"down {i}") for i in range(100)))
    for _ in range(policy.min_requests):  # more requests than it takes
        with pytest.raises(RungFailed):
            await run(router, {"a": dead}, [Target("a", "m")], DEFAULT_BREAKER, clock.now + 60)
    assert len(dead.calls) == policy.min_requests
    clock.now += policy.open_s
    for _ in range(3):
        with pytest.raises(RungFailed):
            await run(router, {"a": dead}, [Target("a", "m")], DEFAULT_BREAKER, clock.now + 60)
    assert len(dead.calls) == policy.min_requests + 1  # one trial, not retried; then open again


def test_backoff_never_exceeds_the_cap() -> None:
    assert backoff_s(FAILOVER, 10, lambda: 1.0) == 1.0
    assert backoff_s(FAILOVER, 0, lambda: 0.0) == 0.0


async def test_rate_limits_and_client_errors_do_not_count_against_the_breaker() -> None:
    clock = Clock()
    router = make_router(clock)
    failover = Failover(retries=0, breaker=BreakerPolicy(consecutive_failures=1))
    for error in (ProviderError("rate_limited", "429"), ProviderError("client_error", "400", status=400)):
        with pytest.raises(RungFailed):
            await run(router, {"a": ScriptedProvider(error)}, [Target("a", "m")], failover)
    assert (await router.breakers.admit("a/m", failover.breaker, 1.0)).admission == "closed"
    with pytest.raises(RungFailed):
        await run(
            router,
            {"a": ScriptedProvider(ProviderError("server_error", "500"))},
            [Target("a", "m")],
            failover,
        )
    assert (await router.breakers.admit("a/m", failover.breaker, 1.0)).admission == "open"
