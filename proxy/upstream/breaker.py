"""Circuit breakers per target, on the failure rate of a sliding window (resilience4j/Hystrix),
optionally also on consecutive failures (Envoy's outlier detection).

closed -> open (rate or streak, see ``proxy.state.store``) -> after ``open_s``, half-open:
``half_open_requests`` trials -> closed when all succeed, open again (new epoch) when one fails.
Admission hands out a ``Ticket`` carrying the epoch it saw; outcomes of requests admitted before
the breaker opened never move it.

Outcomes are counted in this replica's memory: an admission and an outcome never wait on Redis.
With a shared store (Redis) a transition (open, re-open, close) is published when it happens, in
the background, one Lua script each; other replicas learn it when they next read the shared state
(in the background, at most every ``refresh_s``). So sharing is eventual: a breaker opened on one
replica is open on the others within ``refresh_s`` plus a Redis round trip. Each replica opens on
the failure rate of its own traffic. Two reads do wait: a target's first admission in a process
(so a new replica starts from the shared state), and a half-open trial's claim (so that the
replicas send ``half_open_requests`` trials between them, not each).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any, Literal

import structlog

from proxy.policy.model import BreakerPolicy
from proxy.state.memory import MemoryBreakerStore
from proxy.state.store import BreakerState, BreakerStore, Outcome, newer
from proxy.upstream.base import ProviderError

log = structlog.get_logger("proxy.breaker")

Admission = Literal["closed", "trial", "open"]
Transition = Literal["open", "closed"]
DEFAULT_REFRESH_S = 0.5
SHARED_TTL_MARGIN_S = 60.0
"""A shared breaker state outlives its window and open period by this much, then expires (closed)."""

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


class Breakers:
    def __init__(
        self,
        store: BreakerStore | None = None,
        *,
        clock: Callable[[], float] = time.time,
        refresh_s: float = DEFAULT_REFRESH_S,
        on_transition: Callable[[str, Transition], None] = lambda target, to: None,
    ) -> None:
        self.store = store
        """The shared store (None: this replica alone)."""
        self._local = MemoryBreakerStore()
        self._clock = clock
        self._refresh_s = refresh_s
        self._read_at: dict[str, float] = {}
        self._on_transition = on_transition
        self._publishing: dict[str, asyncio.Task[None]] = {}
        """The last publish of each target: publishes of one target go out in order."""
        self._refreshing: dict[str, asyncio.Task[None]] = {}

    async def _refresh(self, target: str) -> None:
        """Read the shared state: awaited on a target's first admission, else in the background
        once ``refresh_s`` passed since the last read."""
        if self.store is None:
            return
        now = self._clock()
        read_at = self._read_at.get(target)
        if read_at is not None and (now - read_at < self._refresh_s or target in self._refreshing):
            return
        self._read_at[target] = now
        if read_at is None:
            await self._read(target)
        else:
            self._track(self._refreshing, target, self._read(target))

    async def _read(self, target: str) -> None:
        assert self.store is not None
        shared = await self.store.state(target)
        if shared is not None:
            await self._adopt(target, shared)

    def _track(
        self, tasks: dict[str, asyncio.Task[None]], target: str, work: Coroutine[Any, Any, None]
    ) -> None:
        task = asyncio.create_task(work)
        tasks[target] = task

        def done(finished: asyncio.Task[None]) -> None:
            if tasks.get(target) is finished:
                del tasks[target]

        task.add_done_callback(done)

    async def _adopt(self, target: str, shared: BreakerState) -> None:
        """Take a transition another replica published, when it is newer than what is seen here."""
        local = await self._local.state(target)
        if not newer(shared, local):
            return
        self._local.adopt(target, shared)
        log.info("proxy.breaker_shared", target=target, epoch=shared.epoch, open_until=shared.open_until)
        if (shared.open_until > 0.0) != (local.open_until > 0.0):
            self._on_transition(target, "open" if shared.open_until > 0.0 else "closed")

    def _publish(self, target: str, state: BreakerState, policy: BreakerPolicy) -> None:
        if self.store is None:
            return
        store, previous = self.store, self._publishing.get(target)
        ttl_s = policy.window_s + policy.open_s + SHARED_TTL_MARGIN_S

        async def send() -> None:
            if previous is not None:
                await asyncio.wait([previous])
            shared = await store.publish(target, state, ttl_s)
            if shared is not None:
                await self._adopt(target, shared)

        self._track(self._publishing, target, send())

    async def admit(self, target: str, policy: BreakerPolicy, trial_ttl: float) -> Ticket:
        """May a request go to ``target`` now? A trial ticket is one of the half-open probes."""
        await self._refresh(target)
        state = await self._local.state(target)
        now = self._clock()
        if state.open_until <= 0.0:
            return Ticket("closed", state.epoch)
        if now < state.open_until:
            return Ticket("open", state.epoch, state.open_until - now)
        if await self._claim(target, now, trial_ttl, policy.half_open_requests):
            return Ticket("trial", state.epoch)
        return Ticket("open", state.epoch, trial_ttl)  # a trial is under way: its outcome is near

    def admit_closed(self, target: str) -> Ticket | None:
        """``admit`` without awaiting, for a breaker of this replica alone (no shared store) that is
        closed: the usual case. None: ``admit`` it (a shared store to read, or not closed)."""
        if self.store is not None:
            return None
        epoch = self._local.closed_epoch(target)
        return None if epoch is None else Ticket("closed", epoch)

    def record_success(self, target: str, ticket: Ticket, policy: BreakerPolicy) -> bool:
        """``record`` of a success without awaiting, when admitted closed (not a trial): counted in
        the window, which a success never moves (so nothing to publish). False: ``record`` it."""
        if ticket.admission != "closed":
            return False
        self._local.count_success(target, ticket.epoch, self._clock(), policy)
        return True

    async def _claim(self, target: str, now: float, ttl: float, slots: int) -> bool:
        """A half-open trial, claimed here and then (its open published first) in the shared store."""
        state = await self._local.state(target)
        if not await self._local.try_trial(target, state.epoch, now, ttl, slots):
            return False
        if self.store is None:
            return True
        pending = self._publishing.get(target)
        if pending is not None:
            await asyncio.wait([pending])
        return await self.store.try_trial(target, state.epoch, now, ttl, slots)

    def is_open(self, target: str) -> bool:
        """Whether ``target`` is open as last seen (no I/O)."""
        state = self._local.known().get(target)
        return state is not None and state.open_until > 0.0

    async def record(
        self, target: str, ticket: Ticket, policy: BreakerPolicy, *, failed: bool, protect: bool = False
    ) -> None:
        """Count an attempt's outcome; ``protect``: the target is the last of its rung not open."""
        now = self._clock()
        before = await self._local.state(target)
        outcome = Outcome(ticket.epoch, ticket.admission == "trial", failed, protect)
        after = await self._local.record(target, outcome, now, policy)
        if after == before:
            return
        self._publish(target, after, policy)
        if after.open_until > 0.0:
            log.warning("proxy.breaker_opened", target=target, open_until=after.open_until, epoch=after.epoch)
            self._on_transition(target, "open")
        else:
            log.info("proxy.breaker_closed", target=target, epoch=after.epoch)
            self._on_transition(target, "closed")

    async def settled(self) -> None:
        """Wait for the publishes and reads under way (tests; shutdown)."""
        while pending := [*self._publishing.values(), *self._refreshing.values()]:
            await asyncio.wait(pending)

    def snapshot(self) -> dict[str, bool]:
        """Which targets this process currently sees as open (for the metrics gauge)."""
        now = self._clock()
        known = self._local.known()
        targets = set(known) | set(self._read_at)
        return {t: t in known and known[t].open_until > now for t in targets}
