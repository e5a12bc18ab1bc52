"""Two ``cogproxy serve`` replicas over a real Redis Cluster (3 masters, 3 replicas,
tests/support/redis_cluster.py), end to end through HTTP and the ``openai`` SDK: a context session
and the result cache started on one replica are continued on the other; a streamed module answer
dropped on one replica is resumed on the other from the cluster's copy; and a master killed under
load (its replica promoted) fails no request and loses no durable write — every feedback record,
review stream entry and context write of the kill window is in the cluster afterwards, each once
(the master killed once its replica has what it acknowledged: the loss of asynchronous replication
is Redis's, and --redis-durable-replicas's test, tests/api/test_redis_durable_failover.py).
(Limits shared through the cluster: tests/api/test_redis_cluster.py.)"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import aiohttp
import openai
import pytest
import yaml

from tests.api.test_streaming import answer as streamed_answer
from tests.context.helpers import FIX, LOGIN, REVIEWER, execute, reviewer_answer, sent_inputs
from tests.fake_upstream import FakeUpstream
from tests.proxy_server import UPSTREAM_KEY, UPSTREAM_KEY_ENV, ServedProcess, proxy_process, upstream_policy
from tests.stream.client import read_sse, rendered, seq, sequenced
from tests.support.polling import eventually, until
from tests.support.redis_cluster import Cluster, cluster_keys
from tests.support.redis_cluster import redis_cluster as redis_cluster

ENV = {UPSTREAM_KEY_ENV: UPSTREAM_KEY}
SSE = {"Accept": "text/event-stream"}
LONG = " ".join(f"word{i}" for i in range(60))
REVIEW_STREAM = "cognitive:review"
FAILOVER_TIMEOUT_S = 30.0
DELIVERY_TIMEOUT_S = 30.0


@asynccontextmanager
async def replicas(
    tmp_path: Path, cluster: Cluster, policy: dict[str, Any]
) -> AsyncIterator[tuple[ServedProcess, ServedProcess]]:
    """Two replicas of ``policy`` whose ``--redis-url`` is the cluster."""
    path = tmp_path / "policy.yaml"
    path.write_text(yaml.safe_dump(policy), encoding="utf-8")
    args = ("--policy", str(path), "--redis-url", cluster.url)
    async with proxy_process(*args, env=ENV) as one, proxy_process(*args, env=ENV) as two:
        yield one, two


@pytest.fixture
async def admin(redis_cluster: Cluster) -> AsyncIterator[Any]:
    client = redis_cluster.admin()
    yield client
    await client.aclose()


async def test_a_context_session_and_the_result_cache_continue_on_the_other_replica(
    fake_upstream: FakeUpstream, tmp_path: Path, redis_cluster: Cluster, admin: Any
) -> None:
    policy = upstream_policy(fake_upstream, cache={"modules": {REVIEWER: {"ttl_s": 600}}})
    fake_upstream.script("cheap", reviewer_answer(2, "code_review"), reviewer_answer(1, "verify_fix"))
    session = {"X-Cognitive-Session": "cluster-review-1"}
    async with replicas(tmp_path, redis_cluster, policy) as (one, two):
        _, headers, first = await execute(one.url, REVIEWER, LOGIN, session)
        assert headers["X-Cognitive-Cache"] == "miss"
        sdk = openai.AsyncOpenAI(base_url=two.url + "/v1", api_key="sk-any", max_retries=0)
        async with sdk:
            raw = await sdk.chat.completions.with_raw_response.create(
                model=f"module:{REVIEWER}",
                messages=[{"role": "user", "content": json.dumps(FIX)}],
                extra_headers=session,
            )
        assert raw.headers["x-cognitive-context"] == "session_state=session, previous_result=session"
        context = sent_inputs(fake_upstream)[1]["_context"]
        assert context["session_state"] == first["_emitted_context"]["session_state"]
        assert context["previous_result"]["data"] == first["data"]
        second = json.loads(raw.parse().choices[0].message.content or "")
        assert second["_emitted_context"]["session_state"]["last_action"] == "verify_fix"

        fake_upstream.script("cheap", reviewer_answer(0, "code_review"))
        _, miss, answered = await execute(two.url, REVIEWER, {"code": "x = 1"})
        await eventually(
            lambda: cluster_keys(admin, "cogproxy:ctx:*:cache:*"),
            "the cache entries of the three calls in the cluster",
            ready=lambda keys: len(keys) == 3,
        )
        _, hit, cached = await execute(one.url, REVIEWER, {"code": "x = 1"})
    assert (miss["X-Cognitive-Cache"], hit["X-Cognitive-Cache"]) == ("miss", "hit")
    assert cached["data"] == answered["data"]
    assert fake_upstream.count("/v1/chat/completions") == 3  # the hit called no model


@pytest.fixture
async def slow_fake() -> AsyncIterator[FakeUpstream]:
    """A fake upstream that streams its answer word by word, 10 ms apart."""
    async with FakeUpstream.start(chunk_delay=0.01) as fake:
        yield fake


async def test_a_stream_dropped_on_one_replica_resumes_on_the_other_from_the_cluster(
    slow_fake: FakeUpstream, tmp_path: Path, redis_cluster: Cluster, admin: Any
) -> None:
    slow_fake.set_default_reply("cheap", streamed_answer(0.92, rationale=LONG))
    execute_path = "/v1/modules/code-reviewer/execute"
    body = {"input": {"code": "def f(x):\n    return x\n", "language": "python"}}
    async with (
        replicas(tmp_path, redis_cluster, upstream_policy(slow_fake)) as (one, two),
        aiohttp.ClientSession() as session,
    ):
        dropped = await session.post(one.url + execute_path, json=body, headers=SSE)
        seen = await read_sse(dropped, stop_after=5)
        dropped.close()  # the client goes away after seq 5
        sid = seen[0][1]["session_id"]
        assert seq(sequenced(seen)[-1]) == 5
        await eventually(
            lambda: cluster_keys(admin, f"cogproxy:stream:{sid}:*"), "the session's copy in the cluster"
        )
        headers = {**SSE, "X-Cognitive-Recovery-Session": sid, "X-Cognitive-Recovery-Seq": "5"}
        async with session.post(two.url + execute_path, json=body, headers=headers) as resumed:
            assert resumed.status == 200
            rest = await read_sse(resumed)
    meta = rest[0][1]
    assert meta["resumed"] is True and meta["resume_from_seq"] == 6 and meta["session_id"] == sid
    assert seq(sequenced(rest)[0]) == 6
    assert rest[-1][1]["final"] is True
    assert rendered(seen + rest)["data.rationale"] == LONG
    assert slow_fake.count("/v1/chat/completions") == 1  # replica two called no model: it followed


WORKERS = 4
AFTER_FAILOVER = 10
"""Requests each worker still sends once the cluster is whole again."""


def accepted(session_no: int) -> str:
    """An interactive-reviewer answer the decision tier accepts: it emits the session's state."""
    return reviewer_answer(1, f"turn-{session_no}")


