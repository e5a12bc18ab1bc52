"""The in-process breaker store's decisions (``proxy.state.memory``), driven directly with explicit
times: when the rate or the streak opens a target, which outcomes move nothing, how the half-open
trials are handed out and how the sliding window forgets. ``tests/upstream/test_breaker.py`` runs
the same semantics through ``Breakers`` on this store and on Redis."""

from __future__ import annotations

import pytest

from proxy.policy.model import BreakerPolicy
from proxy.state.memory import MemoryBreakerStore
from proxy.state.store import BreakerState, Outcome

T = "p/m"
RATE = BreakerPolicy(failure_rate=0.5, min_requests=4, window_s=20.0, open_s=5.0)
STREAK = BreakerPolicy(failure_rate=0.5, min_requests=100, window_s=20.0, open_s=5.0, consecutive_failures=3)


async def closed(store: MemoryBreakerStore, policy: BreakerPolicy, *failed: bool, now: float = 0.0,
                 epoch: int = 0, protect: bool = False) -> BreakerState:  # fmt: skip
    """Record ordinary (non-trial) outcomes; the state after the last."""
    state = BreakerState()
    for fail in failed:
        state = await store.record(T, Outcome(epoch, False, fail, protect), now, policy)
    return state


async def trial(
    store: MemoryBreakerStore, policy: BreakerPolicy, epoch: int, failed: bool, now: float
) -> BreakerState:
    return await store.record(T, Outcome(epoch, True, failed), now, policy)


async def opened(policy: BreakerPolicy = RATE, store: MemoryBreakerStore | None = None) -> MemoryBreakerStore:
    """A store whose target the policy has just opened at 0.0 (epoch 1)."""
    store = store or MemoryBreakerStore()
    failures = max(policy.min_requests, policy.consecutive_failures or 0)
    assert await closed(store, policy, *[True] * failures) == BreakerState(1, policy.open_s)
    return store


async def test_an_unknown_target_is_closed_at_epoch_zero() -> None:
    store = MemoryBreakerStore()
    assert await store.state(T) == BreakerState(0, 0.0)
    await store.aclose()
    assert await store.state(T) == BreakerState()


async def test_the_rate_opens_at_min_requests_and_the_failure_rate_not_before() -> None:
    store = MemoryBreakerStore()
    assert await closed(store, RATE, False, False, True, now=1.0) == BreakerState(0, 0.0)  # 3 < min_requests
    assert await closed(store, RATE, True, now=2.0) == BreakerState(1, 7.0)  # 2 of 4: exactly the rate
    assert await store.state(T) == BreakerState(1, 7.0)


async def test_a_share_below_the_rate_never_opens() -> None:
    store = MemoryBreakerStore()
    assert await closed(store, RATE, False, False, False, True, True) == BreakerState()  # 2 of 5
    assert await closed(store, RATE, True) == BreakerState(1, 5.0)  # 3 of 6


async def test_successes_alone_never_open() -> None:
    store = MemoryBreakerStore()
    assert await closed(store, RATE, *[False] * 10) == BreakerState()


async def test_a_success_resets_the_failure_streak() -> None:
    store = MemoryBreakerStore()
    assert await closed(store, STREAK, True, True, False, True, True) == BreakerState()
    assert await closed(store, STREAK, True, now=3.0) == BreakerState(1, 8.0)  # three in a row


async def test_the_streak_of_a_protected_target_opens_only_at_the_failure_rate() -> None:
    below, at = (False, False, False, False, True, True, True), (False, False, False, True, True, True)
    assert await closed(MemoryBreakerStore(), STREAK, *below, protect=True) == BreakerState()  # 3 of 7
    assert await closed(MemoryBreakerStore(), STREAK, *at, protect=True) == BreakerState(1, 5.0)  # 3 of 6
    assert await closed(MemoryBreakerStore(), STREAK, *below) == BreakerState(1, 5.0)


async def test_an_outcome_window_s_old_has_left_the_window() -> None:
    kept, dropped = MemoryBreakerStore(), MemoryBreakerStore()
    policy = BreakerPolicy(failure_rate=0.5, min_requests=2, window_s=20.0, open_s=5.0)
    for store, later in ((kept, 19.9), (dropped, 20.0)):  # buckets of 2 s: 9 and 10 after bucket 0
        await closed(store, policy, True, now=0.0)
        await closed(store, policy, False, False, now=later)
        await closed(store, policy, True, now=later + 0.05)
    assert await kept.state(T) == BreakerState(1, 24.95)  # 2 of 4 with the failure at 0
    assert await dropped.state(T) == BreakerState()  # 1 of 3


