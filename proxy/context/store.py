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

from proxy.context.identity import namespace_in
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


class ContextStore(Protocol):
    async def get(self, key: str) -> bytes | None: ...

    async def get_many(self, keys: Sequence[str]) -> dict[str, bytes | None]:
        """Every key's value (None: absent) in one read (one round trip to Redis)."""
        ...

    def pending(self, keys: Iterable[str]) -> dict[str, bytes]:
        """This replica's writes of ``keys`` the store has not acknowledged yet: what a read sent
        now must answer in place of the store's (read-your-writes on this replica)."""
        ...

    async def put(
        self, key: str, value: bytes, ttl: int, *, wait: bool = True, quota: ClientQuota | None = None
    ) -> None:
        """Store ``value``; ``wait``: the session's next call must read it (read-your-writes:
        this replica reads it at once, and the call waits for the store to acknowledge it, up to
        the store's timeout), else it goes in the background and a read may miss it; ``quota``:
        the key's client's (its namespace)."""
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

    async def put(
        self, key: str, value: bytes, ttl: int, *, wait: bool = True, quota: ClientQuota | None = None
    ) -> None:
        await self.store.put(key, value, ttl, wait=wait, quota=quota or self.quota)

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

    def client_usage(self, namespace: str) -> tuple[int, int]:
        """(entries, bytes) the client ``namespace`` holds."""
        return len(self._clients.get(namespace, ())), self._client_bytes.get(namespace, 0)

    async def put(
        self, key: str, value: bytes, ttl: int, *, wait: bool = True, quota: ClientQuota | None = None
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
