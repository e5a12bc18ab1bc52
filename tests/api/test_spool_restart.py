"""The spool across kills and restarts of ``cogproxy serve`` (issue #29 findings 1 and 2): with a
slow Redis (a relay adding a delay per round trip) the outbox has a real backlog when the process
is killed; after a SIGKILL, a restart, a SIGTERM with a backlog and another restart on the same
spool, every review record is in the stream exactly once (counted by trace id), and every
feedback record written while Redis was frozen is in Redis."""

from __future__ import annotations

import asyncio
import signal
import uuid
from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import redis.asyncio as aioredis
import yaml

from proxy.state.feedback import KEY_PREFIX
from proxy.state.spool import SPOOL_FILE
from tests.api.test_redis_outbox import outbox_policy, review
from tests.fake_upstream import FakeUpstream
from tests.proxy_server import UPSTREAM_KEY, UPSTREAM_KEY_ENV, ServedProcess, proxy_process
from tests.redis_relay import RedisRelay
from tests.support.redis_server import redis_url

REDIS_URL = redis_url(15)
DB = int(REDIS_URL.rsplit("/", 1)[1])
SLOW_REDIS_S = 0.05
"""The issue's shape: 50 ms per Redis round trip."""
CONCURRENCY = 16
DELIVERY_DEADLINE_S = 60.0


@pytest.fixture
async def redis_db() -> AsyncIterator[Any]:
    """The suite's private Redis; each test's stream and trace ids are its own (no flush)."""
    async with aioredis.Redis.from_url(REDIS_URL, decode_responses=True) as client:
        yield client


async def reviews(url: str, count: int) -> list[str]:
    """``count`` reviewed module calls, ``CONCURRENCY`` at a time: their trace ids."""
    gate = asyncio.Semaphore(CONCURRENCY)
    async with aiohttp.ClientSession() as session:

        async def one() -> str:
            async with gate:
                return await review(session, url)

        return list(await asyncio.gather(*(one() for _ in range(count))))


async def stream_length_reaches(redis_db: Any, stream: str, count: int) -> int:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + DELIVERY_DEADLINE_S
    while (length := await redis_db.xlen(stream)) < count and loop.time() < deadline:
        await asyncio.sleep(0.02)
    return int(length)


async def spool_drained(spool: Path) -> bytes:
    """The spool file once it is empty (or at the deadline)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + DELIVERY_DEADLINE_S
    while (content := (spool / SPOOL_FILE).read_bytes()) and loop.time() < deadline:
        await asyncio.sleep(0.05)
    return content


def kill(served: ServedProcess) -> None:
    served.proc.send_signal(signal.SIGKILL)
    served.proc.wait()


async def test_records_delivered_before_a_kill_or_a_stop_are_never_sent_again(
    fake_upstream: FakeUpstream, tmp_path: Path, relay: RedisRelay, redis_db: Any
) -> None:
    policy = outbox_policy(fake_upstream)
    stream = policy["review"]["stream"] = f"test:spool:{uuid.uuid4().hex}"
    policy_path = tmp_path / "policy.yaml"
    policy_path.write_text(yaml.safe_dump(policy))
    spool = tmp_path / "spool"
    args = ("--policy", str(policy_path), "--redis-url", relay.url(DB), "--spool-dir", str(spool))
    env = {UPSTREAM_KEY_ENV: UPSTREAM_KEY}
    sent: list[str] = []
    relay.delay_s = SLOW_REDIS_S
    async with proxy_process(*args, env=env) as served:
        sent += await reviews(served.url, 300)
        # more than the 200 newest entries the old replay looked at are delivered
        assert await stream_length_reaches(redis_db, stream, 220) >= 220
        relay.freeze()
        sent += await reviews(served.url, 30)  # a backlog nothing can deliver
        kill(served)
    relay.restore()
    async with proxy_process(*args, env=env) as served:
        sent += await reviews(served.url, 60)
        assert await stream_length_reaches(redis_db, stream, len(sent) - 40) >= len(sent) - 40
        relay.freeze()
        sent += await reviews(served.url, 30)
        # SIGTERM with a backlog (the context manager's stop)
    relay.restore()
    relay.delay_s = 0.0
    async with proxy_process(*args, env=env) as served:
        await stream_length_reaches(redis_db, stream, len(sent))
        assert await spool_drained(spool) == b""
    delivered = Counter(fields["trace_id"] for _, fields in await redis_db.xrange(stream))
    twice = {trace: n for trace, n in delivered.items() if n > 1}
    print(f"\nreview records: {len(sent)} sent, {len(delivered)} in the stream, {len(twice)} more than once")
    assert set(delivered) == set(sent)
    assert twice == {}


async def test_feedback_records_written_while_redis_is_frozen_survive_a_kill(
    fake_upstream: FakeUpstream, tmp_path: Path, relay: RedisRelay, redis_db: Any
) -> None:
    policy = outbox_policy(fake_upstream)
    policy_path = tmp_path / "policy.yaml"
    policy_path.write_text(yaml.safe_dump(policy))
    spool = tmp_path / "spool"
    args = ("--policy", str(policy_path), "--redis-url", relay.url(DB), "--spool-dir", str(spool))
    env = {UPSTREAM_KEY_ENV: UPSTREAM_KEY}
    async with proxy_process(*args, env=env) as served:
        relay.freeze()
        sent = await reviews(served.url, 60)
        kill(served)
    relay.restore()
    async with proxy_process(*args, env=env):
        assert await spool_drained(spool) == b""
    stored = [await redis_db.hkeys(KEY_PREFIX + trace) for trace in sent]
    missing = [trace for trace, clients in zip(sent, stored, strict=True) if clients != ["anonymous"]]
    print(f"\nfeedback records after a SIGKILL with Redis frozen: {len(sent) - len(missing)} of {len(sent)}")
    assert missing == []
