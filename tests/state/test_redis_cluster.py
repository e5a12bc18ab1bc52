"""Every Redis store against a real Redis Cluster (3 masters, 3 replicas, tests/support/redis_cluster.py):
the keys one script or one request touches together share a hash tag, so no command is refused
with CROSSSLOT and the limits check stays one all-or-none script."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
from redis.asyncio.cluster import RedisCluster
from redis.asyncio.connection import Connection
from redis.crc import key_slot

from proxy.clients import Caller, ClientIdentity
from proxy.context.identity import Identity, namespace_in
from proxy.context.store import ClientQuota
from proxy.limits.limiter import Limiter
from proxy.limits.windows import RedisCounters, spend_key, window_keys
from proxy.policy.limits import LimitSpec, LimitsPolicy
from proxy.state.context_store import RedisContextStore
from proxy.state.outbox import HashWrite, KeyWrite, RedisOutbox, StreamWrite, Write, _call_of, mark_key
from proxy.state.redis_client import RedisOptions, node_url, redis_client
from proxy.state.redis_store import RedisBreakerStore, breaker_keys
from proxy.state.store import BreakerState
from proxy.state.stream_sessions import SessionHub
from tests.support.polling import eventually, wait_sync
from tests.support.redis_cluster import Cluster, start_cluster

POLICY = LimitsPolicy(
    clients={"app": LimitSpec(rpm=2, usd_per_day=5.0)},
    teams={"red": LimitSpec(rpm=100, tpm=10_000)},
    global_=LimitSpec(rpm=1000, usd_per_month=100.0),
)
DURABLE_S = 15.0
CALLER = Caller("app-id", ClientIdentity(name="app", team="red"))


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    started = start_cluster()
    try:
        yield started
    finally:
        started.stop()


@pytest.fixture
async def options(cluster: Cluster) -> AsyncIterator[RedisOptions]:
    """The cluster's options; every key emptied after the test."""
    yield RedisOptions(cluster.url)
    client = RedisCluster.from_url(node_url(cluster.url)[0])
    await client.flushall(target_nodes=RedisCluster.PRIMARIES)
    await client.aclose()


def test_a_cluster_url_makes_cluster_clients_with_the_purposes_timeouts(cluster: Cluster) -> None:
    options = RedisOptions(cluster.url).with_timeout("limits", 0.5)
    assert options.cluster and not RedisOptions("redis://127.0.0.1:1/0").cluster
    client = redis_client(options, "limits")
    assert isinstance(client, RedisCluster)
    kwargs = client.get_connection_kwargs()
    assert (kwargs["socket_timeout"], kwargs["socket_connect_timeout"]) == (0.5, 0.5)
    assert node_url("rediss+cluster://h:1") == ("rediss://h:1", True)


async def test_one_requests_limits_are_one_script_on_one_slot_and_refuse_all_or_none(
    options: RedisOptions,
) -> None:
    limiter = Limiter.build(options, 1, lambda down: None)
    try:
        admitted = [await limiter.admit(POLICY, CALLER, 10) for _ in range(3)]
        assert not limiter.degraded
        assert [a.refused is None for a in admitted] == [True, True, False]
        refused = admitted[2].refused
        assert refused is not None and refused.scope == "client"
        # all or none: the refused request took nothing from the team and global windows
        team = next(w for w in admitted[2].windows if w.scope == "team" and w.kind == "requests")
        assert team.state.remaining == 98
        await limiter.settle(admitted[0], 7, 1.5)
        usage = await limiter.admit(POLICY, CALLER, 0, count=False)
        assert not limiter.degraded
        assert {b.period: b.spent_usd for b in usage.budgets} == {"day": 1.5, "month": 1.5}
    finally:
        await limiter.aclose()
    assert isinstance(limiter.counters, RedisCounters)


