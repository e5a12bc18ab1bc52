"""The breaker-state store interface. Times are wall-clock epoch seconds (shared across hosts).

Semantics every store implements (memory and Redis alike):

* ``epoch`` counts the times a breaker opened. An admission carries the epoch it saw; an outcome
  whose epoch is not the current one (the request was admitted before the breaker opened) moves
  nothing.
* Closed: successes and failures are counted in a sliding window of ``WINDOW_BUCKETS`` buckets.
  A failure opens the breaker when the window holds ``min_requests`` outcomes and the failure
  share reaches ``failure_rate``, or after ``consecutive_failures`` failures in a row unless the
  target is the last one of its rung not open (``protect``) and the window's failure share is
  below ``failure_rate``.
* Open: after ``open_until``, ``half_open_requests`` trials are admitted. Only their outcomes
  move the breaker: one failure re-opens it (a new epoch), all of them succeeding close it.

Every replica counts outcomes in its own memory (``MemoryBreakerStore.record``); a shared store
(``BreakerStore``: Redis, or memory in tests) holds only the transitions replicas publish, and the
half-open trial claims. Publishing (``publish``) keeps what is newer:

* an open of epoch ``e`` when the shared breaker is closed: open, epoch ``max(e, shared + 1)``;
  when it is open already: kept unless ``e`` is newer (a failed trial re-opened it);
* a close of epoch ``e``: applied when the shared breaker is open in that same epoch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

# Resolution of the sliding window: buckets of window_s / 10 (Hystrix's default of ten).
WINDOW_BUCKETS = 10


@dataclass(slots=True)  # built per request: not frozen (a frozen init costs 4x)
class BreakerState:
    epoch: int = 0
    open_until: float = 0.0
    """When the open period ends (0.0: closed)."""


@dataclass(slots=True)  # built per request: not frozen (a frozen init costs 4x)
class Outcome:
    """One attempt's result as the breaker counts it."""

    epoch: int
    trial: bool
    failed: bool
    protect: bool = False
    """The target is the last one of its rung whose breaker is not open."""


def newer(shared: BreakerState, local: BreakerState) -> bool:
    """Whether a replica seeing ``local`` adopts ``shared``: a later epoch, or its own epoch closed."""
    return shared.epoch > local.epoch or (
        shared.epoch == local.epoch and local.open_until > 0.0 and shared.open_until <= 0.0
    )


class BreakerStore(Protocol):
    """Breaker transitions shared by replicas. Implementations must be safe under concurrency;
    None (or True for a trial) where the store cannot answer: the replica's own state governs."""

    async def state(self, target: str) -> BreakerState | None:
        """The breaker's current shared epoch and open-until time."""
        ...

    async def try_trial(self, target: str, epoch: int, now: float, ttl: float, slots: int) -> bool:
        """Claim one of ``slots`` half-open trials of ``epoch`` (held ``ttl`` seconds); False when
        they are taken, the open period is not over, or the breaker moved to another epoch."""
        ...

    async def publish(self, target: str, state: BreakerState, ttl_s: float) -> BreakerState | None:
        """Publish a transition to ``state`` (the rules above); the shared state after it."""
        ...

    async def aclose(self) -> None:
        """Release connections."""
        ...
