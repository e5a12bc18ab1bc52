"""Circuit breakers per target: closed -> open after N failures in a window -> half-open (one
trial request) after ``open_s`` -> closed on success, open again on failure.

State lives in a ``BreakerStore`` (memory or Redis). Reads are cached locally for
``refresh_s`` so that the hot path does not wait on Redis, yet a breaker opened by another
replica is seen within a second.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import structlog

from proxy.policy.model import BreakerPolicy
from proxy.state.store import BreakerStore
from proxy.upstream.base import ProviderError

log = structlog.get_logger("proxy.breaker")

Admission = Literal["closed", "trial", "open"]
DEFAULT_REFRESH_S = 0.5

# Failures that say something about the provider's health. Rate limits are the provider doing
# its job (Retry-After handles them); client errors and contract failures are not its fault.
BREAKER_KINDS = frozenset({"connect", "timeout", "server_error", "malformed"})


def counts_against_breaker(exc: ProviderError) -> bool:
    return exc.kind in BREAKER_KINDS


@dataclass
class _Cached:
    open_until: float
    read_at: float


class Breakers:
    def __init__(
        self,
        store: BreakerStore,
        *,
        clock: Callable[[], float] = time.time,
        refresh_s: float = DEFAULT_REFRESH_S,
    ) -> None:
        self.store = store
        self._clock = clock
        self._refresh_s = refresh_s
        self._cache: dict[str, _Cached] = {}

    async def open_until(self, target: str) -> float:
        now = self._clock()
        cached = self._cache.get(target)
        if cached is None or now - cached.read_at >= self._refresh_s:
            cached = _Cached(await self.store.open_until(target), now)
            self._cache[target] = cached
        return cached.open_until

    async def admit(self, target: str, trial_ttl: float) -> Admission:
        """May a request go to ``target`` now? ``trial``: it is the half-open probe."""
        open_until = await self.open_until(target)
        now = self._clock()
        if open_until <= 0.0:
            return "closed"
        if now < open_until:
            return "open"
        return "trial" if await self.store.try_trial(target, now, trial_ttl) else "open"

    async def failure(self, target: str, policy: BreakerPolicy, *, trial: bool) -> None:
        now = self._clock()
        before = self._cache.get(target)
        open_until = await self.store.record_failure(target, now, policy, force_open=trial)
        self._cache[target] = _Cached(open_until, now)
        if open_until > now and (before is None or before.open_until <= now):
            log.warning("proxy.breaker_opened", target=target, open_until=open_until, trial=trial)

    async def success(self, target: str, *, trial: bool) -> None:
        cached = self._cache.get(target)
        if trial or (cached is not None and cached.open_until > 0.0):
            await self.store.close(target)
            self._cache[target] = _Cached(0.0, self._clock())
            log.info("proxy.breaker_closed", target=target)

    def snapshot(self) -> dict[str, bool]:
        """Which targets this process currently sees as open (for the metrics gauge)."""
        now = self._clock()
        return {target: c.open_until > now for target, c in self._cache.items()}
