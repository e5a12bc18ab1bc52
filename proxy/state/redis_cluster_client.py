"""The proxy's Redis Cluster client: ``redis.asyncio.cluster.RedisCluster`` with two differences.

* **Its failures are ``RedisError``s.** redis-py raises ``RedisClusterException`` (not a
  ``RedisError``) when no node gives it a slot map ("Redis Cluster cannot be connected": every
  seed down, an ACL user without ``cluster|slots``) or a slot has no node; every store falls back
  on ``RedisError``, so that escaped them and failed the request (500). Here it is a
  :class:`ClusterUnavailable`, a ``ConnectionError``: the store falls back, the outbox keeps the
  write, as with a single Redis that is down.
* **One TLS context for every node.** With ``rediss+cluster://`` each node's connections are
  ``SharedTlsConnection`` (``proxy.state.redis_client``): one ``ssl.SSLContext`` per CA,
  certificate and key files, shared by every connection to every node, not one per connection.
"""

from __future__ import annotations

from typing import Any

from redis.asyncio.cluster import ClusterPipeline, RedisCluster
from redis.asyncio.connection import Connection, SSLConnection
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import RedisClusterException


class ClusterUnavailable(RedisConnectionError):
    """The cluster could not be used (no slot map, a slot without a node): Redis is away."""


class ProxyCluster(RedisCluster):
    """``RedisCluster`` whose failures are ``RedisError``s and whose TLS connections share a context."""

    def __init__(self, *args: Any, tls_connection: type[Connection] | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if tls_connection is not None and self.connection_kwargs["connection_class"] is SSLConnection:
            # nodes found later are made from connection_kwargs; the seeds were made already
            self.connection_kwargs["connection_class"] = tls_connection
            for node in self.startup_nodes:
                node.connection_class = tls_connection

    async def initialize(self, *args: Any, **kwargs: Any) -> ProxyCluster:
        try:
            await super().initialize(*args, **kwargs)
        except RedisClusterException as exc:
            raise ClusterUnavailable(str(exc)) from exc
        return self

    async def execute_command(self, *args: Any, **kwargs: Any) -> Any:
        try:
            return await super().execute_command(*args, **kwargs)
        except RedisClusterException as exc:
            raise ClusterUnavailable(str(exc)) from exc

    def pipeline(self, transaction: Any | None = None, shard_hint: Any | None = None) -> ClusterPipeline:
        if shard_hint:
            return super().pipeline(transaction, shard_hint)
        return _Pipeline(self, transaction)  # type: ignore[abstract]  # as redis-py makes its own


class _Pipeline(ClusterPipeline):
    async def execute(self, raise_on_error: bool = True, allow_redirections: bool = True) -> list[Any]:
        try:
            return await super().execute(raise_on_error, allow_redirections)
        except RedisClusterException as exc:
            raise ClusterUnavailable(str(exc)) from exc
