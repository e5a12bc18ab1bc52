"""The proxy's Redis Cluster client: ``redis.asyncio.cluster.RedisCluster`` with two differences.

* **Its failures are ``RedisError``s.** redis-py raises ``RedisClusterException`` (not a
  ``RedisError``) when no node gives it a slot map ("Redis Cluster cannot be connected": every
  seed down, an ACL user without ``cluster|slots``) or a slot has no node; every store falls back
  on ``RedisError``, so that escaped them and failed the request (500). Here it is a
  :class:`ClusterUnavailable`, a ``ConnectionError``: the store falls back, as with a single
  Redis that is down. Single commands only: pipelines (the outbox, the stream-recovery copy) are
  redis-py's own (a ``ClusterPipeline`` subclass converting the same way broke the outbox's
  delivery after a failover, cause not found yet).
* **One TLS context for every node.** With ``rediss+cluster://`` each node's connections are
  ``SharedTlsConnection`` (``proxy.state.redis_client``): one ``ssl.SSLContext`` per CA,
  certificate and key files, shared by every connection to every node, not one per connection.
"""

from __future__ import annotations

from typing import Any

from redis.asyncio.cluster import RedisCluster
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

    async def execute_command(self, *args: Any, **kwargs: Any) -> Any:
        # only what leaves redis-py's own retries is converted: inside them a RedisClusterException
        # is not retried like a ConnectionError, and must not become one
        try:
            return await super().execute_command(*args, **kwargs)
        except RedisClusterException as exc:
            raise ClusterUnavailable(str(exc)) from exc
