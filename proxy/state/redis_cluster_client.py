"""The proxy's Redis Cluster client: ``redis.asyncio.cluster.RedisCluster`` with three differences.

* **Its failures are ``RedisError``s.** redis-py raises ``RedisClusterException`` (not a
  ``RedisError``) when no node gives it a slot map ("Redis Cluster cannot be connected": every
  seed down, an ACL user without ``cluster|slots``) or a slot has no node; every store falls back
  on ``RedisError``, so that escaped them and failed the request (500), and it killed the
  outbox's delivery task (a pipeline's). Here it is a :class:`ClusterUnavailable`, a
  ``ConnectionError``, for single commands and pipelines alike: the store falls back, the
  background writers retry, as with a single Redis that is down. Converted only where it leaves
  redis-py (``execute_command``, a pipeline's ``initialize`` and ``execute``): inside redis-py's
  retries a ``RedisClusterException`` is not retried like a ``ConnectionError``.
* **Its clients share the nodes they found.** redis-py's client knows only the URL's node (the
  seed) until its first command; one first used after that node died (a store idle until a
  failover) could never find the cluster again, though the process's other clients knew every
  node. The clients made from one ``RedisOptions`` share a :class:`KnownNodes`: each discovery
  starts from the seed and every node any of them found (``redis_client.discover`` fills it as
  the proxy starts).
* **One TLS context for every node.** With ``rediss+cluster://`` each node's connections are
  ``SharedTlsConnection`` (``proxy.state.redis_client``): one ``ssl.SSLContext`` per CA,
  certificate and key files, shared by every connection to every node, not one per connection.
"""

from __future__ import annotations

from typing import Any

from redis.asyncio.cluster import ClusterNode, ClusterPipeline, RedisCluster
from redis.asyncio.connection import Connection, SSLConnection
from redis.cluster import get_node_name
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import RedisClusterException


class ClusterUnavailable(RedisConnectionError):
    """The cluster could not be used (no slot map, a slot without a node): Redis is away."""


class KnownNodes:
    """The (host, port) of every node of the cluster the last discovery of any client sharing it
    found (the module docstring)."""

    def __init__(self) -> None:
        self.addresses: tuple[tuple[str, int], ...] = ()


class ProxyCluster(RedisCluster):
    """``RedisCluster`` whose failures are ``RedisError``s, whose discoveries start from the nodes
    its sibling clients found, and whose TLS connections share a context."""

    def __init__(
        self,
        *args: Any,
        tls_connection: type[Connection] | None = None,
        known_nodes: KnownNodes | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(*args, **kwargs)
        self.known_nodes = known_nodes if known_nodes is not None else KnownNodes()
        if tls_connection is not None and self.connection_kwargs["connection_class"] is SSLConnection:
            # nodes found later are made from connection_kwargs; the seeds were made already
            self.connection_kwargs["connection_class"] = tls_connection
            for node in self.startup_nodes:
                node.connection_class = tls_connection

    async def initialize(
        self,
        additional_startup_nodes_info: list[tuple[str, int]] | None = None,
        last_failed_node_name: str | None = None,
    ) -> ProxyCluster:
        if self._initialize:
            # seeds, not redis-py's "additional" nodes: those are never disconnected (a leak)
            manager = self.nodes_manager
            for host, port in self.known_nodes.addresses:
                if (name := get_node_name(host, port)) not in manager.startup_nodes:
                    manager.startup_nodes[name] = ClusterNode(host, port, **manager.connection_kwargs)
        await super().initialize(additional_startup_nodes_info, last_failed_node_name)
        if self.nodes_manager.nodes_cache:  # this client's nodes: where its siblings start from now
            self.known_nodes.addresses = tuple(
                (node.host, int(node.port)) for node in self.nodes_manager.nodes_cache.values()
            )
        return self

    def pipeline(self, transaction: Any = None, shard_hint: Any = None) -> ClusterPipeline:
        if shard_hint:  # redis-py refuses it
            return super().pipeline(transaction, shard_hint)
        return ProxyClusterPipeline(self, transaction)  # type: ignore[abstract]  # as redis-py makes its own

    async def execute_command(self, *args: Any, **kwargs: Any) -> Any:
        # only what leaves redis-py's own retries is converted: inside them a RedisClusterException
        # is not retried like a ConnectionError, and must not become one
        try:
            return await super().execute_command(*args, **kwargs)
        except RedisClusterException as exc:
            raise ClusterUnavailable(str(exc)) from exc


class ProxyClusterPipeline(ClusterPipeline):
    """A cluster pipeline whose failures, once redis-py's retries are over, are ``RedisError``s."""

    async def initialize(self) -> ClusterPipeline:
        try:
            return await super().initialize()
        except RedisClusterException as exc:
            raise ClusterUnavailable(str(exc)) from exc

    async def execute(self, raise_on_error: bool = True, allow_redirections: bool = True) -> list[Any]:
        try:
            return await super().execute(raise_on_error, allow_redirections)
        except RedisClusterException as exc:
            raise ClusterUnavailable(str(exc)) from exc