async def test_the_limits_check_and_a_clients_context_reads_go_in_one_cluster_pipeline(
    options: RedisOptions,
) -> None:
    """The limits script (its own slot) and the MGET of one client's keys (its namespace's slot)
    pipelined: each node gets its command, neither is refused with CROSSSLOT; the session's
    pending-write mark (its marks read, its own added) goes to the client's node with the MGET, and
    its removal through the outbox lands there too."""
    identity = Identity("00112233445566778899aabbccddeeff", "s3")
    keys = [identity.key("s3", "session_state"), identity.key("cache", "m", "h")]
    assert key_slot(keys[0].encode()) != key_slot(window_keys("client:app-id:req")[0].encode())
    writer: Any = redis_client(options, "context")
    limiter = Limiter.build(options, 1, lambda down: None)
    outbox = RedisOutbox(options)
    outbox.start()
    store = RedisContextStore(options, outbox)
    mark = store.mark(identity)
    assert mark is not None and key_slot(mark.key.encode()) == key_slot(keys[0].encode())
    try:
        await writer.set(keys[0], b"state")
        admitted = await limiter.admit(POLICY, CALLER, 10, reads=keys, mark=mark)
        assert not limiter.degraded and admitted.refused is None
        assert admitted.read == {keys[0]: b"state", keys[1]: None, mark.key: b""}  # no other mark alive
        assert await writer.zrange(mark.key, 0, -1) == [mark.member.encode()]
        store.release(mark)
        await eventually(lambda: _delivered(outbox), "the outbox delivered the mark's removal")
        assert await writer.zcard(mark.key) == 0
    finally:
        await limiter.aclose()
        await writer.aclose()
        await store.aclose()
        await outbox.aclose()


async def test_outbox_writes_of_every_kind_land_once_in_the_cluster(options: RedisOptions) -> None:
    outbox = RedisOutbox(options)
    outbox.start()
    identity = Identity("0123456789abcdef0123456789abcdef", "s1")
    context_key = identity.key("session", "s1")
    writes: list[Write] = [
        StreamWrite("cogproxy:review", {"a": "1"}, 100),
        KeyWrite("plain:key", "v", 60),
        HashWrite("cogproxy:answers:t1", "app", "{}", int(time.time() * 1000) + 60_000),
        KeyWrite(context_key, "ctx", 60, owner=namespace_in(context_key), max_entries=10, max_bytes=1000),
    ]
    reader: Any = redis_client(options, "outbox")
    try:
        for write in writes:
            assert outbox.put(write)
        await eventually(lambda: _delivered(outbox), "the outbox delivered everything")
        assert outbox.up
        assert await reader.xlen("cogproxy:review") == 1
        assert (await reader.get("plain:key"), await reader.get(context_key)) == ("v", "ctx")
        assert await reader.hget("cogproxy:answers:t1", "app") == "{}"
    finally:
        await outbox.aclose()
        await reader.aclose()


async def _delivered(outbox: RedisOutbox) -> bool:
    return len(outbox) == 0


async def test_durable_writes_wait_for_their_masters_replica(cluster: Cluster, options: RedisOptions) -> None:
    """``durable_replicas=1``: a write to a master whose replica is paused stays queued (WAIT on that
    master's pipeline connection counts 0), and is popped once the replica has it, once."""
    stream = "cogproxy:review:durable"
    master = cluster.master_of(stream)
    replica = cluster.replica_of(master)
    shortfalls: list[int] = []
    outbox = RedisOutbox(options, durable_replicas=1, on_short=shortfalls.append)
    outbox.start()
    replica.pause()
    try:
        assert outbox.put(StreamWrite(stream, {"n": "0"}, 100))
        assert outbox.put(KeyWrite("elsewhere:key", "v", 60))  # likely another master: popped with it
        await eventually(lambda: _shortfalls(shortfalls, 2), "two batches fell short", timeout=DURABLE_S)
        assert len(outbox) == 2 and set(shortfalls) == {0}
        assert master.cli("xlen", stream).strip() == "1"
        replica.resume()
        await eventually(lambda: _delivered(outbox), "the outbox popped the writes", timeout=DURABLE_S)
        assert await _replica_xlen(replica.port, stream) == 1  # the replica had it before the pop, once
    finally:
        replica.resume()
        await outbox.aclose()
        wait_sync(cluster.replicating, "the replica back in sync", timeout=DURABLE_S, step=0.1)


