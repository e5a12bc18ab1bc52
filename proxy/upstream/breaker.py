"""Circuit breakers per target, on the failure rate of a sliding window (resilience4j/Hystrix),
optionally also on consecutive failures (Envoy's outlier detection).

closed -> open (rate or streak, see ``proxy.state.store``) -> after ``open_s``, half-open:
``half_open_requests`` trials -> closed when all succeed, open again (new epoch) when one fails.
Admission hands out a ``Ticket`` carrying the epoch it saw; outcomes of requests admitted before
the breaker opened never move it.

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
from proxy.state.store import BreakerState, BreakerStore, Outcome
from proxy.upstream.base import ProviderError

log = structlog.get_logger("proxy.breaker")

Admission = Literal["closed", "trial", "open"]
Transition = Literal["open", "closed"]
DEFAULT_REFRESH_S = 0.5

# Failures that say something about the provider's health. Rate limits are the provider doing
# its job (Retry-After handles them); client errors and contract failures are not its fault.
BREAKER_KINDS = frozenset({"connect", "timeout", "server_error", "malformed"})


def counts_against_breaker(exc: ProviderError) -> bool:
    return exc.kind in BREAKER_KINDS


@dataclass(slots=True)  # built per request: not frozen (a frozen init costs 4x)
class Ticket:
    """An admission: may the request go, is it the half-open trial, which epoch did it see."""

    admission: Admission
    epoch: int
    retry_in: float = 0.0
    """open: seconds until the breaker's half-open trial."""


@dataclass
class _Cached:
    state: BreakerState
    read_at: float


class Breakers:
    def __init__(
        self,
        store: BreakerStore,
        *,
        clock: Callable[[], float] = time.time,
        refresh_s: float = DEFAULT_REFRESH_S,
        on_transition: Callable[[str, Transition], None] = lambda target, to: None,
    ) -> None:
        self.store = store
        self._clock = clock
        self._refresh_s = refresh_s
        self._cache: dict[str, _Cached] = {}
        self._on_transition = on_transition

    async def _state(self, target: str) -> BreakerState:
        now = self._clock()
        cached = self._cache.get(target)
        if cached is None or now - cached.read_at >= self._refresh_s:
            cached = _Cached(await self.store.state(target), now)
            self._cache[target] = cached
        return cached.state

    async def admit(self, target: str, policy: BreakerPolicy, trial_ttl: float) -> Ticket:
        """May a request go to ``target`` now? A trial ticket is one of the half-open probes."""
        state = await self._state(target)
        now = self._clock()
        if state.open_until <= 0.0:
            return Ticket("closed", state.epoch)
        if now < state.open_until:
            return Ticket("open", state.epoch, state.open_until - now)
        if await self.store.try_trial(target, state.epoch, now, trial_ttl, policy.half_open_requests):
            return Ticket("trial", state.epoch)
        return Ticket("open", state.epoch, trial_ttl)  # a trial is under way: its outcome is near

    def is_open(self, target: str) -> bool:
        """Whether ``target`` is open as last seen (no I/O)."""
        cached = self._cache.get(target)
        return cached is not None and cached.state.open_until > 0.0

    async def record(
        self, target: str, ticket: Ticket, policy: BreakerPolicy, *, failed: bool, protect: bool = False
    ) -> None:
        """Count an attempt's outcome; ``protect``: the target is the last of its rung not open."""
        now = self._clock()
        before = self._cache.get(target)
        outcome = Outcome(ticket.epoch, ticket.admission == "trial", failed, protect)
        after = await self.store.record(target, outcome, now, policy)
        self._cache[target] = _Cached(after, now)
        was_open = before is not None and before.state.open_until > 0.0
        if after.open_until > 0.0 and (not was_open or (before and before.state.epoch != after.epoch)):
            log.warning("proxy.breaker_opened", target=target, open_until=after.open_until, epoch=after.epoch)
            self._on_transition(target, "open")
        elif after.open_until <= 0.0 and was_open:
            log.info("proxy.breaker_closed", target=target, epoch=after.epoch)
            self._on_transition(target, "closed")

    def snapshot(self) -> dict[str, bool]:
        """Which targets this process currently sees as open (for the metrics gauge)."""
        now = self._clock()
        return {target: c.state.open_until > now for target, c in self._cache.items()}
