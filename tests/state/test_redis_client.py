"""The one Redis client factory (``proxy.state.redis_client``): every store's client comes from
it with its purpose's timeout; the down-until backoff on an injected clock; the limits' timeout,
settable from the settings, decides whether a slow Redis still counts (the suite's own Redis
behind a relay, tests/redis_relay.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from proxy.cli import build_parser, resolve_serve_options, serve_settings
from proxy.clients import ANONYMOUS, Caller, ClientIdentity
from proxy.limits.limiter import Limiter
from proxy.limits.windows import MemoryCounters, RedisCounters
from proxy.policy.limits import LimitSpec, LimitsPolicy
from proxy.settings import Settings
from proxy.state.context_store import RedisContextStore
from proxy.state.feedback import RedisFeedbackStore
from proxy.state.outbox import RedisOutbox
from proxy.state.redis_client import (
    RETRY_AFTER_S,
    TIMEOUTS_S,
    Purpose,
    RedisHealth,
    RedisOptions,
    redis_client,
)
from proxy.state.redis_defaults import LIMITS_TIMEOUT_S
from proxy.state.redis_store import RedisBreakerStore
from proxy.state.stream_sessions import SessionHub
from tests.redis_relay import RedisRelay
from tests.support.redis_db import fresh_db
from tests.support.redis_server import free_port

DB = 10
UNREACHABLE = f"redis://127.0.0.1:{free_port()}/0"
"""Nothing listens there; no test here sends a command to it (clients connect on first use)."""


class Clock:
    def __init__(self, now: float = 100.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def kwargs_of(client: Any) -> dict[str, Any]:
    kwargs: dict[str, Any] = client.connection_pool.connection_kwargs
    return kwargs


def distinct_options() -> RedisOptions:
    """A different timeout for every purpose, and ACL credentials, so a client shows whose it is."""
    options = RedisOptions(UNREACHABLE, username="proxy", password="s3cret")
    for n, purpose in enumerate(TIMEOUTS_S, start=1):
        options = options.with_timeout(purpose, n / 100)
    return options


async def test_every_store_takes_its_client_from_the_factory_with_its_purpose() -> None:
    options = distinct_options()
    outbox = RedisOutbox(options)
    quota = Limiter.build(options, 1, lambda down: None)
    assert isinstance(quota.counters, RedisCounters)
    stores: list[tuple[Purpose, Any, Any]] = [
        ("limits", quota, quota.counters._redis),
        ("breakers", breakers := RedisBreakerStore(options), breakers._redis),
        ("context", context := RedisContextStore(options, outbox), context._redis),
        ("feedback", feedback := RedisFeedbackStore(options, outbox), feedback._redis),
        ("outbox", outbox, outbox._redis),
        ("streams", hub := SessionHub(ttl_s=60, max_bytes=1 << 20, redis=options), hub._redis),
    ]
    try:
        for purpose, _, client in stores:
            kwargs = kwargs_of(client)
            expected = options.timeout_s(purpose)
            assert (purpose, kwargs["socket_timeout"], kwargs["socket_connect_timeout"]) == (
                purpose,
                expected,
                expected,
            )
            assert (kwargs["username"], kwargs["password"]) == ("proxy", "s3cret")
            assert kwargs["decode_responses"] is (purpose in ("breakers", "outbox", "review"))
    finally:
        for _, store, _ in stores:
            await store.aclose()


def test_the_default_timeouts_and_retry_intervals_are_the_stores_former_ones() -> None:
    options = RedisOptions(UNREACHABLE)
    assert {p: options.timeout_s(p) for p in TIMEOUTS_S} == {
        "limits": 0.25,
        "breakers": 0.25,
        "context": 0.25,
        "feedback": 0.25,
        "outbox": 1.0,
        "streams": 1.0,
        "review": 1.0,
        "scan": 5.0,  # calibration: an endpoint that never answers is an error (issue #32 attack)
    }
    assert {p: options.health(p).retry_after_s for p in RETRY_AFTER_S} == {
        "limits": 1.0,
        "breakers": 5.0,
        "context": 5.0,
    }


async def test_tls_and_a_connect_timeout_reach_redis_py() -> None:
    options = RedisOptions(
        "rediss://127.0.0.1:1/0",
        ssl_ca_certs="/ca.pem",
        ssl_certfile="/cert.pem",
        ssl_keyfile="/key.pem",
        connect_timeout_s=3.0,
    )
    client = redis_client(options, "context")
    kwargs = kwargs_of(client)
    await client.aclose()
    assert (kwargs["ssl_ca_certs"], kwargs["ssl_certfile"], kwargs["ssl_keyfile"]) == (
        "/ca.pem",
        "/cert.pem",
        "/key.pem",
    )
    assert (kwargs["socket_timeout"], kwargs["socket_connect_timeout"]) == (0.25, 3.0)


def test_options_refuse_tls_files_without_rediss_and_a_timeout_that_is_not_positive() -> None:
    with pytest.raises(ValueError, match="rediss://"):
        RedisOptions("redis://127.0.0.1:1/0", ssl_ca_certs="/ca.pem")
    with pytest.raises(ValueError, match="limits timeout must be positive"):
        RedisOptions(UNREACHABLE).with_timeout("limits", 0)


def test_options_never_show_the_url_or_the_password() -> None:
    shown = repr(RedisOptions("redis://:pw-in-url@127.0.0.1:1/0", password="pw-field"))
    assert "pw-in-url" not in shown and "pw-field" not in shown


def test_health_is_down_for_the_retry_interval_after_a_failure_and_reports_each_outage_once() -> None:
    clock = Clock()
    health = RedisHealth(5.0, clock)

    def after(seconds: float) -> bool:
        clock.now += seconds
        return health.down

    assert after(0) is False
    assert health.failed() is True  # the first failure: reported
    assert after(4.9) is True
    assert health.failed() is False  # still down: not reported again, and down 5 s from now
    assert after(4.9) is True
    assert after(0.2) is False
    assert health.failed() is True  # the retry failed: a new outage, reported


def test_health_reports_a_recovery_once_and_only_after_a_failure() -> None:
    clock = Clock()
    health = RedisHealth(1.0, clock)
    assert health.answered() is False
    health.failed()
    clock.now += 1.5
    assert health.answered() is True
    assert health.answered() is False
    assert not health.down


def test_settings_build_the_redis_options_once_with_the_limits_timeout(tmp_path: Path) -> None:
    args = build_parser().parse_args(
        ["serve", "--policy", "p.yaml", "--redis-url", UNREACHABLE, "--redis-limits-timeout", "2.5"]
    )
    args.modules = []
    resolve_serve_options(args)
    redis = serve_settings(args).redis
    assert redis is not None and redis.url == UNREACHABLE
    assert (redis.timeout_s("limits"), redis.timeout_s("context")) == (2.5, TIMEOUTS_S["context"])
    assert Settings(tmp_path, (), redis_url=None).redis is None
    assert Settings(tmp_path, (), redis_url=UNREACHABLE).redis == RedisOptions(UNREACHABLE)
    assert TIMEOUTS_S["limits"] == LIMITS_TIMEOUT_S


GLOBAL_RPM = LimitsPolicy(global_=LimitSpec(rpm=1000))
CALLER = Caller(ANONYMOUS, ClientIdentity())


def shared_quota(url: str, timeout_s: float, clock: Clock, changes: list[bool]) -> Limiter:
    """What ``Limiter.build`` makes, with the health on ``clock``."""
    options = RedisOptions(url).with_timeout("limits", timeout_s)
    health = options.health("limits", clock)
    return Limiter(
        RedisCounters(redis_client(options, "limits")), MemoryCounters(), True, changes.append, health=health
    )


async def test_a_slow_redis_counts_within_the_limits_timeout_and_is_left_past_it(relay: RedisRelay) -> None:
    relay.delay_s = 0.1
    clock, changes = Clock(), list[bool]()
    async with fresh_db(DB):
        patient = shared_quota(relay.url(DB), 5.0, clock, changes)
        hasty = shared_quota(relay.url(DB), 0.02, clock, changes)
        try:
            await patient.admit(GLOBAL_RPM, CALLER, 1)
            assert not patient.degraded and changes == []
            await hasty.admit(GLOBAL_RPM, CALLER, 1)
            assert hasty.degraded and changes == [True]
        finally:
            await patient.aclose()
            await hasty.aclose()


async def test_limits_use_local_windows_while_redis_is_down_and_share_again_after_the_retry(
    relay: RedisRelay,
) -> None:
    clock, changes = Clock(), list[bool]()
    async with fresh_db(DB):
        quota = shared_quota(relay.url(DB), 1.0, clock, changes)
        try:
            relay.cut()
            admission = await quota.admit(GLOBAL_RPM, CALLER, 1)
            assert admission.windows[0].state.remaining == 999  # the local window took it
            assert (quota.degraded, changes) == (True, [True])
            relay.restore()
            clock.now += 0.5
            await quota.admit(GLOBAL_RPM, CALLER, 1)  # within the retry interval: still local
            assert (quota.degraded, changes) == (True, [True])
            clock.now += 0.6
            admission = await quota.admit(GLOBAL_RPM, CALLER, 1)
            assert admission.windows[0].state.remaining == 999  # Redis's own window: its first request
            assert (quota.degraded, changes) == (False, [True, False])
        finally:
            await quota.aclose()
