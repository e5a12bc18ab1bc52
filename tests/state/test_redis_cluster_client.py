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
from proxy.state.redis_client import RedisOptions, SharedTlsConnection, redis_client
from tests.proxy_server import free_port
from tests.state.test_redis_cluster import CALLER, POLICY
from tests.support.redis_cluster import Cluster, start_cluster


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
    assert tls_cluster.url.startswith("rediss+cluster://")
    client: Any = redis_client(tls_options(tls_cluster), "limits")
    try:
        keys = [f"{{tag{i}}}:k" for i in range(30)]  # slots on every master
        for key in keys:
            await client.set(key, "v")
        assert [await client.get(key) for key in keys] == [b"v"] * len(keys)
        masters = {tls_cluster.master_of(key).port for key in keys}
        connections = [c for node in client.get_nodes() for c in node._connections]
    finally:
        await client.aclose()
    assert len(masters) == 3 and len({c.port for c in connections}) >= 3
    assert all(isinstance(c, SharedTlsConnection) for c in connections)
    contexts = {id(c.ssl_context.get()) for c in connections}
    assert len(contexts) == 1, "every node's connections share one SSL context"


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
