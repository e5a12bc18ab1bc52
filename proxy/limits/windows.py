"""Sliding-window counters and spend counters, in this process or shared through Redis.

The algorithm is the sliding-window counter of the ``limits`` library (and of Cloudflare and
Envoy's local limiters): a counter per fixed window, the previous window's count weighted by the
share of it still inside the sliding window. Memory is two integers per window, whatever the
limit (a moving-window log of every token would hold a list entry per token).

Neither back-end is ``limits`` itself, measured in one run of ``tests/perf/bench.py --limits``
for one request's six windows and six budgets: its ``MemoryStorage`` took 73 us (goal 20 us), its
Lua scripts pipelined 455-730 us on loopback (goal 150 us: redis-py spends ~30 us per pipelined
command). Here a request is one EVALSHA in Redis (every window checked, then all taken or none)
and a few dictionary operations in memory.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import redis.asyncio as aioredis
from redis.exceptions import NoScriptError

from proxy.context.store import Mark
from proxy.state.pipelined import Pipelined, ScriptCall, script_and_reads

MICRO = 1_000_000
"""Spend is counted in micro-USD: integer counters, exact sums."""
KEY_PREFIX = "{cogproxy:limits}:"
"""Every limits key shares this hash tag: one request's windows and budgets (client, team and
global) are read and taken by one all-or-none script, in a Redis Cluster too (a script's keys must
share a slot). The cost: all limits keys live on one slot, so one master serves every limit check
(one short script per request; see docs/deployment.md, "Redis Cluster")."""
SPEND_TTL_S = {"day": 2 * 86400, "month": 32 * 86400}
"""A spend counter outlives its calendar period by a little (clock skew), then expires."""
MAX_LOCAL_SPEND_KEYS = 10_000
"""In-memory spend counters kept at most (the oldest go first; periods roll over daily)."""
MAX_LOCAL_WINDOWS = 100_000
"""In-memory windows kept at most: scopes come from the keys file and the policy (bounded), so
this is a backstop, not a working limit."""


@dataclass(frozen=True, slots=True)
class Window:
    """One sliding window: ``limit`` units per ``window_s`` for ``key``."""

    key: str
    limit: int
    window_s: int


@dataclass(frozen=True, slots=True)
class WindowState:
    allowed: bool
    """The request fitted in this window (all windows are taken together or not at all)."""
    remaining: int
    reset_s: float
    """Seconds until at least one more unit frees up (``Retry-After`` of a refused request)."""
    full_s: float = 0.0
    """Seconds until the window is back to its initial state, every unit free (OpenAI's
    ``x-ratelimit-reset-*``)."""


def full_after(expiry: float, previous: int, current: int, into: float) -> float:
    """Seconds until less than one unit weighs: the previous window fades out over ``into``; the
    current one, once it is the previous, fades out over the next ``expiry``."""
    if previous * into / expiry + current < 1:
        return 0.0
    if current == 0:
        return into - expiry / previous
    return into + expiry - expiry / current


def window_state(
    allowed: bool, limit: int, expiry: float, previous: int, current: int, into: float
) -> WindowState:
    """Remaining and reset of a sliding-window counter: ``previous`` weighs ``into / expiry``
    (``into``: seconds left in the current fixed window); reset is when one more unit fits."""
    weighted = previous * into / expiry + current
    remaining = limit - math.floor(weighted)
    full = full_after(expiry, previous, current, into)
    if weighted < limit:
        return WindowState(allowed, remaining, 0.0, full)
    if current < limit and previous:  # the previous window's weight fades out first
        reset = into - (limit - current) * expiry / previous
        return WindowState(allowed, max(0, remaining), reset, full)
    # then the current window, once it is the previous one, fades out likewise
    return WindowState(allowed, max(0, remaining), into + expiry * (1 - limit / current), full)


Read = dict[str, bytes | None] | BaseException | None
"""The values of the keys read with a limits check (a key absent: ``None``), the error that kept
them from being read, or ``None``: not read (the windows are not in Redis)."""


class Counters(Protocol):
    async def hit(
        self, hits: Sequence[tuple[Window, int]], spend_keys: Sequence[str]
    ) -> tuple[list[WindowState], list[int]]:
        """Take each ``cost`` (0: only read) if every window has room, else none; read the spend
        counters (micro-USD)."""
        ...

    async def hit_and_read(
        self,
        hits: Sequence[tuple[Window, int]],
        spend_keys: Sequence[str],
        reads: Sequence[str],
        mark: Mark | None = None,
    ) -> tuple[list[WindowState], list[int], Read]:
        """``hit``, and the values of ``reads`` (with ``mark``: its session's marks read, and it
        added, ``proxy.state.pipelined.queue_marked_read``) in the same round trip (``Read``)."""
        ...

    async def settle(
        self, corrections: Sequence[tuple[Window, int]], spend: Sequence[tuple[str, int]]
    ) -> None:
        """Add (or give back) units outside any limit check; add micro-USD to spend counters."""
        ...

    async def aclose(self) -> None: ...


class _Counter:
    __slots__ = ("current", "index", "previous")

    def __init__(self, index: int) -> None:
        self.index = index
        self.current = 0
        self.previous = 0

    def roll(self, index: int) -> None:
        if index != self.index:
            self.previous = self.current if index == self.index + 1 else 0
            self.current = 0
            self.index = index


class MemoryCounters:
    """This process's windows (one event loop: no locks); ``share`` divides every limit (the
    local fallback of a replica whose Redis is down enforces its share)."""

    def __init__(self, share: int = 1, clock: Callable[[], float] = time.time) -> None:
        self.share = share
        self.clock = clock
        self._windows: dict[str, _Counter] = {}
        self._spend: dict[str, int] = {}

    def _counter(self, window: Window, now: float) -> _Counter:
        index = int(now // window.window_s)
        counter = self._windows.get(window.key)
        if counter is None:
            if len(self._windows) >= MAX_LOCAL_WINDOWS:
                self._windows.pop(next(iter(self._windows)))
            counter = self._windows[window.key] = _Counter(index)
        counter.roll(index)
        return counter

    async def hit(
        self, hits: Sequence[tuple[Window, int]], spend_keys: Sequence[str]
    ) -> tuple[list[WindowState], list[int]]:
        now = self.clock()
        looked = []
        take = True
        for window, cost in hits:
            counter = self._counter(window, now)
            limit = window.limit // self.share or 1
            into = window.window_s - now % window.window_s  # seconds left in the current window
            fits = math.floor(counter.previous * into / window.window_s + counter.current) + cost <= limit
            take = take and fits
            looked.append((window.window_s, cost, counter, limit, into, fits))
        states = []
        for expiry, cost, counter, limit, into, fits in looked:
            if take:
                counter.current += cost
            states.append(window_state(fits, limit, expiry, counter.previous, counter.current, into))
        return states, [self._spend.get(key, 0) for key in spend_keys]

    async def hit_and_read(
        self,
        hits: Sequence[tuple[Window, int]],
        spend_keys: Sequence[str],
        reads: Sequence[str],
        mark: Mark | None = None,
    ) -> tuple[list[WindowState], list[int], Read]:
        states, spent = await self.hit(hits, spend_keys)
        return states, spent, None  # nothing of Redis is read here

    async def settle(
        self, corrections: Sequence[tuple[Window, int]], spend: Sequence[tuple[str, int]]
    ) -> None:
        now = self.clock()
        for window, delta in corrections:
            counter = self._counter(window, now)
            counter.current = max(0, counter.current + delta)
        for key, micro in spend:
            if key not in self._spend and len(self._spend) >= MAX_LOCAL_SPEND_KEYS:
                self._spend.pop(next(iter(self._spend)))
            self._spend[key] = self._spend.get(key, 0) + micro

    async def aclose(self) -> None:
        self._windows.clear()


# The sliding-window counter of ``limits``' acquire_sliding_window.lua, for every window of a
# request at once: KEYS = previous/current key pairs, then spend keys; ARGV = window count, then
# (limit, window seconds, cost) per window. A current counter lives two windows; once less than
# one window of its life is left it becomes the previous counter. Returns
# [taken, (fits, previous, previous_ttl_ms, current, current_ttl_ms) per window, spend...].
_HIT = """
local n = tonumber(ARGV[1])
local out = {1}
local costs = {}
for i = 1, n do
  local prev_key, cur_key = KEYS[2 * i - 1], KEYS[2 * i]
  local limit, expiry = tonumber(ARGV[3 * i - 1]), tonumber(ARGV[3 * i]) * 1000
  local cost = tonumber(ARGV[3 * i + 1])
  local cur_ttl = tonumber(redis.call('pttl', cur_key))
  if cur_ttl > 0 and cur_ttl < expiry then
    redis.call('rename', cur_key, prev_key)
    redis.call('set', cur_key, 0, 'PX', cur_ttl + expiry)
  end
  local prev = tonumber(redis.call('get', prev_key)) or 0
  local prev_ttl = math.max(0, tonumber(redis.call('pttl', prev_key)))
  local cur = tonumber(redis.call('get', cur_key)) or 0
  cur_ttl = math.max(0, tonumber(redis.call('pttl', cur_key)))
  local fits = 1
  if math.floor(prev * prev_ttl / expiry) + cur + cost > limit then
    fits = 0
    out[1] = 0
  end
  costs[i] = cost
  for _, v in ipairs({fits, prev, prev_ttl, cur, cur_ttl}) do table.insert(out, v) end
