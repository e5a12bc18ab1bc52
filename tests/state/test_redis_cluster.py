"""Every Redis store against a real Redis Cluster (3 masters, 3 replicas, tests/support/redis_cluster.py):
the keys one script or one request touches together share a hash tag, so no command is refused
with CROSSSLOT and the limits check stays one all-or-none script."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator

import pytest
from redis.asyncio.cluster import RedisCluster

from proxy.clients import Caller, ClientIdentity
from proxy.policy.limits import LimitSpec, LimitsPolicy
from proxy.state.redis_client import RedisOptions, node_url, redis_client
from tests.support.redis_cluster import Cluster, start_cluster

POLICY = LimitsPolicy(
    clients={"app": LimitSpec(rpm=2, usd_per_day=5.0)},
    teams={"red": LimitSpec(rpm=100, tpm=10_000)},
    global_=LimitSpec(rpm=1000, usd_per_month=100.0),
)
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
