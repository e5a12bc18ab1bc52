"""A bounded cache of fetched media (spec v2.5 §4.3.1: "SHOULD cache fetched media for retry").

Keyed by URL; an entry lives ``ttl_s`` and the whole cache holds at most ``max_bytes`` (least
recently used evicted first). Within one call media are fetched once anyway (before the ladder,
so retries and escalations reuse them); the cache spares the fetch for the client's own retry.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Fetched:
    url: str
    """The URL the bytes came from (after redirects)."""
    data: bytes | bytearray
    content_type: str | None
    etag: str | None = None


class MediaCache:
    def __init__(self, max_bytes: int, ttl_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.max_bytes = max_bytes
        self.ttl_s = ttl_s
        self.size = 0
        self._clock = clock
        self._entries: OrderedDict[str, tuple[float, Fetched]] = OrderedDict()

    def get(self, url: str) -> Fetched | None:
        entry = self._entries.get(url)
        if entry is None:
            return None
        stored, fetched = entry
        if self._clock() - stored > self.ttl_s:
            self._drop(url)
            return None
        self._entries.move_to_end(url)
        return fetched

    def put(self, url: str, fetched: Fetched) -> None:
        size = len(fetched.data)
        if size > self.max_bytes:
            return
        self._drop(url)
        while self._entries and self.size + size > self.max_bytes:
            self._drop(next(iter(self._entries)))
        self._entries[url] = (self._clock(), fetched)
        self.size += size

    def _drop(self, url: str) -> None:
        entry = self._entries.pop(url, None)
        if entry is not None:
            self.size -= len(entry[1].data)

    def __len__(self) -> int:
        return len(self._entries)
