"""Every Redis client of the proxy: one frozen ``RedisOptions`` (URL, per-purpose timeouts, TLS and
ACL auth), one factory ``redis_client(options, purpose)``, and one ``RedisHealth`` ("Redis is down
until") for the stores that fall back while Redis is away.

A purpose is what a client is for; its timeout is how long one command (and connecting) may take:

* ``limits``: the limits check on every request; past it the replica uses its local windows.
* ``breakers``, ``context``, ``feedback``: reads on the request path; past it the store falls back.
* ``outbox``, ``streams``: background writers (the outbox, the stream-session mirror), which retry.
* ``review``: the review console reading the review stream (a page of entries) and closing items.
* ``scan``: ``cogproxy calibration`` reading every feedback record (one command at a time, each
  short: a bounded ``SCAN`` step, one hash), so a silent endpoint is an error, not a wait forever.

A URL of scheme ``redis+cluster://`` (``rediss+cluster://`` with TLS) names one node of a Redis
Cluster: the clients are ``redis.asyncio.cluster.RedisCluster`` then (``ProxyCluster``: its
failures ``RedisError``s, one TLS context for all nodes), which find the other nodes and follow
the slots (see ``docs/deployment.md``, "Redis Cluster").
"""

from __future__ import annotations

import asyncio
import ssl
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import MappingProxyType
from typing import Any, Literal

import redis.asyncio as aioredis
from redis.asyncio.connection import SSLConnection
from redis.exceptions import RedisClusterException, RedisError

from proxy.state.redis_access import CLUSTER_SCHEMES, TLS_SCHEMES, check_url
from proxy.state.redis_cluster_client import KnownNodes, ProxyCluster
from proxy.state.redis_defaults import LIMITS_TIMEOUT_S

Purpose = Literal["limits", "breakers", "context", "feedback", "outbox", "streams", "review", "scan"]

SCAN_TIMEOUT_S = 5.0
"""A calibration command waits this long for Redis (connect, TLS handshake included, and each
command): far above a round trip to a managed Redis in another region, well below "hung"."""
TIMEOUTS_S: Mapping[Purpose, float | None] = MappingProxyType(
    {
        "limits": LIMITS_TIMEOUT_S,
        "breakers": 0.25,
        "context": 0.25,
        "feedback": 0.25,
        "outbox": 1.0,
        "streams": 1.0,
        "review": 1.0,
        "scan": SCAN_TIMEOUT_S,
    }
)
"""Each purpose's command (and connect) timeout; None: none."""
RETRY_AFTER_S: Mapping[Purpose, float] = MappingProxyType({"limits": 1.0, "breakers": 5.0, "context": 5.0})
"""After a failure, the stores that fall back skip Redis this long, so a dead Redis costs one
timeout per interval, not one per request (the limits retry sooner: they are exact only in Redis)."""
_DECODED: frozenset[Purpose] = frozenset({"breakers", "outbox", "review"})
"""Purposes whose replies are read as ``str`` (the others read bytes)."""


Clock = Callable[[], float]


def node_url(url: str) -> tuple[str, bool]:
    """(the URL ``redis-py`` parses, whether it names a cluster)."""
    scheme, sep, rest = url.partition("://")
    plain = CLUSTER_SCHEMES.get(scheme.lower())
    return (f"{plain}{sep}{rest}", True) if plain is not None and sep else (url, False)


@dataclass(frozen=True, slots=True)
class RedisOptions:
    """How every client reaches Redis: built once from the settings."""

    url: str = field(repr=False)
    timeouts_s: Mapping[Purpose, float | None] = field(default_factory=lambda: TIMEOUTS_S)
    retry_after_s: Mapping[Purpose, float] = field(default_factory=lambda: RETRY_AFTER_S)
    connect_timeout_s: float | None = None
    """None: each purpose's command timeout (a Redis that cannot connect within it is down)."""
    ssl_ca_certs: str | None = None
    ssl_certfile: str | None = None
    ssl_keyfile: str | None = None
    username: str | None = None
    password: str | None = field(default=None, repr=False)
    cluster_nodes: KnownNodes = field(default_factory=KnownNodes, compare=False, repr=False)
    """A cluster's nodes as its clients found them, shared by every client made from these
    options (``proxy.state.redis_cluster_client``)."""

    def __post_init__(self) -> None:
        check_url(self.url)
        tls_files = (self.ssl_ca_certs, self.ssl_certfile, self.ssl_keyfile)
        if any(tls_files) and self.url.partition("://")[0].lower() not in TLS_SCHEMES:
            raise ValueError("Redis TLS files need a rediss:// (or rediss+cluster://) URL")
        for purpose, seconds in self.timeouts_s.items():
            if seconds is not None and seconds <= 0:
                raise ValueError(f"the Redis {purpose} timeout must be positive, not {seconds}")

    @property
    def cluster(self) -> bool:
        """The URL names a Redis Cluster (``redis+cluster://``, ``rediss+cluster://``)."""
        return node_url(self.url)[1]

    def with_timeout(self, purpose: Purpose, seconds: float | None) -> RedisOptions:
        """These options with ``purpose``'s timeout replaced."""
        return replace(self, timeouts_s=MappingProxyType({**self.timeouts_s, purpose: seconds}))

    def timeout_s(self, purpose: Purpose) -> float | None:
        return self.timeouts_s.get(purpose, TIMEOUTS_S[purpose])

    def health(self, purpose: Purpose, clock: Clock = time.monotonic) -> RedisHealth:
        """The down-until state of a store of ``purpose`` (its retry interval from these options)."""
        return RedisHealth(self.retry_after_s.get(purpose, RETRY_AFTER_S[purpose]), clock)


