"""Server settings: one frozen value built from flags and environment variables by the CLI."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from proxy.clients import ClientIdentity, read_identities
from proxy.context.sanitise import DEFAULT_SENSITIVE_NAMES
from proxy.state.redis_defaults import DURABLE_REPLICAS, LIMITS_TIMEOUT_S
from proxy.state.redis_flags import RedisAccess, options_of

if TYPE_CHECKING:  # built by options_of: the command line reads these defaults without the Redis client
    from proxy.state.redis_client import RedisOptions

DEFAULT_MAX_BODY_BYTES = 10 * 1024 * 1024
DEFAULT_MAX_UPLOAD_BYTES = 512 * 1024 * 1024
DEFAULT_POOL_SIZE = 100
DEFAULT_IDLE_TIMEOUT_S = 75.0
DEFAULT_DRAIN_TIMEOUT_S = 25.0
DEFAULT_RELOAD_INTERVAL_S = 2.0
DEFAULT_CLIENT_READ_TIMEOUT_S = 10.0
"""A request head within this, and no body stall longer (HTTP servers use 10-60 s; 10 s is
ample for a loopback or in-cluster client and frees a slow client's descriptor quickly)."""
MiB = 1024 * 1024
DEFAULT_MAX_INFLIGHT_BODY_BYTES = 96 * MiB
"""Ten bodies of the largest size read at once, parsed. With the other bounds it adds up to
what the shipped container limit holds (``proxy.memory_budget``, deploy/k8s: 320Mi)."""
DEFAULT_STREAM_SESSION_TTL_S = 300.0
"""How long a streamed answer's session can be resumed after its last chunk (spec v2.5 §3.2.6)."""
DEFAULT_STREAM_HEARTBEAT_S = 15.0
"""Silence before an empty heartbeat chunk (spec v2.5 §3.2.3)."""
DEFAULT_STREAM_SESSION_MAX_BYTES = 32 * MiB
"""Chunks kept for recovery in this process at most, their bookkeeping counted: about two
thousand finished answers of 50 chunks (was 64 MiB, counting chunk text only; issue #29.5)."""
MAX_WORKERS = 64
"""``--workers`` at most: beyond a few per core the processes only compete for the CPU."""
WORKER_FLAG = "--worker-slot"
"""The hidden ``serve`` flag the supervisor starts each worker with: its slot (``Settings.worker``)."""


@dataclass(frozen=True, slots=True)
class Settings:
    policy_path: Path
    module_dirs: tuple[Path, ...]
    host: str = "127.0.0.1"
    port: int = 8080
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    """Bodies the proxy reads itself (chat, modules, resendable passthrough requests)."""
    max_upload_bytes: int = DEFAULT_MAX_UPLOAD_BYTES
    """Bodies streamed through to a provider (file and audio uploads); never held in memory."""
    max_inflight_body_bytes: int = DEFAULT_MAX_INFLIGHT_BODY_BYTES
    """Memory all request bodies in flight may take at once, buffered and parsed (see
    ``proxy.api.budget``); beyond it a request waits briefly, then gets 503."""
    pool_size: int = DEFAULT_POOL_SIZE
    idle_timeout_s: float = DEFAULT_IDLE_TIMEOUT_S
    client_read_timeout_s: float = DEFAULT_CLIENT_READ_TIMEOUT_S
    """Deadline for a request head, and for each stall while a body arrives (see proxy.server)."""
    max_connections: int = 0
    """Open client connections at most; 0: what the open-file limit leaves (proxy.server)."""
    drain_timeout_s: float = DEFAULT_DRAIN_TIMEOUT_S
    log_flush_interval_s: float = 0.0
    """How long JSON log lines may wait in memory (``proxy.observability.logbuffer``); 0: none."""
    api_keys: frozenset[str] = field(default_factory=frozenset, repr=False)
    client_identities: Mapping[str, ClientIdentity] = field(default_factory=dict, repr=False)
    """Name and team of each client key (the keys file's labels); metrics and limits use these."""
    admin_keys: frozenset[str] = field(default_factory=frozenset, repr=False)
    """Admin keys: ``GET /v1/usage`` and judging any answer (``POST /v1/feedback``); a client key
    is never an admin key."""
    replicas_hint: int = 1
    """Replicas sharing the limits; with Redis down each enforces its share (limit / replicas)."""
    redis_url: str | None = field(default=None, repr=False)
    """Shared state (breakers) and the redis-stream review sink; None: in-process state."""
    redis_limits_timeout_s: float = LIMITS_TIMEOUT_S
    """How long a limit check waits for Redis before this replica falls back to its local windows."""
    redis_ca_file: Path | None = None
    """CA certificates the Redis server's certificate must chain to (rediss://); None: the system's."""
    redis_cert_file: Path | None = None
    """Client certificate (and ``redis_key_file``, its key) for a Redis that checks clients' certificates."""
    redis_key_file: Path | None = None
    redis_username: str | None = None
    """The Redis ACL user; None: ``default`` (or the URL's)."""
    redis_password: str | None = field(default=None, repr=False)
    """The ACL user's password, read from a file or the environment by the CLI (never a flag)."""
    redis_durable_replicas: int = DURABLE_REPLICAS
    """Replicas that must have a record before the outbox lets it go (``WAIT``); 0: the master's answer."""
    admin_host: str | None = None
    """Bind address of the admin listener (None: the API's ``host``)."""
    admin_port: int | None = None
    """Serve /healthz, /readyz and /metrics (only those) on this port too (None: no admin
    listener). Lets the API stay on loopback while probes and Prometheus reach the pod IP."""
    spool_dir: Path | None = None
    """Where the Redis outbox appends records not yet delivered, so a restart loses none."""
    allowed_hosts: frozenset[str] = frozenset()
    """Host names (lower case, no port) served besides loopback names when the browser guard
    applies (loopback bind, no client keys)."""
    allowed_origins: frozenset[str] = frozenset()
    """``Origin`` values (lower case) a browser page may send when the browser guard applies."""
    context_redact_names: tuple[str, ...] = DEFAULT_SENSITIVE_NAMES
    """Field-name words whose ``_context`` values are replaced before a model sees them (values
    that look like credentials are masked whatever their name)."""
    reload_interval_s: float = DEFAULT_RELOAD_INTERVAL_S
    """How often policy and module files are checked for changes; 0 disables polling (SIGHUP
    still reloads)."""
    stream_session_ttl_s: float = DEFAULT_STREAM_SESSION_TTL_S
    stream_recovery: bool = True
    """False (``--no-stream-recovery``): a retry with a session id gets E4012, and a client that
    leaves a stream cancels its upstream call."""
    stream_heartbeat_s: float = DEFAULT_STREAM_HEARTBEAT_S
    stream_session_max_bytes: int = DEFAULT_STREAM_SESSION_MAX_BYTES
    otlp_endpoint: str | None = None
    """Send traces to this OTLP/HTTP collector (base URL); None: the standard
    ``OTEL_EXPORTER_OTLP_(TRACES_)ENDPOINT`` decides (unset: no tracing)."""
    otel_content: bool = False
    """Record message content in spans (redacted, capped); off: none."""
    workers: int = 1
    """Processes serving the port (``proxy.supervisor``); 1: this process serves alone."""
    worker: int | None = None
    """This process's slot (0..workers-1) when it is one of those workers; None otherwise."""
    redis: RedisOptions | None = field(init=False, default=None, repr=False)
    """How every Redis client reaches ``redis_url`` (``proxy.state.redis_client``); None without it."""

    def __post_init__(self) -> None:
        if self.redis_url:
            access = RedisAccess(
                redis_ca_file=self.redis_ca_file,
                redis_cert_file=self.redis_cert_file,
                redis_key_file=self.redis_key_file,
                redis_username=self.redis_username,
                redis_password=self.redis_password,
            )
            redis = options_of(self.redis_url, access).with_timeout("limits", self.redis_limits_timeout_s)
            object.__setattr__(self, "redis", redis)
        if self.max_upload_bytes <= 0:
            raise ValueError(f"max_upload_bytes must be positive, not {self.max_upload_bytes}")
        if self.max_body_bytes <= 0:
            raise ValueError(f"max_body_bytes must be positive, not {self.max_body_bytes}")
        if self.max_inflight_body_bytes <= 0:
            raise ValueError(f"max_inflight_body_bytes must be positive, not {self.max_inflight_body_bytes}")
        if self.pool_size <= 0:
            raise ValueError(f"pool_size must be positive, not {self.pool_size}")
        if self.client_read_timeout_s <= 0:
            raise ValueError(f"client_read_timeout_s must be positive, not {self.client_read_timeout_s}")
        if self.replicas_hint < 1:
            raise ValueError(f"replicas_hint must be >= 1, not {self.replicas_hint}")
        if self.max_connections < 0:
            raise ValueError(f"max_connections must be >= 0, not {self.max_connections}")
        if self.redis_durable_replicas < 0:
            raise ValueError(f"redis_durable_replicas must be >= 0, not {self.redis_durable_replicas}")
        if self.reload_interval_s < 0:
            raise ValueError(f"reload_interval_s must be >= 0, not {self.reload_interval_s}")
        if self.stream_session_ttl_s <= 0 or self.stream_heartbeat_s <= 0:
            raise ValueError("stream_session_ttl_s and stream_heartbeat_s must be positive")
        if self.stream_session_max_bytes <= 0:
            raise ValueError(
                f"stream_session_max_bytes must be positive, not {self.stream_session_max_bytes}"
            )
        if not 1 <= self.workers <= MAX_WORKERS:
            raise ValueError(f"workers must be 1-{MAX_WORKERS}, not {self.workers}")
        if self.worker is not None and not 0 <= self.worker < self.workers:
            raise ValueError(f"worker slot {self.worker} is not one of 0-{self.workers - 1}")
        if self.workers > 1 and self.port == 0:
            raise ValueError("workers > 1 need a fixed port: port 0 would give each worker its own")
        if not 0 <= self.port <= 65535:
            raise ValueError(f"port must be 0-65535, not {self.port}")
        if self.admin_port is not None and not 0 < self.admin_port <= 65535:
            raise ValueError(f"admin_port must be 1-65535, not {self.admin_port}")
        if self.admin_port is not None and self.admin_port == self.port:
            raise ValueError(
                f"admin_port must differ from port ({self.port}): the API must not be served there"
            )

    @property
    def serves_console(self) -> bool:
        """The review console is served on the admin listener: it has one and an admin key opens it."""
        return self.admin_port is not None and bool(self.admin_keys)

    @property
    def admin_bind_host(self) -> str:
        return self.admin_host or self.host

    @property
    def shares_port(self) -> bool:
        """Bound with SO_REUSEPORT: one of several worker processes accepting on the port."""
        return self.workers > 1


def read_key_file(path: Path) -> frozenset[str]:
    """Client API keys, one per line (``KEY [name=NAME] [team=TEAM]``, see ``proxy.clients``);
    blank lines and ``#`` comments are ignored."""
    return frozenset(read_identities(path))


def host_names(text: str | None) -> frozenset[str]:
    """``--allowed-hosts``: comma-separated names, any port (a port given is ignored)."""
    names = (part.strip().lower() for part in (text or "").split(","))
    return frozenset(name if name.startswith("[") else name.partition(":")[0] for name in names if name)


def origins(text: str | None) -> frozenset[str]:
    """``--allowed-origins``: comma-separated ``scheme://host[:port]`` values."""
    return frozenset(part.strip().lower().rstrip("/") for part in (text or "").split(",") if part.strip())
