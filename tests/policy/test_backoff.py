"""One backoff: the router's retries and the review webhook's share ``Backoff.wait_s``."""

from __future__ import annotations

import functools

from proxy.policy.model import Backoff, Failover
from proxy.review import WEBHOOK_BACKOFF
from proxy.upstream.router import backoff_s, retry_wait_s


def test_full_jitter_is_uniform_under_a_doubling_ceiling() -> None:
    backoff = Backoff(base_ms=100.0, max_ms=1000.0)
    assert [backoff.wait_s(retry, lambda: 1.0) for retry in range(5)] == [0.1, 0.2, 0.4, 0.8, 1.0]
    assert backoff.wait_s(3, lambda: 0.5) == 0.4
    assert backoff.wait_s(3, lambda: 0.0) == 0.0


def test_the_router_waits_what_its_policy_backoff_says() -> None:
    failover = Failover(backoff=Backoff(base_ms=50.0, max_ms=300.0))
    assert backoff_s(failover, 2, lambda: 1.0) == failover.backoff.wait_s(2, lambda: 1.0) == 0.2


def test_the_webhook_ceilings_are_the_old_schedule() -> None:
    """0.2 s doubling, capped at 5 s: the ceilings of the webhook's former hand-written loop."""
    assert [WEBHOOK_BACKOFF.wait_s(a, lambda: 1.0) for a in range(7)] == [0.2, 0.4, 0.8, 1.6, 3.2, 5.0, 5.0]


def test_a_retry_after_wait_is_jittered_above_it_never_below() -> None:
    """``Retry-After: 1`` sent to many requests at once must not bring their retries back in one
    wave: the wait is Retry-After plus up to min(Retry-After, backoff.max_ms) of jitter."""
    failover = Failover(backoff=Backoff(base_ms=100.0, max_ms=2000.0))
    waits = [retry_wait_s(failover, 0, 1.0, functools.partial(float, r)) for r in (0.0, 0.25, 0.5, 1.0)]
    assert waits == [1.0, 1.25, 1.5, 2.0]
    assert retry_wait_s(failover, 0, 10.0, lambda: 1.0) == 12.0  # jitter capped at max_ms
    assert retry_wait_s(failover, 0, None, lambda: 1.0) == 0.1  # no Retry-After: the backoff
    assert retry_wait_s(failover, 5, 0.05, lambda: 1.0) == 2.0  # a longer backoff wins
