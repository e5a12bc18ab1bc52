"""Breaker transitions shared in Redis (``redis.asyncio``), so replicas learn each other's opens.

Keys (prefix ``cogproxy:breaker:{<target>}``, one hash tag so a script's two keys share a Redis
Cluster slot): ``:state`` a hash with ``epoch`` and ``open_until``,
``:trials`` a sorted set of claimed half-open trials by expiry. Outcomes are counted by each replica
in memory (``proxy.upstream.breaker``); a transition is published in one Lua script (the rules in
``proxy.state.store``), so concurrent replicas never race a breaker open or closed. Where Redis
fails, nothing is shared and each replica's own state governs.
"""

from __future__ import annotations

import uuid
from typing import Any

import structlog
from redis.exceptions import RedisError

from proxy.state.redis_client import RedisOptions, redis_client
from proxy.state.store import BreakerState

log = structlog.get_logger("proxy.state")

_PUBLISH = """
local st, trials = KEYS[1], KEYS[2]
local epoch, open_until, ttl = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local cur = tonumber(redis.call('HGET', st, 'epoch') or '0')
local cur_until = tonumber(redis.call('HGET', st, 'open_until') or '0')
local function take(new_epoch, new_until)
  cur, cur_until = new_epoch, new_until
  redis.call('DEL', trials)
  redis.call('HSET', st, 'epoch', cur, 'open_until', ARGV[2])
end
if open_until > 0 then
  if cur_until <= 0 or epoch > cur then take(math.max(epoch, cur + 1), open_until) end
elseif epoch == cur and cur_until > 0 then
  take(cur, 0)
end
redis.call('EXPIRE', st, ttl)
return {cur, tostring(cur_until)}
"""

_TRY_TRIAL = """
local st, trials = KEYS[1], KEYS[2]
local epoch, now, ttl, slots = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
local cur = tonumber(redis.call('HGET', st, 'epoch') or '0')
local open_until = tonumber(redis.call('HGET', st, 'open_until') or '0')
if cur ~= epoch or open_until <= 0 or now < open_until then return 0 end
redis.call('ZREMRANGEBYSCORE', trials, '-inf', now)
if redis.call('ZCARD', trials) >= slots then return 0 end
redis.call('ZADD', trials, now + ttl, ARGV[5])
redis.call('EXPIRE', trials, math.ceil(ttl) + 1)
return 1
"""


def breaker_keys(target: str) -> list[str]:
    """(state, trials) of ``target``: one hash tag, one Redis Cluster slot."""
    base = f"cogproxy:breaker:{{{target}}}"
    return [f"{base}:state", f"{base}:trials"]


class RedisBreakerStore:
    """Shared breaker transitions; while Redis is down nothing is shared (each replica its own)."""

    def __init__(self, options: RedisOptions) -> None:
        self._redis: Any = redis_client(options, "breakers")
        self._publish = self._redis.register_script(_PUBLISH)
        self._try_trial = self._redis.register_script(_TRY_TRIAL)
        self._health = options.health("breakers")

    @property
    def degraded(self) -> bool:
        return self._health.down

    def _failed(self, exc: Exception) -> None:
        if self._health.failed():
            log.warning(
                "proxy.redis_unavailable",
                error=str(exc),
                fallback="memory",
                retry_in_s=self._health.retry_after_s,
            )

    async def state(self, target: str) -> BreakerState | None:
        if self.degraded:
            return None
        try:
            epoch, open_until = await self._redis.hmget(breaker_keys(target)[0], "epoch", "open_until")
        except (RedisError, OSError) as exc:
            self._failed(exc)
            return None
        return BreakerState(int(epoch or 0), float(open_until or 0.0))

    async def try_trial(self, target: str, epoch: int, now: float, ttl: float, slots: int) -> bool:
        if self.degraded:
            return True
        try:
            claimed = await self._try_trial(
                keys=breaker_keys(target), args=[epoch, now, ttl, slots, uuid.uuid4().hex]
            )
        except (RedisError, OSError) as exc:
            self._failed(exc)
            return True
        return bool(claimed)

    async def publish(self, target: str, state: BreakerState, ttl_s: float) -> BreakerState | None:
        if self.degraded:
            return None
        try:
            epoch, open_until = await self._publish(
                keys=breaker_keys(target), args=[state.epoch, repr(state.open_until), max(1, round(ttl_s))]
            )
        except (RedisError, OSError) as exc:
            self._failed(exc)
            return None
        return BreakerState(int(epoch), float(open_until))

    async def aclose(self) -> None:
        await self._redis.aclose()