async def _replica_xlen(port: int, stream: str) -> int:
    """A replica's own length of ``stream`` (READONLY: it answers instead of redirecting)."""
    connection = Connection(port=port)
    try:
        await connection.send_command("READONLY")
        await connection.read_response()
        await connection.send_command("XLEN", stream)
        return int(await connection.read_response())
    finally:
        await connection.disconnect()


async def _shortfalls(seen: list[int], count: int) -> bool:
    return len(seen) >= count


async def test_context_is_written_with_its_quota_and_read_back(options: RedisOptions) -> None:
    outbox = RedisOutbox(options)
    outbox.start()
    store = RedisContextStore(options, outbox)
    identity = Identity("fedcba9876543210fedcba9876543210", "s2")
    quota = ClientQuota(max_entries=1, max_bytes=10_000)
    try:
        await store.put(identity.key("session", "a"), b"first", 60, quota=quota)
        await store.put(identity.key("session", "b"), b"second", 60, quota=quota)
        await eventually(lambda: _delivered(outbox), "the outbox delivered everything")
        # the quota (one entry) evicted the first: its keys share the client's slot
        assert await store.get(identity.key("session", "a")) is None
        assert await store.get(identity.key("session", "b")) == b"second"
        assert not store.degraded
    finally:
        await store.aclose()
        await outbox.aclose()


async def test_breaker_scripts_run_in_the_cluster(options: RedisOptions) -> None:
    store = RedisBreakerStore(options)
    try:
        published = await store.publish("up/cheap", BreakerState(1, 100.0), 60.0)
        assert published is not None and published.open_until == 100.0 and not store.degraded
        assert await store.state("up/cheap") == BreakerState(1, 100.0)
        assert await store.try_trial("up/cheap", 1, 101.0, 5.0, 1)
        assert not store.degraded
    finally:
        await store.aclose()


async def test_a_stream_session_written_by_one_replica_is_found_by_another(options: RedisOptions) -> None:
    writer = SessionHub(ttl_s=60, max_bytes=1 << 20, redis=options)
    reader = SessionHub(ttl_s=60, max_bytes=1 << 20, redis=options)
    try:
        session = writer.create("sk-client", "triage")
        session.append({"choices": [{"delta": {"content": "hi"}}]})
        session.finish()
        found = await eventually(lambda: reader.find(session.id), "the session in Redis")
        assert found is not None and found.module == "triage"
        assert await found.chunk_at(1) == {"choices": [{"delta": {"content": "hi"}}]}
    finally:
        await writer.aclose()
        await reader.aclose()


def test_the_keys_one_script_touches_share_a_slot() -> None:
    identity = Identity("0123456789abcdef0123456789abcdef")
    owner = namespace_in(identity.key("x"))
    assert owner == identity.namespace
    limits = [*window_keys("client:a:req"), *window_keys("global:all:tok"), spend_key("spend:x")]
    assert len({key_slot(k.encode()) for k in limits}) == 1
    assert len({key_slot(k.encode()) for k in breaker_keys("up/cheap")}) == 1
    _, quota_keys, _ = _call_of(KeyWrite(identity.key("a"), "v", 60, owner=owner, max_entries=1, max_bytes=9))
    assert len({key_slot(k.encode()) for k in quota_keys}) == 1
    for target in ("cogproxy:answers:t9", identity.key("b"), "cogproxy:review"):
        assert key_slot(mark_key("run", target, cluster=True).encode()) == key_slot(target.encode())
