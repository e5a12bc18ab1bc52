"""The outbox while a Redis Cluster is down: a master and its replica hung (SIGSTOP), so every other
node answers ``CLUSTERDOWN`` to every command, whatever its slot. Those answers are an outage, not
a refusal of the write: the writes are kept and delivered once the cluster is whole, none dropped."""

from __future__ import annotations

import time
from itertools import islice
from typing import Any

from proxy.state.outbox import HashWrite, KeyWrite, RedisOutbox, StreamWrite, Write
from proxy.state.redis_client import RedisOptions
from tests.support.polling import until
from tests.support.redis_cluster import Cluster
from tests.support.redis_cluster import redis_cluster as redis_cluster

FAILURE_DETECTION_S = 30.0


def keys_off(cluster: Cluster, paused: list[Any], count: int) -> list[str]:
    """``count`` keys whose slots live masters serve (their writes reach a node that answers)."""
    keys = (f"cogproxy:down-test:{i}" for i in range(10_000))
    return list(islice((key for key in keys if cluster.master_of(key) not in paused), count))


async def test_writes_answered_clusterdown_are_kept_and_delivered_once_the_cluster_heals(
    redis_cluster: Cluster,
) -> None:
    dropped: list[Write] = []
    outbox = RedisOutbox(RedisOptions(redis_cluster.url), on_drop=dropped.append)
    outbox.start()
    assert outbox.put(KeyWrite("cogproxy:down-test:before", "v", 600))
    await until(lambda: len(outbox) == 0, "a first write delivered (the scripts loaded)")
    paused = redis_cluster.pause_shard_of("{hung}")
    await until(
        redis_cluster.down,
        "the other nodes saying the cluster is down",
        timeout=FAILURE_DETECTION_S,
        step=0.1,
    )
    keys = keys_off(redis_cluster, paused, 6)
    admin = None
    try:
        writes: list[Write] = [KeyWrite(key, "v", 600) for key in keys[:4]]
        writes.append(HashWrite(keys[4], "app", "{}", int(time.time() * 1000) + 600_000))
        writes.append(StreamWrite(keys[5], {"trace_id": "t"}, 100))
        for write in writes:
            assert outbox.put(write)
        await until(lambda: not outbox.up or dropped, "the outbox meeting the down cluster", timeout=10)
        redis_cluster.resume()
        await until(redis_cluster.healthy, "the cluster whole again", timeout=FAILURE_DETECTION_S, step=0.1)
        await until(lambda: len(outbox) == 0, "every write delivered", timeout=FAILURE_DETECTION_S)
        admin = redis_cluster.admin()
        assert [await admin.get(key) for key in keys[:4]] == ["v"] * 4
        assert await admin.hget(keys[4], "app") == "{}"
        assert await admin.xlen(keys[5]) == 1
    finally:
        await outbox.aclose()
        if admin is not None:
            await admin.aclose()
    assert dropped == []


async def test_the_outbox_outlives_a_cluster_no_node_answers_and_delivers_every_write_after(
    redis_cluster: Cluster,
) -> None:
    """Every node hung (SIGSTOP): once its connections time out, redis-py's cluster pipeline finds
    no node to ask for a slot map and raises its own ``RedisClusterException``, not a
    ``RedisError``. The delivery task must take it for an outage like any other, never die."""
    dropped: list[Write] = []
    outbox = RedisOutbox(RedisOptions(redis_cluster.url), on_drop=dropped.append)
    outbox.start()
    keys = [f"cogproxy:unreachable-test:{{{i}}}" for i in range(6)]
    admin = None
    try:
        assert outbox.put(KeyWrite("cogproxy:unreachable-test:before", "v", 600))
        await until(lambda: len(outbox) == 0, "a first write delivered (the scripts loaded)")
        redis_cluster.pause_all()
        for key in keys:
            assert outbox.put(KeyWrite(key, "v", 600))
        await until(
            lambda: outbox.failures >= 3,
            "the outbox retrying past the nodes' timeouts",
            timeout=FAILURE_DETECTION_S,
        )
        redis_cluster.resume()
        await until(
            redis_cluster.healthy, "the cluster answering again", timeout=FAILURE_DETECTION_S, step=0.1
        )
        await until(lambda: len(outbox) == 0, "every write delivered", timeout=FAILURE_DETECTION_S)
        admin = redis_cluster.admin()
        assert [await admin.get(key) for key in keys] == ["v"] * len(keys)
    finally:
        await outbox.aclose()
        if admin is not None:
            await admin.aclose()
    assert dropped == []
