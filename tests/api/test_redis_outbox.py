"""Review records survive Redis going away (issue #11 finding 7): with Redis cut and then frozen
(a relay in front of the shared server; the server itself is never touched), every record reaches
the stream once Redis is back, in order; the spool survives a restart of ``cogproxy serve``;
/readyz stays 200 and says Redis is down; a full outbox drops and counts."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import aiohttp
import yaml

from proxy.state.outbox import RedisOutbox, StreamWrite, Write
from proxy.state.redis_client import RedisOptions
from proxy.state.spool import SPOOL_FILE
from tests.api.test_routing import REVIEW_INPUT, answer, routing_policy
from tests.conftest import ProxyWith
from tests.fake_upstream import FakeUpstream
from tests.proxy_server import UPSTREAM_KEY, UPSTREAM_KEY_ENV, proxy_process
from tests.redis_relay import RedisRelay
from tests.support.polling import eventually, settled, until
from tests.support.redis_server import redis_url

REDIS_URL = redis_url(15)
DB = int(REDIS_URL.rsplit("/", 1)[1])
STREAM = "test:outbox"
PER_PHASE = 50
DELIVERY_DEADLINE_S = 30.0


def outbox_policy(fake: FakeUpstream) -> dict[str, Any]:
    fake.set_default_reply("cheap", answer(0.95, "high"))  # decision tier, high risk: review
    fake.set_default_reply("strong", answer(0.95, "high"))
    policy = routing_policy(fake)
    policy["review"] = {"sink": "redis-stream", "stream": STREAM, "maxlen": 10000}
    return policy


async def review(session: aiohttp.ClientSession, url: str) -> str:
    resp = await session.post(url + "/v1/modules/code-reviewer/execute", json={"input": REVIEW_INPUT})
    assert resp.status == 200 and resp.headers["X-Cognitive-Decision"] == "review"
    await resp.read()
    return resp.headers["X-Cognitive-Trace-Id"]


async def stream_trace_ids(redis_db: Any, expected: int) -> list[str]:
    """The stream's trace ids once it holds ``expected`` entries (or at the deadline)."""
    entries = await settled(
        lambda: redis_db.xrange(STREAM), ready=lambda e: len(e) >= expected, timeout=DELIVERY_DEADLINE_S
    )
    return [fields["trace_id"] for _, fields in entries]


async def readiness(session: aiohttp.ClientSession, url: str, redis: str) -> dict[str, Any]:
    """Poll /readyz until it reports ``redis`` (it stays 200 throughout)."""

    async def ready_body() -> dict[str, Any]:
        resp = await session.get(url + "/readyz")
        assert resp.status == 200
        body: dict[str, Any] = await resp.json()
        return body

    what = f"/readyz saying redis {redis}"
    return await eventually(ready_body, what, ready=lambda body: body.get("redis") == redis, timeout=10)


async def test_review_records_written_while_redis_is_cut_or_frozen_reach_the_stream_in_order(
    fake_upstream: FakeUpstream, relay: RedisRelay, redis_db: Any, proxy_with: ProxyWith
) -> None:
    sent: list[str] = []
    async with (
        proxy_with(outbox_policy(fake_upstream), redis_url=relay.url(DB)) as px,
        aiohttp.ClientSession() as session,
    ):
        sent += [await review(session, px.url) for _ in range(PER_PHASE)]
        relay.cut()
        sent += [await review(session, px.url) for _ in range(PER_PHASE)]
        down = await readiness(session, px.url, "down")
        relay.freeze()
        sent += [await review(session, px.url) for _ in range(PER_PHASE)]
        relay.restore()
        sent += [await review(session, px.url) for _ in range(PER_PHASE)]
        delivered = await stream_trace_ids(redis_db, len(sent))
        await readiness(session, px.url, "up")
        scrape = await (await session.get(px.url + "/metrics")).text()
    arrived = len(set(delivered) & set(sent))
    print(f"\nreview records in the stream after Redis came back: {arrived} of {len(sent)}")
    assert down["status"] == "ready" and down["redis_pending_writes"] >= 1
    assert delivered == sent  # every record, once, in order
    assert "cognitive_redis_up 1.0" in scrape and "cognitive_review_dropped_total 0.0" in scrape
    assert "cognitive_outbox_pending 0.0" in scrape


async def test_the_spool_keeps_records_across_a_restart(
    fake_upstream: FakeUpstream, tmp_path: Path, relay: RedisRelay, redis_db: Any
) -> None:
    policy_path = tmp_path / "policy.yaml"
    policy_path.write_text(yaml.safe_dump(outbox_policy(fake_upstream)))
    spool = tmp_path / "spool"
    args = ("--policy", str(policy_path), "--redis-url", relay.url(DB), "--spool-dir", str(spool))
    env = {UPSTREAM_KEY_ENV: UPSTREAM_KEY}
    relay.cut()
    async with proxy_process(*args, env=env) as served, aiohttp.ClientSession() as session:
        sent = [await review(session, served.url) for _ in range(5)]
    # SIGTERM with Redis away: each call left a review record and a feedback record
    assert len((spool / SPOOL_FILE).read_bytes().splitlines()) == 2 * len(sent)
    relay.restore()
    async with proxy_process(*args, env=env) as served:
        delivered = await stream_trace_ids(redis_db, len(sent))
        # the spool is truncated once everything is delivered
        await until((spool / SPOOL_FILE).read_bytes, "the spool emptied", ready=lambda b: not b, timeout=10)
    assert delivered == sent
    assert (spool / SPOOL_FILE).read_bytes() == b""


def dropped_trace_ids(writes: list[Write]) -> list[str]:
    return [w.fields["trace_id"] if isinstance(w, StreamWrite) else f"key write {w!r}" for w in writes]


async def test_a_full_outbox_drops_new_writes_and_counts_them(relay: RedisRelay, redis_db: Any) -> None:
    relay.cut()
    dropped: list[Write] = []
    outbox = RedisOutbox(RedisOptions(relay.url(DB)), bound=3, on_drop=dropped.append)
    outbox.start()
    accepted = [outbox.put(StreamWrite(STREAM, {"trace_id": str(i)}, 100)) for i in range(5)]
    assert accepted == [True, True, True, False, False]
    assert dropped_trace_ids(dropped) == ["3", "4"]
    relay.restore()
    assert await stream_trace_ids(redis_db, 3) == ["0", "1", "2"]
    await outbox.aclose()


async def test_a_write_redis_refuses_is_dropped_and_never_blocks_the_ones_behind_it(redis_db: Any) -> None:
    await redis_db.set("not-a-stream", "x")
    dropped: list[Write] = []
    outbox = RedisOutbox(RedisOptions(REDIS_URL), on_drop=dropped.append)
    outbox.start()
    outbox.put(StreamWrite("not-a-stream", {"trace_id": "refused"}, 100))
    outbox.put(StreamWrite(STREAM, {"trace_id": "next"}, 100))
    assert await stream_trace_ids(redis_db, 1) == ["next"]
    assert dropped_trace_ids(dropped) == ["refused"]
    await outbox.aclose()
