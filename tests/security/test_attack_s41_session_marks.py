"""Session 41 adversarial pass (outside attacker): a session call's pending-write mark
(``cogproxy:ctx:{client}:<session>:#writing``) on every way a call can end, measured in the
suite's own redis-server through a live proxy: nothing may be left behind for the 60 s a mark
lives (every other replica's calls of the session would wait on it)."""

from __future__ import annotations

import asyncio
import time
import uuid
from pathlib import Path
from types import MappingProxyType
from typing import Any

import aiohttp
import pytest

import proxy.state.redis_client as redis_client
from proxy.api.app_keys import OUTBOX
from tests.context.helpers import FIX, REVIEWER, reviewer_answer
from tests.fake_upstream import FakeUpstream, Fault
from tests.proxy_server import RunningProxy, running_proxy, upstream_policy
from tests.support.polling import eventually
from tests.support.redis_server import redis_url

DB = 15
LIMITS = {"global": {"rpm": 100000, "tpm": 100000000}}
WAIT_S = 30.0
"""The context timeout in the test of a wait on another replica's mark: the client leaves first."""


async def _marks_left(px: RunningProxy, redis_db: Any, session: str) -> int:
    outbox = px.app[OUTBOX]

    async def delivered() -> bool:
        return len(outbox) == 0

    await eventually(delivered, "the outbox delivered")
    keys = [key async for key in redis_db.scan_iter(match=f"*:{session}:#writing")]
    return sum([await redis_db.zcard(key) for key in keys])


async def _execute(base: str, session: str, *, stream: bool = False) -> int:
    headers = {"X-Cognitive-Session": session}
    if stream:
        headers["Accept"] = "text/event-stream"
    async with (
        aiohttp.ClientSession() as client,
        client.post(f"{base}/v1/modules/{REVIEWER}/execute", json={"input": FIX}, headers=headers) as resp,
    ):
        await resp.read()
        return resp.status


async def test_a_failed_upstream_leaves_no_mark(
    fake_upstream: FakeUpstream, tmp_path: Path, redis_db: Any
) -> None:
    session = f"s41-{uuid.uuid4().hex[:8]}"
    for model in ("cheap", "strong"):
        fake_upstream.set_default_reply(model, Fault.http(500))
    async with running_proxy(
        tmp_path, upstream_policy(fake_upstream, limits=LIMITS), redis_url=redis_url(DB)
    ) as px:
        assert await _execute(px.url, session) >= 500
        assert await _marks_left(px, redis_db, session) == 0


async def test_a_refused_call_leaves_no_mark(
    fake_upstream: FakeUpstream, tmp_path: Path, redis_db: Any
) -> None:
    session = f"s41-{uuid.uuid4().hex[:8]}"
    fake_upstream.set_default_reply("cheap", reviewer_answer(1, "review"))
    policy = upstream_policy(fake_upstream, limits={"global": {"rpm": 1, "tpm": 100000000}})
    async with running_proxy(tmp_path, policy, redis_url=redis_url(DB)) as px:
        assert await _execute(px.url, session) == 200
        assert await _execute(px.url, session) == 429
        assert await _execute(px.url, session, stream=True) == 429
        assert await _marks_left(px, redis_db, session) == 0


async def test_a_client_that_leaves_mid_call_leaves_no_mark(
    fake_upstream: FakeUpstream, tmp_path: Path, redis_db: Any
) -> None:
    session = f"s41-{uuid.uuid4().hex[:8]}"
    fake_upstream.set_default_reply("cheap", reviewer_answer(1, "review"))
    async with running_proxy(
        tmp_path, upstream_policy(fake_upstream, limits=LIMITS), redis_url=redis_url(DB)
    ) as px:
        for stream in (False, True):
            gate = fake_upstream.hold()
            call = asyncio.create_task(_execute(px.url, session, stream=stream))
            await gate.reached.wait()
            held = [key async for key in redis_db.scan_iter(match=f"*:{session}:#writing")]
            assert held and await redis_db.zcard(held[0]) == 1  # the mark is there while the model is asked
            call.cancel()  # the client goes away while the model is asked
            await asyncio.gather(call, return_exceptions=True)
            fake_upstream.gate = None
            gate.release()

            async def answered() -> bool:
                return fake_upstream.in_flight == 0

            await eventually(answered, "the upstream answered")
        assert await _marks_left(px, redis_db, session) == 0


async def test_a_client_that_leaves_while_waiting_on_another_replicas_mark_leaves_no_mark(
    fake_upstream: FakeUpstream, tmp_path: Path, redis_db: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The call's own mark is added by the read that finds another replica's mark; the call then
    waits for that mark (the context timeout, made long here) before the model is asked. A client
    leaving in that wait (plain and streamed) must take its mark away too."""
    monkeypatch.setattr(
        redis_client, "TIMEOUTS_S", MappingProxyType({**redis_client.TIMEOUTS_S, "context": WAIT_S})
    )
    session = f"s41-{uuid.uuid4().hex[:8]}"
    fake_upstream.set_default_reply("cheap", reviewer_answer(1, "review"))
    async with running_proxy(
        tmp_path, upstream_policy(fake_upstream, limits=LIMITS), redis_url=redis_url(DB)
    ) as px:
        gate = fake_upstream.hold()
        first = asyncio.create_task(_execute(px.url, session))
        await gate.reached.wait()
        (key,) = [key async for key in redis_db.scan_iter(match=f"*:{session}:#writing")]
        fake_upstream.gate = None
        gate.release()
        assert await first == 200
        assert await _marks_left(px, redis_db, session) == 0
        foreign = "another-replica:1"
        await redis_db.zadd(key, {foreign: int((time.time() + 600) * 1000)})  # a call in flight elsewhere
        for stream in (False, True):
            call = asyncio.create_task(_execute(px.url, session, stream=stream))

            async def waiting() -> int:
                return int(await redis_db.zcard(key))

            await eventually(waiting, "the call's mark added beside the other's", ready=lambda n: n == 2)
            call.cancel()  # the client goes away while the call waits on the other replica's mark
            await asyncio.gather(call, return_exceptions=True)
            await _marks_left(px, redis_db, session)
            await eventually(waiting, "the call's mark removed", ready=lambda n: n == 1)
            assert await redis_db.zrange(key, 0, -1) == [foreign]
        assert fake_upstream.count("/v1/chat/completions") == 1  # neither call reached the model
