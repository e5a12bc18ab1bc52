"""Breaker state in Redis (``redis.asyncio``), so replicas share it; falls back to memory.

Keys (prefix ``cogproxy:breaker:{<target>}``, one hash tag so a script's two keys share a Redis
Cluster slot): ``:state`` a hash with ``epoch``, ``open_until``,
``consec``, ``trial_ok`` and the window's buckets ``bs:<n>`` / ``bf:<n>`` (successes / failures),
``:trials`` a sorted set of claimed half-open trials by expiry. Every transition happens in one
Lua script (the same rules as ``MemoryBreakerStore``, see ``proxy.state.store``), so concurrent
replicas never race a breaker open or closed.
"""

from __future__ import annotations

import uuid
from typing import Any

import structlog
from redis.exceptions import RedisError

from proxy.policy.model import BreakerPolicy
from proxy.state.memory import MemoryBreakerStore
from proxy.state.redis_client import RedisOptions, redis_client
from proxy.state.store import WINDOW_BUCKETS, BreakerState, Outcome

log = structlog.get_logger("proxy.state")

_RECORD = """
local st, trials = KEYS[1], KEYS[2]
local epoch, trial, failed = tonumber(ARGV[1]), ARGV[2] == '1', ARGV[3] == '1'
local now, window, min_req = tonumber(ARGV[4]), tonumber(ARGV[5]), tonumber(ARGV[6])
local rate, streak, open_s = tonumber(ARGV[7]), tonumber(ARGV[8]), tonumber(ARGV[9])
local half_open, protect, nbuckets = tonumber(ARGV[10]), ARGV[11] == '1', tonumber(ARGV[12])
local cur = tonumber(redis.call('HGET', st, 'epoch') or '0')
local open_until = tonumber(redis.call('HGET', st, 'open_until') or '0')
local ttl = math.ceil(window + open_s) + 60
local function reset(new_epoch, new_until)
  cur, open_until = new_epoch, new_until
  redis.call('DEL', st, trials)
  redis.call('HSET', st, 'epoch', cur, 'open_until', tostring(open_until))
end
if epoch == cur then
  if open_until > 0 then
    if trial then
      if failed then
        reset(cur + 1, now + open_s)
      elseif redis.call('HINCRBY', st, 'trial_ok', 1) >= half_open then
        reset(cur, 0)
      end
    end
  elseif not trial then
    local width = window / nbuckets
    local bucket = math.floor(now / width)
    redis.call('HINCRBY', st, (failed and 'bf:' or 'bs:') .. bucket, 1)
    local consec = 0
    if failed then
      consec = redis.call('HINCRBY', st, 'consec', 1)
    else
      redis.call('HSET', st, 'consec', 0)
    end
    local fields = redis.call('HGETALL', st)
    local total, fails = 0, 0
    for i = 1, #fields, 2 do
      local name = fields[i]
      if string.sub(name, 1, 1) == 'b' then
        if tonumber(string.sub(name, 4)) <= bucket - nbuckets then
          redis.call('HDEL', st, name)
        else
          total = total + tonumber(fields[i + 1])
          if string.sub(name, 2, 2) == 'f' then fails = fails + tonumber(fields[i + 1]) end
        end
      end
    end
    if failed then
      local share = fails / total
      local by_rate = total >= min_req and share >= rate
      local by_streak = streak > 0 and consec >= streak and ((not protect) or share >= rate)
      if by_rate or by_streak then reset(cur + 1, now + open_s) end
    end
  end
end
redis.call('EXPIRE', st, ttl)
return {cur, tostring(open_until)}
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
    """Shared breaker state; every operation falls back to local memory while Redis is down."""

    def __init__(self, options: RedisOptions) -> None:
        self._redis: Any = redis_client(options, "breakers")
        self._record = self._redis.register_script(_RECORD)
        self._try_trial = self._redis.register_script(_TRY_TRIAL)
        self._fallback = MemoryBreakerStore()
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

    async def state(self, target: str) -> BreakerState:
        if self.degraded:
            return await self._fallback.state(target)
        try:
            epoch, open_until = await self._redis.hmget(breaker_keys(target)[0], "epoch", "open_until")
        except (RedisError, OSError) as exc:
            self._failed(exc)
            return await self._fallback.state(target)
        return BreakerState(int(epoch or 0), float(open_until or 0.0))

    async def try_trial(self, target: str, epoch: int, now: float, ttl: float, slots: int) -> bool:
        if self.degraded:
            return await self._fallback.try_trial(target, epoch, now, ttl, slots)
        try:
            claimed = await self._try_trial(
                keys=breaker_keys(target), args=[epoch, now, ttl, slots, uuid.uuid4().hex]
            )
        except (RedisError, OSError) as exc:
            self._failed(exc)
            return await self._fallback.try_trial(target, epoch, now, ttl, slots)
        return bool(claimed)

    async def record(self, target: str, outcome: Outcome, now: float, policy: BreakerPolicy) -> BreakerState:
        if self.degraded:
            return await self._fallback.record(target, outcome, now, policy)
        try:
            epoch, open_until = await self._record(
                keys=breaker_keys(target),
                args=[
                    outcome.epoch,
                    int(outcome.trial),
                    int(outcome.failed),
                    now,
                    policy.window_s,
                    policy.min_requests,
                    policy.failure_rate,
                    policy.consecutive_failures or 0,
                    policy.open_s,
                    policy.half_open_requests,
                    int(outcome.protect),
                    WINDOW_BUCKETS,
                ],
            )
        except (RedisError, OSError) as exc:
            self._failed(exc)
            return await self._fallback.record(target, outcome, now, policy)
        return BreakerState(int(epoch), float(open_until))

    async def aclose(self) -> None:
        await self._redis.aclose()
