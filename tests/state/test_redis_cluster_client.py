"""The proxy's Redis Cluster client (``proxy.state.redis_cluster_client``): a cluster it cannot use
is a ``RedisError`` to every store (they fall back as with a single Redis down, never a 500); with
``rediss+cluster://`` the CA, client certificate and key reach every node's connections, which
share one SSL context (a TLS-only cluster the test starts, certificates the test makes)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from redis.exceptions import RedisError

from proxy.limits.limiter import Limiter
from proxy.state.redis_client import RedisOptions, SharedTlsConnection, discover, redis_client
from tests.proxy_server import free_port
from tests.state.test_redis_cluster import CALLER, POLICY
from tests.support.polling import eventually, until
from tests.support.redis_cluster import Cluster, start_cluster
from tests.support.redis_cluster import redis_cluster as redis_cluster


async def test_a_cluster_no_node_answers_is_a_redis_error_and_the_limits_fall_back() -> None:
    options = RedisOptions(f"redis+cluster://127.0.0.1:{free_port()}").with_timeout("limits", 0.5)
    client: Any = redis_client(options, "limits")
    try:
        with pytest.raises(RedisError, match="cannot be connected"):
            await client.get("k")
    finally:
        await client.aclose()
    limiter = Limiter.build(options, 1, lambda down: None)
    try:
        admitted = await limiter.admit(POLICY, CALLER, 10)
    finally:
        await limiter.aclose()
    assert admitted.refused is None and limiter.degraded  # the local windows, not an exception


@pytest.fixture(scope="module")
def tls_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    started = start_cluster(tls_dir=tmp_path_factory.mktemp("tls-cluster"))
    try:
        yield started
    finally:
        started.stop()


def tls_options(cluster: Cluster) -> RedisOptions:
    certs = cluster.certs
    assert certs is not None
    return RedisOptions(
        cluster.url,
        ssl_ca_certs=str(certs.ca.cert),
        ssl_certfile=str(certs.client.cert),
        ssl_keyfile=str(certs.client.key),
    )


async def test_every_node_of_a_tls_cluster_is_reached_with_the_files_and_one_ssl_context(
    tls_cluster: Cluster,
) -> None:
    """redis-py builds an ``ssl.SSLContext`` per connection (the system CA store loaded each time);
    the proxy's clients, of every purpose, share one for every node, the discovered ones too."""
    assert tls_cluster.url.startswith("rediss+cluster://")
    options = tls_options(tls_cluster)
    client: Any = redis_client(options, "limits")
    other: Any = redis_client(options, "outbox")
    try:
        keys = [f"{{tag{i}}}:k" for i in range(30)]  # slots on every master
        for key in keys:
            await client.set(key, "v")
        assert [await client.get(key) for key in keys] == [b"v"] * len(keys)
        assert await other.get(keys[0]) == "v"
        masters = {tls_cluster.master_of(key).port for key in keys}
        connections = [c for each in (client, other) for node in each.get_nodes() for c in node._connections]
    finally:
        await client.aclose()
        await other.aclose()
    assert len(masters) == 3 and len({c.port for c in connections}) >= 3
    assert all(isinstance(c, SharedTlsConnection) for c in connections)
    contexts = {id(c.ssl_context.get()) for c in connections}
    assert len(contexts) == 1, "every client's connections to every node share one SSL context"


async def test_a_tls_cluster_refuses_a_client_without_its_certificate(tls_cluster: Cluster) -> None:
    certs = tls_cluster.certs
    assert certs is not None
    options = RedisOptions(tls_cluster.url, ssl_ca_certs=str(certs.ca.cert)).with_timeout("limits", 2)
    client: Any = redis_client(options, "limits")
    try:
        with pytest.raises(RedisError):
            await client.get("k")
    finally:
        await client.aclose()


async def test_a_client_first_used_after_its_seed_node_died_finds_the_cluster_the_process_knows(
    redis_cluster: Cluster,
) -> None:
    """redis-py's cluster client knows only its seed until its first command: a client of the
    proxy first used after that node died (a store idle until then) must start from the nodes
    another client of the process found, not fail for good."""
    options = RedisOptions(redis_cluster.url)
    late: Any = redis_client(options, "outbox")
    first: Any = redis_client(options, "context")
    try:
        await first.set("{a}:k", "v")  # this process found the cluster's nodes
    finally:
        await first.aclose()
    redis_cluster.kill(redis_cluster.seed)
    try:
        await until(redis_cluster.healthy, "the cluster whole without its seed", timeout=30, step=0.1)
        answer = await eventually(lambda: late.get("{a}:k"), "the late client's answer", ignore=(RedisError,))
    finally:
        await late.aclose()
    assert answer == "v"


async def test_the_nodes_found_at_start_outlive_the_seed(redis_cluster: Cluster) -> None:
    """``discover`` (called once as the proxy starts) lets every client made later from the same
    options reach the cluster although its seed died before their first command."""
    options = RedisOptions(redis_cluster.url)
    await discover(options)
    redis_cluster.kill(redis_cluster.seed)
    await until(redis_cluster.healthy, "the cluster whole without its seed", timeout=30, step=0.1)
    client: Any = redis_client(options, "limits")
    try:
        await eventually(lambda: client.set("{b}:k", "v"), "a write of a new client", ignore=(RedisError,))
    finally:
        await client.aclose()
