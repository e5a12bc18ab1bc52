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
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from proxy.policy.model import BreakerPolicy

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


class BreakerStore(Protocol):
    """Where circuit-breaker state lives. Implementations must be safe under concurrency."""

    async def state(self, target: str) -> BreakerState:
        """The breaker's current epoch and open-until time."""
        ...

    async def try_trial(self, target: str, epoch: int, now: float, ttl: float, slots: int) -> bool:
        """Claim one of ``slots`` half-open trials of ``epoch`` (held ``ttl`` seconds); False when
        they are taken, the open period is not over, or the breaker moved to another epoch."""
        ...

    async def record(self, target: str, outcome: Outcome, now: float, policy: BreakerPolicy) -> BreakerState:
        """Count ``outcome`` (see the module docstring) and return the state after it."""
        ...

    async def aclose(self) -> None:
        """Release connections."""
        ...
