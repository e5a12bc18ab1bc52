"""Stream recovery (spec v2.5 §3.2.6): resume after a drop, on another replica through Redis;
checkpoint mismatch, unknown session, another client key, recovery disabled; heartbeats; a stream
interrupted after an escalation (its last chunks a progress and a snapshot, no checkpoint)."""

from __future__ import annotations

import os
import signal
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import redis
import redis.asyncio
import yaml

from proxy.api.streaming import Recovery, _checkpoint_matches
from proxy.state.redis_client import RedisOptions
from proxy.state.stream_sessions import SessionHub
from proxy.stream.chunks import delta_chunk, progress_chunk, snapshot_chunk
from tests.api.test_modules import REVIEW_INPUT
from tests.api.test_streaming import RATIONALE, answer
from tests.conftest import ProxyWith
from tests.fake_upstream import FakeUpstream, Fault
from tests.proxy_server import (
    UPSTREAM_KEY,
    UPSTREAM_KEY_ENV,
    ServedProcess,
    proxy_process,
    running_proxy,
    upstream_policy,
)
from tests.redis_relay import RedisRelay
from tests.stream.client import read_sse, rendered, seq, sequenced
from tests.support.polling import eventually, has, until
from tests.support.redis_server import redis_url, server_pid

REDIS_URL = redis_url(11)
SSE = {"Accept": "text/event-stream"}
LONG = " ".join(f"word{i}" for i in range(60))


@pytest.fixture
async def slow_fake() -> AsyncIterator[FakeUpstream]:
    """A fake upstream that streams its answer word by word, 10 ms apart."""
    async with FakeUpstream.start(chunk_delay=0.01) as fake:
        yield fake


def _execute_url(base: str) -> str:
    return f"{base}/v1/modules/code-reviewer/execute"


async def _post(session: aiohttp.ClientSession, url: str, headers: dict[str, str], body: Any = None) -> Any:
    return await session.post(url, json=body or {"input": REVIEW_INPUT}, headers=headers)


async def _call(url: str, headers: dict[str, str], body: Any = None) -> tuple[int, Any]:
    """POST to ``url``: (status, the JSON body or the SSE events)."""
    async with aiohttp.ClientSession() as session, await _post(session, url, headers, body) as response:
        if response.headers["Content-Type"].startswith("application/json"):
            return response.status, await response.json()
        return response.status, await read_sse(response)


def _clean_redis() -> None:
    client = redis.Redis.from_url(REDIS_URL)
    try:
        keys = list(client.scan_iter("cogproxy:stream:*"))
        if keys:
            client.delete(*keys)
    finally:
        client.close()


@asynccontextmanager
async def _replicas(fake: FakeUpstream, tmp_path: Path) -> AsyncIterator[tuple[ServedProcess, ServedProcess]]:
    """Two ``cogproxy serve`` replicas sharing the suite's Redis, in front of ``fake`` (which streams
    the long rationale), their stream keys cleaned first."""
    _clean_redis()
    fake.set_default_reply("cheap", answer(0.92, rationale=LONG))
    policy = tmp_path / "policy.yaml"
    policy.write_text(yaml.safe_dump(upstream_policy(fake)))
    args = ("--policy", str(policy), "--redis-url", REDIS_URL)
    env = {UPSTREAM_KEY_ENV: UPSTREAM_KEY}
    async with proxy_process(*args, env=env) as one, proxy_process(*args, env=env) as two:
        yield one, two


