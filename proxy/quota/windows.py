"""Sliding-window counters and spend counters, in memory or shared through Redis.

Both back-ends use the ``limits`` library's sliding-window-counter strategy: in memory its
``MemoryStorage`` and strategy; in Redis its own Lua scripts and key layout, sent in one pipeline
so that every limit of a request (client, team, global; requests and tokens) and every budget
read costs one round trip. A request refused by one window still counts in the windows it
passed (each window is atomic on its own, as with ``limits``).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from math import floor, inf
from typing import Any, Protocol

import redis.asyncio as aioredis
from limits import RateLimitItemPerSecond
from limits.aio.storage.redis.bridge import RedisBridge
from limits.storage import MemoryStorage
from limits.strategies import SlidingWindowCounterRateLimiter

MICRO = 1_000_000
"""Spend is counted in micro-USD: integer counters, exact sums."""
KEY_PREFIX = "cogproxy:limits:"
SPEND_TTL_S = {"day": 2 * 86400, "month": 32 * 86400}
"""A spend counter outlives its calendar period by a little (clock skew), then expires."""
MAX_LOCAL_SPEND_KEYS = 10_000
"""In-memory spend counters kept at most (periods roll over; old ones are dropped first)."""


@dataclass(frozen=True, slots=True)
class Window:
    """One sliding window: ``limit`` units per ``window_s`` for ``key``."""

    key: str
    limit: int
    window_s: int


@dataclass(frozen=True, slots=True)
class WindowState:
    allowed: bool
    remaining: int
    reset_s: float
    """Seconds until at least one more unit frees up."""


def window_state(
    allowed: bool,
    limit: int,
    expiry: float,
    previous: int,
    previous_ttl: float,
    current: int,
    current_ttl: float,
) -> WindowState:
    """Remaining and reset of a sliding-window counter (``limits``' ``get_window_stats``)."""
    weighted = previous * previous_ttl / expiry + current
    remaining = max(0, limit - floor(weighted))
    if not (previous or current):
        return WindowState(allowed, remaining, 0.0)
    previous_reset, current_reset = inf, inf
    if previous:
        previous_reset = previous_ttl % (expiry / previous)
    if current:
        current_reset = current_ttl % expiry
    return WindowState(allowed, remaining, min(previous_reset, current_reset))


class Counters(Protocol):
    async def hit(
        self, hits: Sequence[tuple[Window, int]], spend_keys: Sequence[str]
    ) -> tuple[list[WindowState], list[int]]:
        """Take ``cost`` from each window (0: only read it); read the spend counters (micro-USD)."""
        ...

    async def settle(
        self, corrections: Sequence[tuple[Window, int]], spend: Sequence[tuple[str, int]]
    ) -> None:
        """Add (or give back) units outside any limit check; add micro-USD to spend counters."""
        ...

    async def aclose(self) -> None: ...


class MemoryCounters:
    """This process's windows (``limits`` in memory); ``share`` divides every limit (the local
    fallback of a replica whose Redis is down enforces its share)."""

    def __init__(self, share: int = 1) -> None:
        self.share = share
        self._storage = MemoryStorage()
        self._limiter = SlidingWindowCounterRateLimiter(self._storage)
        self._spend: dict[str, int] = {}

    def _item(self, window: Window) -> RateLimitItemPerSecond:
        return RateLimitItemPerSecond(max(1, window.limit // self.share), window.window_s)

    async def hit(
        self, hits: Sequence[tuple[Window, int]], spend_keys: Sequence[str]
    ) -> tuple[list[WindowState], list[int]]:
        states = []
        for window, cost in hits:
            item = self._item(window)
            allowed = self._limiter.hit(item, window.key, cost=cost) if cost else True
            stats = self._storage.get_sliding_window(item.key_for(window.key), item.get_expiry())
            state = window_state(allowed, item.amount, item.get_expiry(), *stats)
            states.append(state)
        return states, [self._spend.get(key, 0) for key in spend_keys]

    async def settle(
        self, corrections: Sequence[tuple[Window, int]], spend: Sequence[tuple[str, int]]
    ) -> None:
        for window, delta in corrections:
            item = self._item(window)
            expiry = item.get_expiry()
            _, current = self._storage.sliding_window_keys(item.key_for(window.key), expiry, time.time())
            if delta > 0:
                self._storage.incr(current, 2 * expiry, amount=delta)
            elif delta < 0:
                self._storage.decr(current, min(-delta, self._storage.get(current)))
        for key, micro in spend:
            if key not in self._spend and len(self._spend) >= MAX_LOCAL_SPEND_KEYS:
                self._spend.pop(next(iter(self._spend)))
            self._spend[key] = self._spend.get(key, 0) + micro

    async def aclose(self) -> None:
        self._storage.reset()


def _current(key: str) -> str:
    """``limits``' Redis key of a window's current counter (``{key}``; previous: ``{key}/-1``)."""
    return f"{{{KEY_PREFIX}{key}}}"


class RedisCounters:
    """Windows shared by every replica: ``limits``' Lua scripts, pipelined (one round trip)."""

    def __init__(self, client: aioredis.Redis) -> None:
        self._redis = client
        self._acquire = client.register_script(RedisBridge.SCRIPT_ACQUIRE_SLIDING_WINDOW)
        self._read = client.register_script(RedisBridge.SCRIPT_SLIDING_WINDOW)
        self._incr = client.register_script(RedisBridge.SCRIPT_INCR_EXPIRE)

    async def hit(
        self, hits: Sequence[tuple[Window, int]], spend_keys: Sequence[str]
    ) -> tuple[list[WindowState], list[int]]:
        async with self._redis.pipeline(transaction=False) as pipe:
            for window, cost in hits:
                keys = [_current(window.key) + "/-1", _current(window.key)]
                if cost:
                    await self._acquire(keys, [window.limit, window.window_s, cost], client=pipe)
                await self._read(keys, [window.window_s], client=pipe)
            for key in spend_keys:
                pipe.get(KEY_PREFIX + key)
            replies: list[Any] = await pipe.execute()
        states, at = [], 0
        for window, cost in hits:
            allowed = True
            if cost:
                allowed, at = bool(replies[at]), at + 1
            previous, previous_ttl, current, current_ttl = replies[at]
            at += 1
            states.append(
                window_state(
                    allowed,
                    window.limit,
                    window.window_s,
                    int(previous or 0),
                    max(0, int(previous_ttl or 0)) / 1000,
                    int(current or 0),
                    max(0, int(current_ttl or 0)) / 1000,
                )
            )
        return states, [int(value or 0) for value in replies[at:]]

    async def settle(
        self, corrections: Sequence[tuple[Window, int]], spend: Sequence[tuple[str, int]]
    ) -> None:
        if not corrections and not spend:
            return
        async with self._redis.pipeline(transaction=False) as pipe:
            for window, delta in corrections:
                if delta:
                    await self._incr([_current(window.key)], [2 * window.window_s, delta], client=pipe)
            for key, micro in spend:
                period = key.rsplit(":", 2)[-2]
                await self._incr([KEY_PREFIX + key], [SPEND_TTL_S[period], micro], client=pipe)
            await pipe.execute()

    async def aclose(self) -> None:
        await self._redis.aclose()
