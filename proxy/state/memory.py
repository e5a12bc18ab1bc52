"""In-process breaker state: the default, and the fallback when Redis is unreachable."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from proxy.policy.model import BreakerPolicy
from proxy.state.store import WINDOW_BUCKETS, BreakerState, Outcome


@dataclass
class _Target:
    epoch: int = 0
    open_until: float = 0.0
    consecutive: int = 0
    trial_ok: int = 0
    buckets: dict[int, list[int]] = field(default_factory=dict)
    """bucket index -> [successes, failures]"""
    trials: list[float] = field(default_factory=list)
    """Expiry times of the claimed half-open trials."""

    def open(self, now: float, policy: BreakerPolicy) -> None:
        self.epoch += 1
        self.open_until = now + policy.open_s
        self.reset()

    def close(self) -> None:
        self.open_until = 0.0
        self.reset()

    def reset(self) -> None:
        self.consecutive = self.trial_ok = 0
        self.buckets.clear()
        self.trials.clear()


class MemoryBreakerStore:
    """A replica's own breakers (``record``), and a shared store for tests (``publish``)."""

    def __init__(self) -> None:
        self._targets: dict[str, _Target] = {}

    def _get(self, target: str) -> _Target:
        found = self._targets.get(target)  # not setdefault: it would build a _Target every call
        if found is None:
            found = self._targets[target] = _Target()
        return found

    async def state(self, target: str) -> BreakerState:
        t = self._targets.get(target)
        return BreakerState() if t is None else BreakerState(t.epoch, t.open_until)

    async def try_trial(self, target: str, epoch: int, now: float, ttl: float, slots: int) -> bool:
        t = self._get(target)
        if t.epoch != epoch or t.open_until <= 0.0 or now < t.open_until:
            return False
        t.trials = [expiry for expiry in t.trials if expiry > now]
        if len(t.trials) >= slots:
            return False
        t.trials.append(now + ttl)
        return True

    async def record(self, target: str, outcome: Outcome, now: float, policy: BreakerPolicy) -> BreakerState:
        t = self._get(target)
        if outcome.epoch != t.epoch:
            pass  # admitted before the breaker last opened: moves nothing
        elif t.open_until > 0.0:
            if outcome.trial:
                if outcome.failed:
                    t.open(now, policy)
                else:
                    t.trial_ok += 1
                    if t.trial_ok >= policy.half_open_requests:
                        t.close()
        elif not outcome.trial:
            self._count(t, outcome, now, policy)
        return BreakerState(t.epoch, t.open_until)

    def closed_epoch(self, target: str) -> int | None:
        """The epoch of ``target``'s breaker while it is closed; None while it is open or half-open."""
        t = self._targets.get(target)
        if t is None:
            return 0
        return t.epoch if t.open_until <= 0.0 else None

    def count_success(self, target: str, epoch: int, now: float, policy: BreakerPolicy) -> None:
        """``record`` of a success admitted while the breaker was closed (not a trial), without
        its ``Outcome`` and state objects: a success never moves a breaker, it is only counted."""
        t = self._get(target)
        if epoch == t.epoch and t.open_until <= 0.0:
            self._bucket(t, now, policy)[0] += 1
            t.consecutive = 0

    @staticmethod
    def _bucket(t: _Target, now: float, policy: BreakerPolicy) -> list[int]:
        """The [successes, failures] of ``now``'s bucket of the window."""
        width = policy.window_s / WINDOW_BUCKETS
        bucket = math.floor(now / width)
        counts = t.buckets.get(bucket)
        if counts is None:  # a new bucket: the window slid, so drop the buckets it left behind
            for old in [b for b in t.buckets if b <= bucket - WINDOW_BUCKETS]:
                del t.buckets[old]
            counts = t.buckets[bucket] = [0, 0]
        return counts

    @staticmethod
    def _count(t: _Target, outcome: Outcome, now: float, policy: BreakerPolicy) -> None:
        counts = MemoryBreakerStore._bucket(t, now, policy)
        counts[1 if outcome.failed else 0] += 1
        t.consecutive = t.consecutive + 1 if outcome.failed else 0
        if not outcome.failed:
            return
        total = sum(s + f for s, f in t.buckets.values())
        share = sum(f for _, f in t.buckets.values()) / total
        by_rate = total >= policy.min_requests and share >= policy.failure_rate
        by_streak = (
            policy.consecutive_failures is not None
            and t.consecutive >= policy.consecutive_failures
            and (not outcome.protect or share >= policy.failure_rate)
        )
        if by_rate or by_streak:
            t.open(now, policy)

    async def publish(self, target: str, state: BreakerState, ttl_s: float) -> BreakerState:
        t = self._get(target)
        if state.open_until > 0.0:
            if t.open_until <= 0.0 or state.epoch > t.epoch:
                self.adopt(target, BreakerState(max(state.epoch, t.epoch + 1), state.open_until))
        elif state.epoch == t.epoch and t.open_until > 0.0:
            self.adopt(target, state)
        return BreakerState(t.epoch, t.open_until)

    def adopt(self, target: str, state: BreakerState) -> None:
        """Take ``state`` as this breaker's (a transition seen elsewhere): its window starts over."""
        t = self._get(target)
        t.epoch, t.open_until = state.epoch, state.open_until
        t.reset()

    def known(self) -> dict[str, BreakerState]:
        """Every breaker that counted an outcome, claimed a trial or took a state."""
        return {target: BreakerState(t.epoch, t.open_until) for target, t in self._targets.items()}

    async def aclose(self) -> None:
        return None
