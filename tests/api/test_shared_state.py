"""Review sinks and shared breaker state with a real Redis (the suite's own, tests.support.redis_server)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml
from aiohttp import web

from tests.api.test_routing import REVIEW_INPUT, answer, attempts_of, routing_policy
from tests.fake_upstream import FakeUpstream, Fault
from tests.proxy_server import free_port, proxy_process, running_proxy
from tests.support.polling import eventually, until
from tests.support.redis_server import redis_url

REDIS_URL = redis_url(15)


def review_policy(fake: FakeUpstream, **review: Any) -> dict[str, Any]:
    policy = routing_policy(fake)
    policy["review"] = review
    return policy


async def send_to_review(px: Any, fake: FakeUpstream) -> dict[str, Any]:
    """Both rungs answer above confidence but with high risk: decision tier -> review."""
    fake.script("cheap", answer(0.95, "high"))
    fake.script("strong", answer(0.95, "high"))
    async with aiohttp.ClientSession() as session:
        resp = await session.post(px.base + "/modules/code-reviewer/execute", json={"input": REVIEW_INPUT})
        assert resp.headers["X-Cognitive-Decision"] == "review"
        envelope: dict[str, Any] = await resp.json()
        envelope["_trace"] = resp.headers["X-Cognitive-Trace-Id"]
        return envelope


async def test_review_goes_to_the_redis_stream(
    fake_upstream: FakeUpstream, tmp_path: Path, redis_db: Any
) -> None:
    policy = review_policy(fake_upstream, sink="redis-stream", stream="test:review", maxlen=100)
    async with running_proxy(tmp_path, policy, redis_url=REDIS_URL) as px:
        envelope = await send_to_review(px, fake_upstream)
        entries = await eventually(lambda: redis_db.xrange("test:review"), "the review record in the stream")
    ((_, fields),) = entries
    assert fields["module"] == "code-reviewer" and fields["decision"] == "review"
    assert fields["trace_id"] == envelope["_trace"]
    assert json.loads(fields["meta"])["risk"] == "high"
    assert json.loads(fields["envelope"])["data"]["verdict"] == "approve"


async def test_review_sink_failure_never_fails_the_request(
    fake_upstream: FakeUpstream, tmp_path: Path
) -> None:
    policy = review_policy(fake_upstream, sink="redis-stream", timeout_s=0.2)
    dead = f"redis://127.0.0.1:{free_port()}/0"
    async with running_proxy(tmp_path, policy, redis_url=dead) as px:
        envelope = await send_to_review(px, fake_upstream)
    assert envelope["ok"] is True


async def test_review_goes_to_the_webhook_in_the_background(
    fake_upstream: FakeUpstream, tmp_path: Path
) -> None:
    received: list[dict[str, Any]] = []
    failures_left = [1]

    async def hook(request: web.Request) -> web.Response:
        if failures_left[0]:
            failures_left[0] -= 1
            return web.Response(status=503)  # the sink retries
        received.append(await request.json())
        return web.Response(status=204)

    app = web.Application()
    app.router.add_post("/hook", hook)
    runner = web.AppRunner(app)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    try:
        policy = review_policy(fake_upstream, sink="webhook", url=f"http://127.0.0.1:{port}/hook")
        async with running_proxy(tmp_path, policy) as px:
            envelope = await send_to_review(px, fake_upstream)
            await until(lambda: received, "the review webhook called")
    finally:
        await runner.cleanup()
    (record,) = received
    assert record["module"] == "code-reviewer" and record["trace_id"] == envelope["_trace"]
    assert record["envelope"]["meta"]["risk"] == "high"


async def test_review_goes_to_the_log_by_default(
    fake_upstream: FakeUpstream, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    async with running_proxy(tmp_path, routing_policy(fake_upstream)) as px:
        envelope = await send_to_review(px, fake_upstream)
    out = capsys.readouterr()
    (line,) = [line for line in (out.out + out.err).splitlines() if "proxy.review" in line]
    assert envelope["_trace"] in line  # a review tool can answer with POST /v1/feedback


async def test_two_proxy_processes_share_breaker_state_through_redis(
    fake_upstream: FakeUpstream, tmp_path: Path, redis_db: Any
) -> None:
    fake_upstream.set_default_reply("cheap", json.loads(answer()))
    fake_upstream.set_default_reply("backup", json.loads(answer()))
    policy = routing_policy(
        fake_upstream, circuit_breaker={"consecutive_failures": 2, "window_s": 30, "open_s": 30}
    )
    path = tmp_path / "shared.yaml"
    path.write_text(yaml.safe_dump(policy))
    # The other process has never read cheap's state, so its first admission reads it from Redis
    # (its later background reads, every 0.5 s, are tested in tests/upstream/test_breaker.py).
    async with proxy_process("--policy", str(path), "--redis-url", REDIS_URL) as other:
        async with running_proxy(tmp_path, policy, redis_url=REDIS_URL) as px:
            fake_upstream.script("cheap", Fault.http(500), Fault.http(500))
            for _ in range(2):
                await attempts_of(px)  # opens cheap's breaker, in Redis
            await eventually(  # published after the answer, not before it
                lambda: redis_db.hget("cogproxy:breaker:{up/cheap}:state", "open_until"), "the open in Redis"
            )
        async with aiohttp.ClientSession() as session:
            resp = await session.post(
                other.url + "/v1/chat/completions",
                json={
                    "model": "module:code-reviewer",
                    "messages": [{"role": "user", "content": json.dumps(REVIEW_INPUT)}],
                },
            )
            body = await resp.json()
    attempts = [(a["target"], a["outcome"]) for a in body["cognitive"]["attempts"]]
    assert attempts == [("up/cheap", "circuit_open"), ("up/backup", "accept")]
    assert fake_upstream.count(model="cheap") == 2


async def test_redis_down_falls_back_to_local_state_and_keeps_serving(
    fake_upstream: FakeUpstream, tmp_path: Path
) -> None:
    fake_upstream.set_default_reply("backup", json.loads(answer()))
    fake_upstream.script("cheap", Fault.http(500), Fault.http(500))
    dead = f"redis://127.0.0.1:{free_port()}/0"
    async with running_proxy(tmp_path, routing_policy(fake_upstream), redis_url=dead) as px:
        for _ in range(2):
            attempts, _ = await attempts_of(px)
            assert attempts[-1] == ("up/backup", "accept")
        attempts, _ = await attempts_of(px)
    assert attempts == [("up/cheap", "circuit_open"), ("up/backup", "accept")]  # local breaker works
