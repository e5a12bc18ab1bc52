"""Where context lives: a bounded in-process LRU by default, Redis with ``--redis-url``
(``proxy.state.context_store``); the ``ContextStore`` protocol both keep.

Values are JSON bytes. ``ttl``: seconds, or ``TTL_PERSISTENT`` (-1) for no expiry; 0 is never
stored (request-scoped). ``get`` raises ``ContextUnavailable`` when the store cannot answer
(Redis down): the caller treats the context as not available, never as absent-and-fine.

Per-client quotas (``ClientQuota``, from the policy's ``cache.client_max_entries`` /
``client_max_bytes``): a write that takes its client (the key's namespace) past its quota evicts
that client's own least recently used entries, never another client's; persistent items count.
The memory store's whole bound, when reached, evicts from the client holding the most bytes.
Evictions are counted (``on_evict``, the ``cognitive_context_evictions_total`` metric).
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Protocol

import structlog

from proxy.context.identity import Identity, namespace_in
from proxy.module.context_spec import TTL_PERSISTENT
from proxy.retained import retained

log = structlog.get_logger("proxy.context")

Clock = Callable[[], float]

MEMORY_MAX_BYTES = 16 * 1024 * 1024
"""The in-process store's whole size: 64 full-size contexts, thousands of typical session
states; a sidecar that needs more shares a Redis. Least recently used entries go first."""
MEMORY_MAX_ENTRIES = 20_000
"""Bounds the per-entry bookkeeping too, when values are tiny (20,000 x
``MEMORY_ENTRY_OVERHEAD_BYTES``: 12.2 MiB; 50,000 cost 30 MiB besides the values)."""
MEMORY_ENTRY_OVERHEAD_BYTES = 640
"""What an entry takes besides its value's bytes: its key (~130 characters), the LRU and
per-client indexes, the (value, expiry) tuple (measured with tracemalloc: ~500; pinned by
``tests/context/test_store_memory.py``). ``proxy.memory_budget`` counts it per entry."""


CLIENT_QUOTA = "client_quota"
STORE_FULL = "store_full"
EvictionReason = str
"""``CLIENT_QUOTA`` (a client past its own quota) or ``STORE_FULL`` (the memory store's bound)."""


@dataclass(frozen=True, slots=True)
class ClientQuota:
    """What one client may keep in the context store (context items and cached answers)."""

    max_entries: int
    max_bytes: int


class ContextUnavailable(Exception):
    """The store cannot answer now (Redis down)."""


MARK_TTL_S = 60
"""How long a session call's pending-write mark lives (docs/context.md, "Read-your-writes"): a
call that answers later than ``MARK_TTL_S - MARK_MARGIN_S`` after its read waits for its writes'
acknowledgement instead; a replica that died mid-call leaves its mark this long at most."""
MARK_MARGIN_S = 5
"""Clock skew between replicas a mark's deadline allows for."""


@dataclass(frozen=True, slots=True)
class Mark:
    """A session call's mark in its session's set of calls whose writes may be in flight (a sorted
    set: member ``member``, score the deadline in epoch ms). Added in the round trip that reads
    the call's keys, before the model is asked; removed through the outbox after the call's
    writes, in order with them. A reader that sees another replica's mark re-reads until it is
    gone, at most the context timeout."""

    key: str
    member: str
    deadline_ms: int
    started: float
    """On the store's monotonic clock: when the mark was asked for."""
    scope: str = ""
    """The prefix of the session's own keys: the writes the mark covers (another key, a user's,
    is read by other sessions, which do not look at this mark: its writes wait as before)."""

    def covers_key(self, key: str) -> bool:
        return bool(self.scope) and key.startswith(self.scope)


def marks_of(read: dict[str, bytes | None], mark: Mark) -> frozenset[str]:
    """The members alive in ``mark``'s set when ``read`` was read (the store answers them under
    the set's key, newline-separated), taken out of ``read``."""
    raw = read.pop(mark.key, None) or b""
    return frozenset(part.decode() for part in raw.split(b"\n") if part)


class SessionMarks(Protocol):
    """The marks of a store shared by replicas (Redis); a store of one process has none."""

    def mark(self, identity: Identity) -> Mark | None:
        """A new mark for a call of ``identity``'s session (None without a session)."""
        ...

    async def read_marked(self, keys: Sequence[str], mark: Mark) -> dict[str, bytes | None]:
        """``keys`` and the marks alive (under ``mark.key``), then ``mark`` added: one round trip."""
        ...

    async def wait_for_writes(
        self, keys: Sequence[str], mark: Mark, alive: frozenset[str]
    ) -> dict[str, bytes | None] | None:
        """Re-read ``keys`` while a mark of ``alive`` not of this replica remains, at most the
        context timeout; the last values read, or None when there was nothing to wait for."""
        ...

    def covers(self, mark: Mark) -> bool:
        """Whether ``mark`` still stands for a write queued now (its deadline not near)."""
        ...

    def release(self, mark: Mark) -> None:
        """Remove ``mark`` after every write queued so far (through the outbox, in order)."""
        ...


class ContextStore(Protocol):
    async def get(self, key: str) -> bytes | None: ...

    async def get_many(self, keys: Sequence[str]) -> dict[str, bytes | None]:
        """Every key's value (None: absent) in one read (one round trip to Redis)."""
        ...

    def pending(self, keys: Iterable[str]) -> dict[str, bytes]:
        """This replica's writes of ``keys`` the store has not acknowledged yet: what a read sent
        now must answer in place of the store's (read-your-writes on this replica)."""
        ...

    def marks(self) -> SessionMarks | None:
        """The store's pending-write marks (a store shared by replicas), or None."""
        ...

    async def put(
        self,
        key: str,
        value: bytes,
        ttl: int,
        *,
        wait: bool = True,
        quota: ClientQuota | None = None,
        ack: bool = True,
    ) -> None:
        """Store ``value``; ``wait``: the session's next call must read it (read-your-writes:
        this replica reads it at once, and, with ``ack``, the call waits for the store to
        acknowledge it, up to the store's timeout; without, a mark tells other replicas), else it
        goes in the background and a read may miss it; ``quota``: the key's client's (its
        namespace)."""
        ...

    async def aclose(self) -> None: ...


@dataclass(frozen=True, slots=True)
class QuotaStore:
    """``store`` with the current policy's per-client quota on every write (one per request)."""

    store: ContextStore
    quota: ClientQuota

    async def get(self, key: str) -> bytes | None:
        return await self.store.get(key)

    async def get_many(self, keys: Sequence[str]) -> dict[str, bytes | None]:
        return await self.store.get_many(keys)

    def pending(self, keys: Iterable[str]) -> dict[str, bytes]:
        return self.store.pending(keys)

    def marks(self) -> SessionMarks | None:
        return self.store.marks()

    async def put(
        self,
        key: str,
        value: bytes,
        ttl: int,
        *,
        wait: bool = True,
        quota: ClientQuota | None = None,
        ack: bool = True,
    ) -> None:
        await self.store.put(key, value, ttl, wait=wait, quota=quota or self.quota, ack=ack)

    async def aclose(self) -> None:
        return None  # the app owns the store


class MemoryContextStore:
    """Bounded LRU with TTL; ``clock`` is injected so expiry is tested without sleeping."""

    def __init__(
        self,
        *,
        max_bytes: int = MEMORY_MAX_BYTES,
        max_entries: int = MEMORY_MAX_ENTRIES,
        clock: Clock = time.monotonic,
        on_evict: Callable[[EvictionReason], None] = lambda reason: None,
    ) -> None:
        self._items: OrderedDict[str, tuple[bytes, float]] = OrderedDict()
        self._bytes = 0
        self._max_bytes = max_bytes
        self._max_entries = max_entries
        self._clock = clock
        self._on_evict = on_evict
        self._clients: dict[str, OrderedDict[str, int]] = {}
        """namespace -> its keys (least recently used first) and their sizes."""
        self._client_bytes: dict[str, int] = {}

    def __len__(self) -> int:
        return len(self._items)

    @property
    def size_bytes(self) -> int:
        return self._bytes

    async def get(self, key: str) -> bytes | None:
        item = self._items.get(key)
        if item is None:
            return None
        value, expires = item
        if expires and self._clock() >= expires:
            self._drop(key)
            return None
        self._items.move_to_end(key)
        self._clients[namespace_in(key)].move_to_end(key)
        return value

    async def get_many(self, keys: Sequence[str]) -> dict[str, bytes | None]:
        return {key: await self.get(key) for key in keys}

    def pending(self, keys: Iterable[str]) -> dict[str, bytes]:
        return {}  # a write is here when ``put`` returns

    def marks(self) -> SessionMarks | None:
        return None  # one process: every read sees every write

    def client_usage(self, namespace: str) -> tuple[int, int]:
        """(entries, bytes) the client ``namespace`` holds."""
        return len(self._clients.get(namespace, ())), self._client_bytes.get(namespace, 0)

    async def put(
        self,
        key: str,
        value: bytes,
        ttl: int,
        *,
        wait: bool = True,
        quota: ClientQuota | None = None,
        ack: bool = True,
    ) -> None:
        if ttl == 0:
            return
        if key in self._items:
            self._drop(key)
        value = retained(value)  # never orjson's 4 KiB working buffer (proxy.retained)
        size = len(value)
        if size > self._max_bytes or (quota is not None and size > quota.max_bytes):
            return
        expires = 0.0 if ttl == TTL_PERSISTENT else self._clock() + ttl
        self._items[key] = (value, expires)
        self._bytes += size
        client = namespace_in(key)
        self._clients.setdefault(client, OrderedDict())[key] = size
        self._client_bytes[client] = self._client_bytes.get(client, 0) + size
        if quota is not None:
            own = self._clients[client]
            while len(own) > quota.max_entries or self._client_bytes[client] > quota.max_bytes:
                self._evict(next(iter(own)), CLIENT_QUOTA)
        while self._bytes > self._max_bytes or len(self._items) > self._max_entries:
            heaviest = max(self._client_bytes, key=self._client_bytes.__getitem__)
            self._evict(next(iter(self._clients[heaviest])), STORE_FULL)

    def _evict(self, key: str, reason: EvictionReason) -> None:
        self._drop(key)
        self._on_evict(reason)

    def _drop(self, key: str) -> None:
        value, _ = self._items.pop(key)
        self._bytes -= len(value)
        client = namespace_in(key)
        own = self._clients[client]
        del own[key]
        self._client_bytes[client] -= len(value)
        if not own:
            del self._clients[client], self._client_bytes[client]

    async def aclose(self) -> None:
        return None