def redis_client(options: RedisOptions, purpose: Purpose) -> Any:
    """A client of ``purpose`` (``redis.asyncio.Redis``, or ``RedisCluster`` for a cluster URL;
    connects on its first command)."""
    timeout = options.timeout_s(purpose)
    connect = options.connect_timeout_s if options.connect_timeout_s is not None else timeout
    secured: dict[str, Any] = {
        name: value
        for name, value in (
            ("ssl_ca_certs", options.ssl_ca_certs),
            ("ssl_certfile", options.ssl_certfile),
            ("ssl_keyfile", options.ssl_keyfile),
            ("username", options.username),
            ("password", options.password),
        )
        if value is not None
    }
    url, cluster = node_url(options.url)
    if cluster:
        return ProxyCluster.from_url(
            url,
            socket_timeout=timeout,
            socket_connect_timeout=connect,
            decode_responses=purpose in _DECODED,
            tls_connection=SharedTlsConnection,
            known_nodes=options.cluster_nodes,
            **secured,
        )
    client = aioredis.Redis.from_url(
        url,
        socket_timeout=timeout,
        socket_connect_timeout=connect,
        decode_responses=purpose in _DECODED,
        **secured,
    )
    if client.connection_pool.connection_class is SSLConnection:  # rediss:// (the URL picks the class)
        client.connection_pool.connection_class = SharedTlsConnection
    return client


async def discover(options: RedisOptions) -> None:
    """With a cluster URL, find the cluster's nodes now (within the outbox's timeout), so every
    client made from ``options`` reaches the cluster later even if its seed node is gone by then
    (a client of redis-py alone would know only the seed). A cluster that does not answer is left
    to the stores, which fall back and retry."""
    if not options.cluster:
        return
    client = redis_client(options, "outbox")
    try:
        await asyncio.wait_for(client.initialize(), options.timeout_s("outbox"))
    except (RedisError, RedisClusterException, OSError, TimeoutError):
        pass  # the stores report Redis down themselves
    finally:
        await client.aclose()


class SharedTlsConnection(SSLConnection):
    """A TLS connection whose ``ssl.SSLContext`` is built once per CA, certificate and key files
    (and again when one of them changes: a rotated Secret), not once per connection: redis-py's
    own loads the system CA store each time, ~0.1 s of CPU on the event loop, more than the 0.25 s
    connect timeout leaves on a busy host. With a CA file only that CA is trusted."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        spec = self.ssl_context
        tuned = (
            spec.ca_data,
            spec.ca_path,
            spec.include_verify_flags,
            spec.exclude_verify_flags,
            spec.ciphers,
            spec.password,
        )
        if spec.cert_reqs == ssl.CERT_REQUIRED and not any(tuned) and spec.min_version is None:
            # only what RedisOptions sets: anything else (URL query options) stays redis-py's
            spec.context = _tls_context(spec.ca_certs, spec.certfile, spec.keyfile, spec.check_hostname)


_TLS_CONTEXTS: dict[tuple[Any, ...], ssl.SSLContext] = {}


def _tls_context(ca: str | None, cert: str | None, key: str | None, check_hostname: bool) -> ssl.SSLContext:
    files = tuple((path, Path(path).stat().st_mtime_ns) for path in (ca, cert, key) if path)
    found = _TLS_CONTEXTS.get((files, check_hostname))
    if found is None:
        found = ssl.create_default_context(cafile=ca)  # no cafile: the system's CAs
        found.check_hostname = check_hostname
        if cert:
            found.load_cert_chain(cert, key)
        _TLS_CONTEXTS[(files, check_hostname)] = found
    return found


class RedisHealth:
    """Redis is "down until": after a failure its store skips Redis for ``retry_after_s``."""

    def __init__(self, retry_after_s: float, clock: Clock = time.monotonic) -> None:
        self.retry_after_s = retry_after_s
        self._clock = clock
        self._down_until = 0.0

    @property
    def down(self) -> bool:
        return self._clock() < self._down_until

    def failed(self) -> bool:
        """Redis failed: skip it for ``retry_after_s``. True when it was not down (report this one)."""
        first = not self.down
        self._down_until = self._clock() + self.retry_after_s
        return first

    def answered(self) -> bool:
        """Redis answered. True when it had failed since its last answer (report the recovery)."""
        recovered = self._down_until != 0.0
        self._down_until = 0.0
        return recovered
