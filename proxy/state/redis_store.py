"""Breaker state in Redis (``redis.asyncio``), so replicas share it; falls back to memory.

Keys (prefix ``cogproxy:breaker:<target>``): ``:failures`` a sorted set of failure times,
``:state`` a hash with ``open_until``, ``:trial`` the half-open trial lock (SET NX PX). The
failure count and the open decision happen in one Lua script, so concurrent replicas never
shorten an open period.
"""

from __future__ import annotations

import math
import time
import uuid
from typing import Any

import redis.asyncio as aioredis
import structlog
from redis.exceptions import RedisError

from proxy.policy.model import BreakerPolicy
from proxy.state.memory import MemoryBreakerStore

log = structlog.get_logger("proxy.state")

_RECORD_FAILURE = """
local now = tonumber(ARGV[1])
local window = tonumber(ARGV[2])
redis.call('ZADD', KEYS[1], now, ARGV[6])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now - window)
redis.call('EXPIRE', KEYS[1], math.ceil(window) + 1)
local count = redis.call('ZCARD', KEYS[1])
local current = tonumber(redis.call('HGET', KEYS[2], 'open_until') or '0')
if ARGV[5] == '1' or count >= tonumber(ARGV[3]) then
  local candidate = now + tonumber(ARGV[4])
  if candidate > current then
    current = candidate
    redis.call('HSET', KEYS[2], 'open_until', tostring(current))
  end
  redis.call('EXPIRE', KEYS[2], math.ceil(tonumber(ARGV[4])) + 60)
end
return tostring(current)
"""

# After Redis fails, the memory store serves for this long before Redis is tried again.
RETRY_REDIS_AFTER_S = 5.0
REDIS_OP_TIMEOUT_S = 0.25


def _keys(target: str) -> tuple[str, str, str]:
    base = f"cogproxy:breaker:{target}"
    return f"{base}:failures", f"{base}:state", f"{base}:trial"


class RedisBreakerStore:
    """Shared breaker state; every operation falls back to local memory while Redis is down."""

    def __init__(self, url: str) -> None:
        self._redis: Any = aioredis.Redis.from_url(
            url,
            socket_timeout=REDIS_OP_TIMEOUT_S,
            socket_connect_timeout=REDIS_OP_TIMEOUT_S,
            decode_responses=True,
        )
        self._script = self._redis.register_script(_RECORD_FAILURE)
        self._fallback = MemoryBreakerStore()
        self._down_until = 0.0

    @property
    def degraded(self) -> bool:
        return time.monotonic() < self._down_until

    def _failed(self, exc: Exception) -> None:
        if not self.degraded:
            log.warning(
                "proxy.redis_unavailable", error=str(exc), fallback="memory", retry_in_s=RETRY_REDIS_AFTER_S
            )
        self._down_until = time.monotonic() + RETRY_REDIS_AFTER_S

    async def record_failure(
        self, target: str, now: float, policy: BreakerPolicy, *, force_open: bool
    ) -> float:
        local = await self._fallback.record_failure(target, now, policy, force_open=force_open)
        if self.degraded:
            return local
        failures, state, _ = _keys(target)
        try:
            value = await self._script(
                keys=[failures, state],
                args=[
                    now,
                    policy.window_s,
                    policy.failures,
                    policy.open_s,
                    "1" if force_open else "0",
                    f"{now}:{uuid.uuid4().hex[:8]}",
                ],
            )
        except (RedisError, OSError) as exc:
            self._failed(exc)
            return local
        return float(value)

    async def open_until(self, target: str) -> float:
        if self.degraded:
            return await self._fallback.open_until(target)
        try:
            value = await self._redis.hget(_keys(target)[1], "open_until")
        except (RedisError, OSError) as exc:
            self._failed(exc)
            return await self._fallback.open_until(target)
        return float(value) if value else 0.0

    async def try_trial(self, target: str, now: float, ttl: float) -> bool:
        if self.degraded:
            return await self._fallback.try_trial(target, now, ttl)
        try:
            return bool(
                await self._redis.set(_keys(target)[2], "1", nx=True, px=max(1, math.ceil(ttl * 1000)))
            )
        except (RedisError, OSError) as exc:
            self._failed(exc)
            return await self._fallback.try_trial(target, now, ttl)

    async def close(self, target: str) -> None:
        await self._fallback.close(target)
        if self.degraded:
            return
        try:
            await self._redis.delete(*_keys(target))
        except (RedisError, OSError) as exc:
            self._failed(exc)

    async def aclose(self) -> None:
        await self._redis.aclose()