async def test_outcomes_of_another_epoch_or_out_of_place_trials_move_nothing() -> None:
    store = MemoryBreakerStore()
    policy = BreakerPolicy(failure_rate=0.5, min_requests=1, open_s=5.0)
    assert await store.record(T, Outcome(3, False, True), 0.0, policy) == BreakerState()  # stale epoch
    assert await trial(store, policy, 0, True, 0.0) == BreakerState()  # closed: a trial
    assert await store.record(T, Outcome(0, False, True), 1.0, policy) == BreakerState(1, 6.0)
    assert await store.record(T, Outcome(1, False, True), 7.0, policy) == BreakerState(1, 6.0)  # not a trial
    assert await store.record(T, Outcome(1, False, False), 7.0, policy) == BreakerState(1, 6.0)
    assert await trial(store, policy, 0, False, 7.0) == BreakerState(1, 6.0)  # old epoch


async def test_a_failed_trial_reopens_from_now_in_a_new_epoch() -> None:
    store = await opened()
    assert await trial(store, RATE, 1, True, 9.0) == BreakerState(2, 14.0)


async def test_all_half_open_requests_must_succeed_to_close() -> None:
    policy = BreakerPolicy(failure_rate=0.5, min_requests=4, open_s=5.0, half_open_requests=2)
    store = await opened(policy)
    assert await trial(store, policy, 1, False, 6.0) == BreakerState(1, 5.0)
    assert await trial(store, policy, 1, True, 6.0) == BreakerState(2, 11.0)
    assert await trial(store, policy, 2, False, 12.0) == BreakerState(2, 11.0)  # 1 of 2
    assert await trial(store, policy, 2, False, 12.0) == BreakerState(2, 0.0)


async def test_closing_starts_the_counts_afresh() -> None:
    policy = BreakerPolicy(failure_rate=0.5, min_requests=4, open_s=5.0, consecutive_failures=2)
    store = await opened(policy)
    assert await trial(store, policy, 1, False, 6.0) == BreakerState(1, 0.0)
    assert await closed(store, policy, True, now=7.0, epoch=1) == BreakerState(1, 0.0)  # streak of 1, 1 of 1
    assert await closed(store, policy, False, now=7.0, epoch=1) == BreakerState(1, 0.0)
    assert await closed(store, policy, True, now=7.0, epoch=1) == BreakerState(1, 0.0)  # 2 of 3, streak 1


async def test_a_trial_is_handed_out_once_the_open_period_ends() -> None:
    store = MemoryBreakerStore()
    assert not await store.try_trial(T, 0, 100.0, 10.0, 1)  # closed: no trial
    await opened(store=store)
    assert not await store.try_trial(T, 0, 5.0, 10.0, 1)  # an old epoch
    assert not await store.try_trial(T, 1, 4.99, 10.0, 1)  # still open
    assert await store.try_trial(T, 1, 5.0, 10.0, 1)
    assert not await store.try_trial(T, 1, 14.99, 10.0, 1)  # the one slot is held until 15
    assert await store.try_trial(T, 1, 15.0, 10.0, 1)  # its claim expired


@pytest.mark.parametrize("slots", [1, 2, 3])
async def test_trials_are_limited_to_the_slots(slots: int) -> None:
    store = await opened()
    granted = [await store.try_trial(T, 1, 6.0, 10.0, slots) for _ in range(slots + 2)]
    assert granted == [True] * slots + [False, False]


async def test_reopening_releases_the_trial_slots() -> None:
    store = await opened()
    assert await store.try_trial(T, 1, 5.0, 100.0, 1)
    await trial(store, RATE, 1, True, 6.0)
    assert await store.try_trial(T, 2, 11.0, 100.0, 1)


async def test_targets_are_kept_apart() -> None:
    store = await opened()
    assert await store.state("q/m") == BreakerState()
    assert await closed(store, RATE, True, True) == BreakerState(1, 5.0)  # the open one ignores epoch 0
