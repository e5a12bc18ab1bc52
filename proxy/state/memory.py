"""In-process breaker state: the default, and the fallback when Redis is unreachable."""

from __future__ import annotations

from collections import defaultdict, deque

from proxy.policy.model import BreakerPolicy


class MemoryBreakerStore:
    def __init__(self) -> None:
        self._failures: defaultdict[str, deque[float]] = defaultdict(deque)
        self._open_until: dict[str, float] = {}
        self._trial_until: dict[str, float] = {}

    async def record_failure(
        self, target: str, now: float, policy: BreakerPolicy, *, force_open: bool
    ) -> float:
        window = self._failures[target]
        window.append(now)
        while window and window[0] <= now - policy.window_s:
            window.popleft()
        current = self._open_until.get(target, 0.0)
        if force_open or len(window) >= policy.failures:
            current = max(current, now + policy.open_s)
            self._open_until[target] = current
        return current

    async def open_until(self, target: str) -> float:
        return self._open_until.get(target, 0.0)

    async def try_trial(self, target: str, now: float, ttl: float) -> bool:
        if self._trial_until.get(target, 0.0) > now:
            return False
        self._trial_until[target] = now + ttl
        return True

    async def close(self, target: str) -> None:
        self._failures.pop(target, None)
        self._open_until.pop(target, None)
        self._trial_until.pop(target, None)

    async def aclose(self) -> None:
        return None
