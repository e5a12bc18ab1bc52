"""The breaker-state store interface. Times are wall-clock epoch seconds (shared across hosts)."""

from __future__ import annotations

from typing import Protocol

from proxy.policy.model import BreakerPolicy


class BreakerStore(Protocol):
    """Where circuit-breaker state lives. Implementations must be safe under concurrency."""

    async def record_failure(
        self, target: str, now: float, policy: BreakerPolicy, *, force_open: bool
    ) -> float:
        """Count a provider failure of ``target``; open (or extend) its breaker when the window
        holds ``policy.failures`` failures, or at once when ``force_open`` (a failed half-open
        trial). Returns the open-until time (0.0 when closed). An open period only grows."""
        ...

    async def open_until(self, target: str) -> float:
        """When ``target``'s breaker stops being open (0.0: closed)."""
        ...

    async def try_trial(self, target: str, now: float, ttl: float) -> bool:
        """Claim the single half-open trial request; False when another request holds it."""
        ...

    async def close(self, target: str) -> None:
        """A trial succeeded: forget the failures and close the breaker."""
        ...

    async def aclose(self) -> None:
        """Release connections."""
        ...