async def test_a_drop_after_seq_n_resumes_on_another_replica_with_the_same_final(
    slow_fake: FakeUpstream, tmp_path: Path
) -> None:
    async with (
        _replicas(slow_fake, tmp_path) as (one, two),
        aiohttp.ClientSession() as session,
    ):
        async with await _post(session, _execute_url(one.url), SSE) as whole:
            uninterrupted = await read_sse(whole)
        assert slow_fake.count("/v1/chat/completions") == 1

        dropped = await _post(session, _execute_url(one.url), SSE)
        seen = await read_sse(dropped, stop_after=5)
        dropped.close()  # the client goes away after seq 5
        sid = seen[0][1]["session_id"]
        last = sequenced(seen)[-1]
        assert seq(last) == 5
        headers = {**SSE, "X-Cognitive-Recovery-Session": sid, "X-Cognitive-Recovery-Seq": "5"}
        async with await _post(session, _execute_url(two.url), headers) as resumed:
            assert resumed.status == 200
            rest = await read_sse(resumed)
    meta = rest[0][1]
    assert meta["resumed"] is True and meta["resume_from_seq"] == 6 and meta["session_id"] == sid
    assert [seq(c) for c in sequenced(rest)][:2] == [6, 7]
    final, reference = rest[-1][1], uninterrupted[-1][1]
    assert final["final"] is True and final["data"] == reference["data"]
    assert final["meta"]["confidence"] == reference["meta"]["confidence"]
    assert rendered(seen + rest)["data.rationale"] == LONG == rendered(uninterrupted)["data.rationale"]
    assert slow_fake.count("/v1/chat/completions") == 2  # the dropped call was not made twice


