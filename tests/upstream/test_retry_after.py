"""``Retry-After`` as providers send it: delta-seconds or an HTTP-date (RFC 9110 §10.2.3), and the
values that must not turn into a retry storm or an endless wait (#29.3 attack pass)."""

from __future__ import annotations

import functools
import math

import pytest

from proxy.policy.model import Backoff, Failover
from proxy.upstream.base import ProviderError, parse_retry_after
from proxy.upstream.router import RETRY_AFTER_CAP_S, retry_after_s, retry_wait_s

NOW = 1_445_412_480.0  # Wed, 21 Oct 2015 07:28:00 GMT


def at_now() -> float:
    return NOW


@pytest.mark.parametrize(
    ("header", "seconds"),
    [
        ("Wed, 21 Oct 2015 07:28:30 GMT", 30.0),  # IMF-fixdate, 30 s ahead
        ("Wednesday, 21-Oct-15 07:29:00 GMT", 60.0),  # obsolete RFC 850 form
        ("Wed Oct 21 07:28:05 2015", 5.0),  # asctime form
        ("Wed, 21 Oct 2015 07:27:00 GMT", 0.0),  # already past: retry now, not never
        ("120", 120.0),
        ("0", 0.0),
        ("1.5", 1.5),
    ],
)
def test_retry_after_is_read_as_seconds_or_an_http_date(header: str, seconds: float) -> None:
    assert parse_retry_after(header, now=at_now) == seconds


@pytest.mark.parametrize("header", ["-1", "nan", "soon", "Wed, 99 Foo 2015 07:28:00 GMT", "", None])
def test_an_unusable_retry_after_is_ignored(header: str | None) -> None:
    assert parse_retry_after(header, now=at_now) is None


def test_a_huge_retry_after_stops_retries_and_is_capped_for_the_client() -> None:
    """ "1e400" is infinite: no retry is waited for (it would pass any deadline) and the client is
    told at most ``RETRY_AFTER_CAP_S``."""
    huge = parse_retry_after("1e400", now=at_now)
    assert huge is not None and math.isinf(huge)
    wait = retry_wait_s(Failover(backoff=Backoff(100, 2000)), 0, huge, functools.partial(float, 0.5))
    assert wait > 90  # more than the default total deadline: the router does not retry
    failure = ProviderError("server_error", "busy", status=503, retry_after=huge)
    assert retry_after_s([failure]) == RETRY_AFTER_CAP_S


def test_retry_after_zero_leaves_the_jittered_backoff() -> None:
    failover = Failover(backoff=Backoff(100, 2000))
    assert retry_wait_s(failover, 0, 0.0, lambda: 1.0) == 0.1


@pytest.mark.parametrize(
    ("header", "seconds"),
    [("\u0661\u0662", 12.0), ("+3", 3.0), (" 3 ", 3.0), ("1_000", 1000.0), ("1e3", 1000.0), ("3, 4", None)],
)
def test_lenient_forms_read_as_the_number_they_spell_and_the_client_hears_at_most_the_cap(
    header: str, seconds: float | None
) -> None:
    """Not RFC 9110 delta-seconds, but a number all the same (adversarial pass #29, on record):
    read as it reads, never a crash, and capped like any other for the client."""
    assert parse_retry_after(header, now=at_now) == seconds
    if seconds is not None:
        failure = ProviderError("rate_limited", "slow down", status=429, retry_after=seconds)
        assert retry_after_s([failure]) == min(seconds, RETRY_AFTER_CAP_S)