REVIEWED = reviewer_answer(2, "risky", confidence=0.95, risk="high")
"""An answer every rung gives with high risk: the decision tier sends it to review."""


async def module_calls_until(
    session: aiohttp.ClientSession, urls: tuple[str, str], worker: int, stop: asyncio.Event
) -> list[tuple[int, str, str, str]]:
    """One worker's sequential calls, alternating replicas, each a new session, until ``stop`` is
    set: (status, decision, trace id, session id) of each."""
    done: list[tuple[int, str, str, str]] = []
    while not stop.is_set():
        sid = f"w{worker}-{len(done)}"
        url = f"{urls[len(done) % 2]}/v1/modules/{REVIEWER}/execute"
        async with session.post(url, json={"input": LOGIN}, headers={"X-Cognitive-Session": sid}) as resp:
            await resp.read()
            done.append(
                (
                    resp.status,
                    resp.headers.get("X-Cognitive-Decision", ""),
                    resp.headers.get("X-Cognitive-Trace-Id", ""),
                    sid,
                )
            )
    return done


async def test_a_master_killed_under_load_fails_no_request_and_loses_no_durable_write(
    fake_upstream: FakeUpstream, tmp_path: Path, redis_cluster: Cluster
) -> None:
    """Four clients call interactive-reviewer on both replicas, each call a new session: every
    other answer is accepted (a context write) and every other goes to review (a review stream
    entry); every answer leaves a feedback record. The master holding the context slot is killed
    mid-load; its replica takes over; the load goes on past the failover.

    The master's writes are held until its replica has them just before the kill, so what is
    asserted is the proxy's share: no record lost in its retries, the failover's ``CLUSTERDOWN``
    and the slot map's change. A write the killed master acknowledged but had not yet replicated
    is lost by Redis itself (replication is asynchronous) unless ``--redis-durable-replicas`` is
    set: tests/api/test_redis_durable_failover.py. Without the hold, this test failed about once in
    30 runs on a loaded machine, a feedback record short."""
    fake_upstream.script("cheap", *[accepted(i) if i % 2 else REVIEWED for i in range(10_000)])
    fake_upstream.set_default_reply("strong", REVIEWED)
    policy = {**upstream_policy(fake_upstream), "review": {"sink": "redis-stream", "stream": REVIEW_STREAM}}
    stop = asyncio.Event()
    async with (
        replicas(tmp_path, redis_cluster, policy) as (one, two),
        aiohttp.ClientSession() as session,
    ):
        load = [
            asyncio.create_task(module_calls_until(session, (one.url, two.url), worker, stop))
            for worker in range(WORKERS)
        ]
        before = redis_cluster.admin()
        try:
            (context_key, *_) = await eventually(
                lambda: cluster_keys(before, "cogproxy:ctx:*session_state*"), "a first context write"
            )
        finally:
            await before.aclose()
        doomed = redis_cluster.master_of(context_key)
        redis_cluster.hold_writes_until_replicated(doomed)  # what Redis acknowledged is kept by Redis
        killed = redis_cluster.kill(doomed)
        await until(
            redis_cluster.healthy,
            "a replica promoted for the killed master",
            timeout=FAILOVER_TIMEOUT_S,
            step=0.1,
        )
        answered_at_failover = fake_upstream.count("/v1/chat/completions")
        await until(
            lambda: fake_upstream.count("/v1/chat/completions"),
            "the load going on after the failover",
            ready=lambda count: count >= answered_at_failover + WORKERS * AFTER_FAILOVER,
            timeout=FAILOVER_TIMEOUT_S,
        )
        stop.set()
        results = [call for worker in await asyncio.gather(*load) for call in worker]
        after = redis_cluster.admin()
        try:
            reviews = {trace for status, decision, trace, _ in results if decision == "review"}
            sessions = {sid for status, decision, _, sid in results if decision == "accept"}
            traces = {trace for _, _, trace, _ in results}
            stream = await eventually(
                lambda: after.xrange(REVIEW_STREAM),
                "every review record in the stream",
                ready=lambda entries: len(entries) >= len(reviews),
                timeout=DELIVERY_TIMEOUT_S,
            )
            feedback = await eventually(
                lambda: cluster_keys(after, "cogproxy:answers:*"),
                "every feedback record in the cluster",
                ready=lambda keys: len(keys) >= len(traces),
                timeout=DELIVERY_TIMEOUT_S,
            )
            states = await eventually(
                lambda: cluster_keys(after, "cogproxy:ctx:*:session_state"),
                "every session's state in the cluster",
                ready=lambda keys: len(keys) >= len(sessions),
                timeout=DELIVERY_TIMEOUT_S,
            )
        finally:
            await after.aclose()
    assert killed not in redis_cluster.live()
    assert {status for status, *_ in results} == {200}, "a request failed during the failover"
    assert len(traces) == len(results) and reviews and sessions
    assert sorted(fields["trace_id"] for _, fields in stream) == sorted(reviews)  # each once
    assert sorted(key.removeprefix("cogproxy:answers:") for key in feedback) == sorted(traces)
    assert sorted(key.split(":")[-2] for key in states) == sorted(sessions)
