"""A bounded cache of fetched media (spec v2.5 §4.3.1: "SHOULD cache fetched media for retry").

Keyed by client and URL: a client gets back only bytes it fetched itself (and cannot learn that
another client fetched a URL). An entry lives ``ttl_s`` and the whole cache holds at most
``max_bytes``: past it the client holding the most bytes loses its own least recently used
entry, so no client's fetches push another's entries out (issue #26 attack pass). A hit is no
pass: the fetcher vets every URL of the entry's redirect chain again before using it, and the
app starts a new cache whenever the media policy changes. Within one call media are fetched once
anyway (before the ladder, so retries and escalations reuse them); the cache spares the fetch for
the client's own retry.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

Key = tuple[str, str]
"""(client id, URL as the client wrote it)."""
ENTRY_OVERHEAD_BYTES = 512
"""What an entry holds besides its media and URL characters: the objects and the indexes
(tracemalloc: ~400; pinned by ``tests/media/test_cache.py``). Counted in the bound, so many
tiny fetches cannot hold more than ``max_bytes``."""


@dataclass(frozen=True, slots=True)
class Fetched:
    url: str
    """The URL the bytes came from (after redirects)."""
    data: bytes | bytearray
    content_type: str | None
    etag: str | None = None
    chain: tuple[str, ...] = ()
    """Every URL asked on the way, the first and ``url`` included: each is vetted again on a hit."""


def entry_bytes(key: Key, fetched: Fetched) -> int:
    """What keeping ``fetched`` under ``key`` costs in memory, as the bound counts it."""
    urls = len(key[1]) + len(fetched.url) + sum(len(url) for url in fetched.chain)
    # __sizeof__: a bytearray read chunk by chunk holds its growth slack too; no copy to trim it,
    # the request that fetched it holds the same object.
    return fetched.data.__sizeof__() + urls + ENTRY_OVERHEAD_BYTES


class MediaCache:
    def __init__(self, max_bytes: int, ttl_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.max_bytes = max_bytes
        self.ttl_s = ttl_s
        self.size = 0
        self._clock = clock
        self._entries: OrderedDict[Key, tuple[float, Fetched, int]] = OrderedDict()
        """key -> (stored at, what was fetched, its ``entry_bytes``)."""
        self._owned: dict[str, OrderedDict[str, None]] = {}
        """client -> its URLs, least recently used first."""
        self._bytes: dict[str, int] = {}
        """client -> the bytes of its entries."""

    def get(self, key: Key) -> Fetched | None:
        entry = self._entries.get(key)
        if entry is None:
            return None
        stored, fetched, _ = entry
        if self._clock() - stored > self.ttl_s:
            self.drop(key)
            return None
        self._entries.move_to_end(key)
        self._owned[key[0]].move_to_end(key[1])
        return fetched

    def put(self, key: Key, fetched: Fetched) -> None:
        size = entry_bytes(key, fetched)
        if size > self.max_bytes:
            return
        self.drop(key)
        client = key[0]
        while self._entries and self.size + size > self.max_bytes:
            # The client holding the most bytes (the new entry counted) loses its own oldest, so
            # one client's fetches never push another's entries out. Clients are the keys file's.
            heaviest = max(self._bytes, key=lambda c: self._bytes[c] + (size if c == client else 0))
            self.drop((heaviest, next(iter(self._owned[heaviest]))))
        self._entries[key] = (self._clock(), fetched, size)
        self._owned.setdefault(client, OrderedDict())[key[1]] = None
        self._bytes[client] = self._bytes.get(client, 0) + size
        self.size += size

    def drop(self, key: Key) -> None:
        entry = self._entries.pop(key, None)
        if entry is not None:
            size = entry[2]
            self.size -= size
            client, url = key
            owned = self._owned[client]
            del owned[url]
            self._bytes[client] -= size
            if not owned:
                del self._owned[client], self._bytes[client]

    def __len__(self) -> int:
        return len(self._entries)


@dataclass(frozen=True, slots=True)
class ClientCache:
    """One client's view of the cache: what a request hands its fetches."""

    cache: MediaCache
    client: str

    def get(self, url: str) -> Fetched | None:
        return self.cache.get((self.client, url))

    def put(self, url: str, fetched: Fetched) -> None:
        self.cache.put((self.client, url), fetched)

    def drop(self, url: str) -> None:
        self.cache.drop((self.client, url))