end
if out[1] == 1 then
  for i = 1, n do
    if costs[i] > 0 then
      local cur_key, expiry = KEYS[2 * i], tonumber(ARGV[3 * i]) * 1000
      if redis.call('exists', cur_key) == 1 then
        redis.call('incrby', cur_key, costs[i])
      else
        redis.call('set', cur_key, costs[i], 'PX', expiry * 2)
        out[5 * i + 1] = expiry * 2
      end
      out[5 * i] = out[5 * i] + costs[i]
    end
  end
end
for k = 2 * n + 1, #KEYS do
  table.insert(out, tonumber(redis.call('get', KEYS[k])) or 0)
end
return out
"""
# KEYS = current window keys, then spend keys; ARGV = window count, (window seconds, delta) per
# window, then (ttl seconds, micro-USD) per spend key. A counter never goes below zero.
_SETTLE = """
local n = tonumber(ARGV[1])
for i = 1, n do
  local key, expiry, delta = KEYS[i], tonumber(ARGV[2 * i]) * 1000, tonumber(ARGV[2 * i + 1])
  local cur = tonumber(redis.call('get', key))
  if cur == nil then
    if delta > 0 then redis.call('set', key, delta, 'PX', expiry * 2) end
  else
    redis.call('incrby', key, math.max(-cur, delta))
  end