@pytest.fixture
async def local(fake_upstream: FakeUpstream, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    monkeypatch.setenv(UPSTREAM_KEY_ENV, UPSTREAM_KEY)
    async with running_proxy(tmp_path, upstream_policy(fake_upstream)) as proxy:
        yield proxy


async def _whole_stream(local: Any, fake: FakeUpstream, key: str = "sk-a") -> list[Any]:
    fake.script("cheap", answer(0.92))
    _, events = await _call(_execute_url(local.url), {**SSE, "Authorization": f"Bearer {key}"})
    return list(events)


async def test_a_resume_after_the_end_replays_the_rest_from_memory(
    local: Any, fake_upstream: FakeUpstream
) -> None:
    events = await _whole_stream(local, fake_upstream)
    sid = events[0][1]["session_id"]
    third = sequenced(events)[2]
    body = {
        "input": REVIEW_INPUT,
        "_recovery": {"session_id": sid, "last_seq": 3, "last_checkpoint": third["chunk"]["checkpoint"]},
    }
    _, rest = await _call(_execute_url(local.url), {**SSE, "Authorization": "Bearer sk-a"}, body)
    assert rest[0][1]["resume_from_seq"] == 4
    assert [seq(c) for c in sequenced(rest)] == [seq(c) for c in sequenced(events)][3:]
    assert rest[-1][1] == events[-1][1]
    assert fake_upstream.count("/v1/chat/completions") == 1
    async with aiohttp.ClientSession() as session:
        metrics = await (await session.get(local.url + "/metrics")).text()
    assert 'cognitive_stream_ttfd_seconds_count{module="code-reviewer"} 1.0' in metrics
    assert 'cognitive_streams_total{module="code-reviewer",outcome="final"} 1.0' in metrics
    assert 'cognitive_stream_resumptions_total{result="resumed"} 1.0' in metrics
    assert "cognitive_stream_sessions 0.0" in metrics


async def test_a_checkpoint_mismatch_restarts_at_seq_1_with_a_warning(
    local: Any, fake_upstream: FakeUpstream
) -> None:
    events = await _whole_stream(local, fake_upstream)
    sid = events[0][1]["session_id"]
    body = {
        "input": REVIEW_INPUT,
        "_recovery": {"session_id": sid, "last_seq": 3, "last_checkpoint": {"offset": 1, "hash": "000000"}},
    }
    _, again = await _call(_execute_url(local.url), {**SSE, "Authorization": "Bearer sk-a"}, body)
    meta = again[0][1]
    assert meta["resumed"] is False and meta["resume_from_seq"] == 1
    assert meta["_warnings"][0]["code"] == "W4012"
    assert seq(sequenced(again)[0]) == 1 and again[-1][1] == events[-1][1]


async def test_an_unknown_session_starts_a_new_stream(local: Any, fake_upstream: FakeUpstream) -> None:
    fake_upstream.script("cheap", answer(0.92))
    unknown = "sess_" + "0" * 32
    headers = {**SSE, "X-Cognitive-Recovery-Session": unknown, "X-Cognitive-Recovery-Seq": "4"}
    _, events = await _call(_execute_url(local.url), headers)
    meta = events[0][1]
    assert meta["session_id"] != unknown and "resumed" not in meta
    assert seq(sequenced(events)[0]) == 1 and events[-1][1]["final"] is True


async def test_a_recovery_with_another_client_key_is_refused(
    fake_upstream: FakeUpstream, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(UPSTREAM_KEY_ENV, UPSTREAM_KEY)
    keys = frozenset({"sk-a", "sk-b"})
    async with running_proxy(tmp_path, upstream_policy(fake_upstream), api_keys=keys) as local:
        await _refused_to_another_key(local, fake_upstream)


async def _refused_to_another_key(local: Any, fake_upstream: FakeUpstream) -> None:
    events = await _whole_stream(local, fake_upstream, key="sk-a")
    sid = events[0][1]["session_id"]
    headers = {
        **SSE,
        "Authorization": "Bearer sk-b",
        "X-Cognitive-Recovery-Session": sid,
        "X-Cognitive-Recovery-Seq": "1",
    }
    status, body = await _call(_execute_url(local.url), headers)
    assert status == 403
    assert body["ok"] is False and body["error"]["code"] == "E4007"
    assert fake_upstream.count("/v1/chat/completions") == 1


async def test_recovery_disabled_answers_e4012(
    fake_upstream: FakeUpstream, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(UPSTREAM_KEY_ENV, UPSTREAM_KEY)
    async with running_proxy(tmp_path, upstream_policy(fake_upstream), stream_recovery=False) as proxy:
        headers = {**SSE, "X-Cognitive-Recovery-Session": "sess_" + "1" * 32, "X-Cognitive-Recovery-Seq": "2"}
        status, body = await _call(_execute_url(proxy.url), headers)
    assert status == 400
    assert body["error"]["code"] == "E4012" and fake_upstream.requests == []


async def test_no_stream_recovery_flag_answers_e4012_from_serve(
    fake_upstream: FakeUpstream, tmp_path: Path
) -> None:
    policy = tmp_path / "policy.yaml"
    policy.write_text(yaml.safe_dump(upstream_policy(fake_upstream)))
    async with (
        proxy_process("--policy", str(policy), "--no-stream-recovery") as served,
        aiohttp.ClientSession() as session,
    ):
        body = {"input": REVIEW_INPUT, "_recovery": {"session_id": "sess_" + "2" * 32, "last_seq": 1}}
        async with await _post(session, _execute_url(served.url), SSE, body) as response:
            assert response.status == 400
            assert (await response.json())["error"]["code"] == "E4012"


async def test_heartbeats_fill_the_silence_before_the_first_delta(
    fake_upstream: FakeUpstream, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(UPSTREAM_KEY_ENV, UPSTREAM_KEY)
    fake_upstream.script("cheap", Fault.slow(0.3, answer(0.92)))
    async with running_proxy(tmp_path, upstream_policy(fake_upstream), stream_heartbeat_s=0.02) as proxy:
        _, events = await _call(_execute_url(proxy.url), SSE)
    first_sequenced = next(i for i, (_, c) in enumerate(events) if seq(c) is not None)
    beats = [c for _, c in events[1:first_sequenced]]
    assert beats and all(c == {} for c in beats)
    assert events[-1][1]["final"] is True and rendered(events)["data.rationale"] == RATIONALE


@pytest.mark.parametrize(
    ("headers", "body"),
    [
        ({"X-Cognitive-Recovery-Session": "sess_x", "X-Cognitive-Recovery-Seq": "two"}, None),
        ({"X-Cognitive-Recovery-Session": "sess_x", "X-Cognitive-Recovery-Seq": "-1"}, None),
        ({}, {"input": REVIEW_INPUT, "_recovery": {"last_seq": 1}}),
        ({}, {"input": REVIEW_INPUT, "_recovery": "sess_x"}),
    ],
)
async def test_a_malformed_recovery_context_is_a_400(
    local: Any, headers: dict[str, str], body: dict[str, Any] | None
) -> None:
    status, answer_body = await _call(_execute_url(local.url), {**SSE, **headers}, body)
    assert status == 400 and answer_body["error"]["code"] == "E1001"


def test_stream_chunks_in_redis_expire(tmp_path: Path) -> None:
    """Nothing is left in Redis without a TTL (checked after the replica test above ran)."""
    client = redis.Redis.from_url(REDIS_URL)
    try:
        for key in client.scan_iter("cogproxy:stream:*"):
            assert 0 < client.ttl(key) <= 300, key
    finally:
        client.close()


async def test_without_recovery_a_client_that_leaves_cancels_the_upstream_call(
    slow_fake: FakeUpstream, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(UPSTREAM_KEY_ENV, UPSTREAM_KEY)
    slow_fake.set_default_reply("cheap", answer(0.92, rationale=LONG))
    async with (
        running_proxy(tmp_path, upstream_policy(slow_fake), stream_recovery=False) as proxy,
        aiohttp.ClientSession() as session,
    ):
        response = await _post(session, _execute_url(proxy.url), SSE)
        await read_sse(response, stop_after=2)
        response.close()
        await until(
            lambda: slow_fake.cancelled,
            "the upstream call cancelled after the client left",
            timeout=10,
            step=0.01,
        )


@pytest.mark.parametrize("last_seq", ["9223372036854775808", "99999999999999999999999"])
async def test_a_seq_beyond_redis_range_on_another_replica_restarts_not_500(
    fake_upstream: FakeUpstream, tmp_path: Path, last_seq: str
) -> None:
    """A last_seq no Redis list index can hold is a seq the session never had: W4012, not a 500."""
    _clean_redis()
    fake_upstream.set_default_reply("cheap", answer(0.92))
    policy = tmp_path / "policy.yaml"
    policy.write_text(yaml.safe_dump(upstream_policy(fake_upstream)))
    args = ("--policy", str(policy), "--redis-url", REDIS_URL)
    env = {UPSTREAM_KEY_ENV: UPSTREAM_KEY}
    async with proxy_process(*args, env=env) as one, proxy_process(*args, env=env) as two:
        _, events = await _call(_execute_url(one.url), SSE)
        sid = events[0][1]["session_id"]
        headers = {**SSE, "X-Cognitive-Recovery-Session": sid, "X-Cognitive-Recovery-Seq": last_seq}
        status, rest = await _call(_execute_url(two.url), headers)
    assert status == 200
    assert rest[0][1]["resume_from_seq"] == 1 and rest[0][1]["resumed"] is False
    assert rest[-1][1] == events[-1][1]


@pytest.mark.parametrize("last_seq", [1.5, "1.5", -1, True, [], "x"])
async def test_a_last_seq_that_is_not_a_whole_number_is_refused(local: Any, last_seq: Any) -> None:
    """``_recovery.last_seq`` 1.5 is refused like ``X-Cognitive-Recovery-Seq: 1.5`` (E1001), not
    truncated to seq 1."""
    body = {"input": REVIEW_INPUT, "_recovery": {"session_id": "sess_" + "0" * 32, "last_seq": last_seq}}
    status, refused = await _call(_execute_url(local.url), SSE, body)
    assert status == 400
    assert refused["error"]["code"] == "E1001" and "last_seq" in refused["error"]["message"]


def _half_written_sessions() -> list[str]:
    """Sessions in Redis marked done whose list is not exactly their chunks 1..count."""
    client = redis.Redis.from_url(REDIS_URL)
    try:
        broken = []
        for key in client.scan_iter("cogproxy:stream:*:info"):
            info = client.hgetall(key)
            if info.get(b"done") != b"1":
                continue
            entries: list[bytes] = list(client.lrange(key.replace(b":info", b":events"), 0, -1))  # type: ignore[arg-type]  # redis-py types replies as str; decode_responses is off
            positions = [entry.split(b" ", 1)[0] for entry in entries]
            whole = [b"%d" % i for i in range(len(entries))]
            if info.get(b"count") != b"%d" % len(entries) or positions != whole:
                broken.append(key.decode())
        return broken
    finally:
        client.close()


async def _logged(served: ServedProcess, event: str) -> bool:
    return event in served.stdout.text() + served.stderr.text()


async def test_a_redis_freeze_mid_stream_never_leaves_a_partial_session_marked_done(
    slow_fake: FakeUpstream, tmp_path: Path
) -> None:
    """#29.7 end to end: Redis is frozen (SIGSTOP of the suite's own redis-server) while replica one
    streams a module answer, until its mirror reports a failed write, then resumed. Recovery on
    replica two then gets the rest of the same answer, a new whole stream, or an E2010 error chunk;
    never a partial one ending as if complete, and Redis holds no half-written session marked done."""
    async with (
        _replicas(slow_fake, tmp_path) as (one, two),
        aiohttp.ClientSession() as session,
    ):
        dropped = await _post(session, _execute_url(one.url), SSE)
        seen = await read_sse(dropped, stop_after=5)
        sid = seen[0][1]["session_id"]
        os.kill(server_pid(), signal.SIGSTOP)
        try:
            await eventually(
                lambda: _logged(one, "proxy.stream_mirror_failed"), "the mirror failing a write", timeout=20
            )
        finally:
            os.kill(server_pid(), signal.SIGCONT)
        seen += await read_sse(dropped)  # the producer's own replica serves it whole from memory
        dropped.close()
        assert seen[-1][1].get("final") is True
        assert rendered(seen)["data.rationale"] == LONG
        headers = {**SSE, "X-Cognitive-Recovery-Session": sid, "X-Cognitive-Recovery-Seq": "5"}
        status, rest = await _call(_execute_url(two.url), headers)
    assert status == 200
    meta, last = rest[0][1], rest[-1][1]
    if meta["session_id"] == sid and meta.get("resumed") is True:  # the copy was whole
        if last.get("final") is True:
            assert seq(sequenced(rest)[0]) == 6
            head = [event for event in seen if (seq(event[1]) or 0) <= 5]
            assert rendered(head + rest)["data.rationale"] == LONG
        else:
            assert last["error"]["code"] == "E2010", last
    else:  # not recoverable here: a new stream, whole
        assert meta["session_id"] != sid and last.get("final") is True
        assert rendered(rest)["data.rationale"] == LONG
    assert _half_written_sessions() == []


async def test_a_session_dropped_from_the_redis_copy_is_counted_on_metrics(
    fake_upstream: FakeUpstream, relay: RedisRelay, proxy_with: ProxyWith
) -> None:
    """#32.2: a session that cannot be copied to Redis (here: Redis unreachable) is no longer
    resumable on another replica; ``/metrics`` says so instead of silence."""
    fake_upstream.set_default_reply("cheap", answer(0.92))
    relay.cut()
    async with (
        proxy_with(upstream_policy(fake_upstream), redis_url=relay.url(11)) as px,
        aiohttp.ClientSession() as session,
    ):
        _, events = await _call(_execute_url(px.url), SSE)
        assert events[-1][1].get("final") is True  # served whole from this replica's memory

        async def scrape() -> str:
            return await (await session.get(px.url + "/metrics")).text()

        await eventually(
            scrape,
            "the dropped session counted",
            ready=has('cognitive_stream_mirror_dropped_total{reason="failed"} 1.0'),
            timeout=20,
        )


WEAK = "A weak first guess at the answer."
CAREFUL = "The strong rung's careful answer."


def _escalating(fake: FakeUpstream) -> None:
    """The fast rung answers with too little confidence: the ladder escalates to strong."""
    fake.script("cheap", answer(0.3, rationale=WEAK))
    fake.script("strong", answer(0.95, rationale=CAREFUL))


def _recovery_body(sid: str, last_seq: int, checkpoint: Any) -> dict[str, Any]:
    context = {"session_id": sid, "last_seq": last_seq, "last_checkpoint": checkpoint}
    return {"input": REVIEW_INPUT, "_recovery": context}


def _resumption(meta: dict[str, Any]) -> dict[str, Any]:
    return {k: meta.get(k) for k in ("resumed", "resume_from_seq", "_warnings")}


def _kind(chunk: dict[str, Any]) -> str:
    return "progress" if "progress" in chunk else str(chunk.get("chunk", {}).get("type", "end"))


async def test_a_stream_interrupted_after_an_escalation_resumes_with_its_own_recovery_context(
    fake_upstream: FakeUpstream, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The strong rung is held until the first response ends (E2011: nothing within the session
    TTL) just after the progress and snapshot chunks of the escalation: its error chunk's
    ``recovery``, sent back as is (§3.2.6.3), resumes the session from ``last_seq + 1``."""
    monkeypatch.setenv(UPSTREAM_KEY_ENV, UPSTREAM_KEY)
    _escalating(fake_upstream)
    gate = fake_upstream.hold("strong")
    async with running_proxy(tmp_path, upstream_policy(fake_upstream), stream_session_ttl_s=2.0) as proxy:
        _, first = await _call(_execute_url(proxy.url), SSE)
        assert gate.reached.is_set()
        gate.release()
        error = first[-1][1]["error"]
        assert error["code"] == "E2011", first[-1]
        kinds = [_kind(c) for c in sequenced(first)]
        assert kinds[-2:] == ["progress", "snapshot"] and "delta" in kinds, kinds
        recovery = error["recovery"]
        last_delta = [c for c in sequenced(first) if _kind(c) == "delta"][-1]
        assert recovery["last_seq"] == seq(sequenced(first)[-1])
        assert recovery["last_checkpoint"] == last_delta["chunk"]["checkpoint"]
        sid = first[0][1]["session_id"]
        body = _recovery_body(sid, recovery["last_seq"], recovery["last_checkpoint"])
        _, rest = await _call(_execute_url(proxy.url), SSE, body)
    meta = rest[0][1]
    assert meta.get("resumed") is True and "_warnings" not in meta, _resumption(meta)
    assert meta["resume_from_seq"] == recovery["last_seq"] + 1
    assert seq(sequenced(rest)[0]) == recovery["last_seq"] + 1
    assert rest[-1][1]["final"] is True and rest[-1][1]["cognitive"]["decision"] == "escalated"
    assert rendered(first + rest)["data.rationale"] == CAREFUL
    assert fake_upstream.count("/v1/chat/completions") == 2  # nothing asked twice


async def _escalated_stream(local: Any, fake: FakeUpstream) -> list[dict[str, Any]]:
    """The sequenced chunks of a whole escalated stream: deltas, progress, snapshot, deltas, final."""
    _escalating(fake)
    _, events = await _call(_execute_url(local.url), SSE)
    chunks = sequenced(events)
    kinds = [_kind(c) for c in chunks]
    assert kinds.count("progress") == 1 and kinds[kinds.index("progress") - 1] == "delta", kinds
    assert events[0][1]["session_id"] and chunks[-1]["final"] is True
    return [events[0][1], *chunks]


def _last_delta_before(chunks: list[dict[str, Any]], last_seq: int) -> dict[str, Any]:
    return [c for c in chunks if _kind(c) == "delta" and (seq(c) or 0) <= last_seq][-1]


@pytest.mark.parametrize(
    ("at", "checkpoint_of", "resumed"),
    [
        pytest.param("progress", "last delta", True, id="after-the-progress-chunk"),
        pytest.param("snapshot", "last delta", True, id="after-the-snapshot"),
        pytest.param("snapshot", "none", True, id="after-the-snapshot-without-checkpoint"),
        pytest.param("snapshot", "first delta", False, id="an-earlier-delta-checkpoint"),
        pytest.param("snapshot", "wrong", False, id="a-wrong-checkpoint"),
        pytest.param("beyond", "last delta", False, id="a-seq-beyond-the-session"),
    ],
)
async def test_a_resume_after_an_escalation_checks_the_last_checkpoint_at_or_before_last_seq(
    local: Any, fake_upstream: FakeUpstream, at: str, checkpoint_of: str, resumed: bool
) -> None:
    """A retry naming a seq after the escalation holds the checkpoint of the last delta before it
    (progress and snapshot chunks carry none): resumed. Another checkpoint, or a seq the session
    never had, replays it from seq 1 with W4012."""
    meta, *chunks = await _escalated_stream(local, fake_upstream)
    kinds = [_kind(c) for c in chunks]
    last_seq = len(chunks) + 1 if at == "beyond" else seq(chunks[kinds.index(at)])
    assert last_seq is not None
    checkpoint = {
        "last delta": _last_delta_before(chunks, last_seq)["chunk"]["checkpoint"],
        "first delta": chunks[0]["chunk"]["checkpoint"],
        "wrong": {"offset": 1, "hash": "000000"},
        "none": None,
    }[checkpoint_of]
    body = _recovery_body(meta["session_id"], last_seq, checkpoint)
    _, again = await _call(_execute_url(local.url), SSE, body)
    first = again[0][1]
    if resumed:
        assert first.get("resumed") is True and first["resume_from_seq"] == last_seq + 1, _resumption(first)
        assert sequenced(again) == chunks[last_seq:]
    else:
        assert first["resumed"] is False and first["resume_from_seq"] == 1
        assert first["_warnings"][0]["code"] == "W4012"
        assert sequenced(again) == chunks
    assert fake_upstream.count("/v1/chat/completions") == 2


async def test_a_replica_reading_the_redis_copy_checks_the_last_checkpoint_at_or_before_last_seq() -> None:
    """The check of a retry landing on another replica, on the chunks of the Redis copy."""
    _clean_redis()
    producer = SessionHub(ttl_s=60, max_bytes=1 << 20, redis=RedisOptions(REDIS_URL))
    replica = SessionHub(ttl_s=60, max_bytes=1 << 20, redis=RedisOptions(REDIS_URL))
    store = redis.asyncio.Redis.from_url(REDIS_URL)
    try:
        session = producer.create("sk-a", "code-reviewer")
        first, second = (
            delta_chunk(1, "data.rationale", "a", "a"),
            delta_chunk(2, "data.rationale", "b", "ab"),
        )
        for chunk in (first, second, progress_chunk(3, "escalating", "fast", "strong", "low confidence")):
            session.append(chunk)
        session.append(snapshot_chunk(4, {}))
        events = f"cogproxy:stream:{session.id}:events"
        await eventually(lambda: store.llen(events), "the copy", ready=lambda n: n == 4, timeout=20)
        found = await replica.find(session.id)
        assert found is not None and found.source is not session
        last, earlier = second["chunk"]["checkpoint"], first["chunk"]["checkpoint"]
        for last_seq, checkpoint, valid in [
            (3, last, True),
            (4, last, True),
            (4, None, True),
            (4, earlier, False),
            (5, last, False),  # a seq the copy never had
            (1, earlier, True),
        ]:
            recovery = Recovery(session.id, last_seq, checkpoint)
            assert await _checkpoint_matches(found.chunk_at, recovery) is valid, (last_seq, checkpoint)
    finally:
        for hub in (producer, replica):
            await hub.aclose()
        await store.aclose()
        _clean_redis()
