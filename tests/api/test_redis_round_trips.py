"""Redis round trips per request kind, counted by Redis itself (``INFO commandstats``), not timed.

The proxy reaches the suite's private Redis through a relay (``tests.redis_relay``). A request is
held at the fake upstream: the commands counted by then are the ones the answer waited on before
the provider was asked. The relay is then frozen (nothing reaches Redis, no reply comes back) and the
upstream released: the answer must come all the same, so nothing between the provider's answer and
the client's waits on Redis. Redis timeouts are long here, so a wait would hang, not fall back."""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path
from types import MappingProxyType
from typing import Any

import aiohttp
import pytest

import proxy.state.redis_client as redis_client
from tests.fake_upstream import FakeUpstream
from tests.paths import ROOT
from tests.proxy_server import RunningProxy, running_proxy, upstream_policy
from tests.redis_relay import RedisRelay
from tests.support.commandstats import calls_since, quiet, round_trips, script_commands

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