end
for k = n + 1, #KEYS do
  local at = 2 * n + 2 * (k - n)
  local ttl, micro = tonumber(ARGV[at]), tonumber(ARGV[at + 1])
  if redis.call('incrby', KEYS[k], micro) == micro then redis.call('expire', KEYS[k], ttl) end
end
return 1
"""


def window_keys(name: str) -> tuple[str, str]:
    """(previous, current) counter keys of the window ``name``."""
    current = KEY_PREFIX + name
    return current + "/-1", current


def spend_key(name: str) -> str:
    """The Redis key of the spend counter ``name``."""
    return KEY_PREFIX + name


class RedisCounters:
    """Windows shared by every replica: one EVALSHA per request (and one per settlement)."""

    def __init__(self, client: aioredis.Redis) -> None:
        self._redis = client
        self._hit = client.register_script(_HIT)
        self._settle = client.register_script(_SETTLE)

    async def _eval(self, script: Any, keys: list[str], args: list[int]) -> Any:
        try:
            return await self._redis.evalsha(script.sha, len(keys), *keys, *args)
        except NoScriptError:  # a restarted or flushed Redis: load it (once) and run it
            return await script(keys, args)

    async def hit(
        self, hits: Sequence[tuple[Window, int]], spend_keys: Sequence[str]
    ) -> tuple[list[WindowState], list[int]]:
        states, spent, _ = await self.hit_and_read(hits, spend_keys, ())
        return states, spent

    async def hit_and_read(
        self,
        hits: Sequence[tuple[Window, int]],
        spend_keys: Sequence[str],
        reads: Sequence[str],
        mark: Mark | None = None,
    ) -> tuple[list[WindowState], list[int], Read]:
        """The check and the reads pipelined: one round trip (``proxy.state.pipelined``)."""
        keys = [key for window, _ in hits for key in window_keys(window.key)]
        args = [len(hits)] + [
            value for window, cost in hits for value in (window.limit, window.window_s, cost)
        ]
        call = ScriptCall(self._hit, keys + [spend_key(k) for k in spend_keys], args)
        answered: Pipelined = await script_and_reads(self._redis, call, reads, mark)
        reply = answered.reply
        states = []
        for i, (window, _) in enumerate(hits):
            fits, previous, previous_ttl, current, current_ttl = (
                int(v) for v in reply[1 + 5 * i : 6 + 5 * i]
            )
            # the current counter lives two windows and turns previous when one is left
            into = (current_ttl / 1000 - window.window_s) if current_ttl else previous_ttl / 1000
            states.append(
                window_state(bool(fits), window.limit, window.window_s, previous, current, max(0.0, into))
            )
        return states, [int(v) for v in reply[1 + 5 * len(hits) :]], answered.values if reads else None

    async def settle(
        self, corrections: Sequence[tuple[Window, int]], spend: Sequence[tuple[str, int]]
    ) -> None:
        moved = [(w, d) for w, d in corrections if d]
        if not moved and not spend:
            return
        keys = [window_keys(w.key)[1] for w, _ in moved] + [spend_key(k) for k, _ in spend]
        args = [len(moved)] + [v for w, d in moved for v in (w.window_s, d)]
        args += [v for k, micro in spend for v in (SPEND_TTL_S[k.rsplit(":", 2)[-2]], micro)]
        await self._eval(self._settle, keys, args)

    async def aclose(self) -> None:
        await self._redis.aclose()
