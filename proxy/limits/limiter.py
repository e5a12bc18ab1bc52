"""Admitting a request against its client's, team's and the global limits and budgets, and
settling it with what the answer used and cost."""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Literal

import structlog
from redis.exceptions import RedisError

from proxy.clients import Caller
from proxy.context.store import Mark
from proxy.limits.windows import MICRO, Counters, MemoryCounters, Read, RedisCounters, Window, WindowState
from proxy.policy.limits import LimitSpec, LimitsPolicy
from proxy.state.redis_client import RETRY_AFTER_S, RedisHealth, RedisOptions, redis_client

log = structlog.get_logger("proxy.limits")

Kind = Literal["requests", "tokens"]
LimitScope = Literal["client", "team", "global"]
Period = Literal["day", "month"]
SECONDS_PER_DAY = 86400
MAX_PLANS = 10_000
"""Cached request plans (one per client and team a day): a backstop, cleared when full."""


@dataclass(frozen=True, slots=True)
class Limited:
    """One window of a request."""

    scope: LimitScope
    kind: Kind
    window: Window
    cost: int
    state: WindowState


@dataclass(frozen=True, slots=True)
class Budget:
    scope: LimitScope
    period: Literal["day", "month"]
    key: str
    limit_usd: float
    spent_usd: float

    @property
    def exceeded(self) -> bool:
        return self.spent_usd >= self.limit_usd


@dataclass(frozen=True, slots=True)
class Admission:
    caller: Caller
    windows: tuple[Limited, ...] = ()
    budgets: tuple[Budget, ...] = ()
    spend_keys: tuple[str, ...] = ()
    estimate: int = 0
    read: Read = None
    """The keys asked for with the check, read in its round trip (``Limiter.admit``'s ``reads``)."""

    @property
    def refused(self) -> Limited | None:
        """The first window the request did not fit in."""
        return next((w for w in self.windows if not w.state.allowed), None)

    @property
    def over_budget(self) -> Budget | None:
        return next((b for b in self.budgets if b.exceeded), None)

    def tightest(self, kind: Kind) -> Limited | None:
        """The window of ``kind`` with the least left (what the ``x-ratelimit-*`` headers tell)."""
        of_kind = [w for w in self.windows if w.kind == kind]
        return min(of_kind, key=lambda w: w.state.remaining, default=None)

    def retry_after_s(self) -> float:
        refused = [w.state.reset_s for w in self.windows if not w.state.allowed]
        return max(refused, default=0.0)


def duration(seconds: float) -> str:
    """OpenAI's reset format: ``120ms``, ``17s``, ``6m0s``."""
    if seconds < 1:
        return f"{max(0, math.ceil(seconds * 1000))}ms"
    whole = math.ceil(seconds)
    return f"{whole}s" if whole < 60 else f"{whole // 60}m{whole % 60}s"


def ratelimit_headers(admission: Admission) -> dict[str, str]:
    """``x-ratelimit-{limit,remaining,reset}-{requests,tokens}`` as OpenAI sends them: reset is the
    time until the window is full again (``Retry-After`` is the time until one more unit fits)."""
    headers = {}
    for kind in ("requests", "tokens"):
        window = admission.tightest(kind)
        if window is not None:
            headers[f"x-ratelimit-limit-{kind}"] = str(window.window.limit)
            headers[f"x-ratelimit-remaining-{kind}"] = str(window.state.remaining)
            headers[f"x-ratelimit-reset-{kind}"] = duration(window.state.full_s)
    return headers


def _scopes(policy: LimitsPolicy, caller: Caller) -> list[tuple[LimitScope, str, LimitSpec]]:
    scopes: list[tuple[LimitScope, str, LimitSpec]] = []
    client = policy.for_client(caller.identity.name or "")
    if client is not None:
        scopes.append(("client", caller.id, client))
    team = policy.for_team(caller.identity.team)
    if team is not None and caller.identity.team:
        scopes.append(("team", caller.identity.team, team))
    if policy.global_ is not None:
        scopes.append(("global", "all", policy.global_))
    return scopes


def _periods(now: float) -> dict[str, str]:
    day = datetime.fromtimestamp(now, UTC)
    return {"day": day.strftime("%Y-%m-%d"), "month": day.strftime("%Y-%m")}


@dataclass(frozen=True, slots=True)
class _Plan:
    windows: tuple[tuple[LimitScope, Kind, Window], ...]
    spend_keys: tuple[str, ...]
    """Every scope's day and month spend (all grow, budgeted or not: ``/v1/usage`` shows them)."""
    budgets: tuple[tuple[LimitScope, Period, str, float], ...]

    @property
    def budget_keys(self) -> tuple[str, ...]:
        return tuple(key for _, _, key, _ in self.budgets)


def _build_plan(policy: LimitsPolicy, caller: Caller, periods: dict[str, str]) -> _Plan:
    windows: list[tuple[LimitScope, Kind, Window]] = []
    spend_keys: list[str] = []
    budgets: list[tuple[LimitScope, Period, str, float]] = []
    for scope, ident, spec in _scopes(policy, caller):
        base = f"{scope}:{ident}"
        if spec.rpm is not None:
            windows.append((scope, "requests", Window(f"{base}:req", spec.rpm, policy.window_s)))
        if spec.tpm is not None:
            windows.append((scope, "tokens", Window(f"{base}:tok", spec.tpm, policy.window_s)))
        periods_limits: tuple[tuple[Period, float | None], ...] = (
            ("day", spec.usd_per_day),
            ("month", spec.usd_per_month),
        )
        for period, limit in periods_limits:
            key = f"spend:{base}:{period}:{periods[period]}"
            spend_keys.append(key)
            if limit is not None:
                budgets.append((scope, period, key, limit))
    return _Plan(tuple(windows), tuple(spend_keys), tuple(budgets))


@dataclass
class Limiter:
    """The limits of every request of this replica."""

    counters: Counters
    local: MemoryCounters = field(default_factory=MemoryCounters)
    """Used instead of ``counters`` while Redis is unreachable (``replicas_hint`` divides limits)."""
    shared: bool = False
    on_degraded: Callable[[bool], None] = lambda degraded: None
    clock: Callable[[], float] = time.time
    health: RedisHealth = field(default_factory=lambda: RedisHealth(RETRY_AFTER_S["limits"]))
    """Past a Redis failure (or its ``limits`` timeout) local windows are used for a while."""
    _plans: dict[tuple[int, str, str | None, int], tuple[LimitsPolicy, _Plan]] = field(default_factory=dict)
    _settling: set[asyncio.Task[None]] = field(default_factory=set)

    @classmethod
    def build(
        cls, redis: RedisOptions | None, replicas_hint: int, on_degraded: Callable[[bool], None]
    ) -> Limiter:
        if redis is None:
            return cls(MemoryCounters())
        counters = RedisCounters(redis_client(redis, "limits"))
        return cls(counters, MemoryCounters(replicas_hint), True, on_degraded, health=redis.health("limits"))

    @property
    def degraded(self) -> bool:
        return self.shared and self.health.down

    async def _run(
        self,
        hits: Sequence[tuple[Window, int]],
        spend_keys: Sequence[str],
        reads: Sequence[str],
        mark: Mark | None,
    ) -> tuple[list[WindowState], list[int], Read]:
        failed: Read = None
        if not self.degraded:
            try:
                result = await self.counters.hit_and_read(hits, spend_keys, reads, mark)
            except (RedisError, OSError) as exc:
                self._fail(exc)
                failed = exc if reads else None  # the reads went down with the check
            else:
                if self.shared and self.health.answered():
                    self.on_degraded(False)
                    log.info("proxy.limits_shared_again")
                return result
        states, spent = await self.local.hit(hits, spend_keys)
        return states, spent, failed

    def _fail(self, exc: BaseException) -> None:
        if self.health.failed():
            log.warning("proxy.limits_degraded", error=str(exc)[:200], retry_s=self.health.retry_after_s)
        self.on_degraded(True)

    def _plan(self, policy: LimitsPolicy, caller: Caller) -> _Plan:
        """The windows and spend keys of ``caller``'s requests today (cached: the same for every
        request of a client until the policy or the UTC day changes)."""
        day = int(self.clock() // SECONDS_PER_DAY)
        key = (id(policy), caller.id, caller.identity.team, day)
        cached = self._plans.get(key)
        if cached is not None and cached[0] is policy:
            return cached[1]
        plan = _build_plan(policy, caller, _periods(day * SECONDS_PER_DAY))
        if len(self._plans) >= MAX_PLANS:
            self._plans.clear()
        self._plans[key] = (policy, plan)
        return plan

    async def admit(
        self,
        policy: LimitsPolicy,
        caller: Caller,
        estimate: int,
        *,
        count: bool = True,
        reads: Sequence[str] = (),
        mark: Mark | None = None,
    ) -> Admission:
        """Take one request and ``estimate`` tokens from every window of ``caller`` (``count``
        false: only read them) and read the spend of every budget; read ``reads`` (keys of the
        call's context and result cache; ``mark``: the session call's pending-write mark, read and
        added) in the same round trip (``Admission.read``)."""
        if not policy.active:
            return Admission(caller)
        plan = self._plan(policy, caller)
        hits = [
            (window, (1 if kind == "requests" else min(estimate, window.limit)) if count else 0)
            for _, kind, window in plan.windows
        ]
        spent_keys = plan.spend_keys if not count else plan.budget_keys
        if hits or spent_keys or reads:
            states, spent, read = await self._run(hits, spent_keys, reads, mark)
        else:  # no window, no budget and nothing to read (limits only for others): no round trip
            states, spent, read = [], [], None
        spent_by_key = dict(zip(spent_keys, spent, strict=True))
        return Admission(
            caller,
            tuple(
                Limited(scope, kind, window, cost, state)
                for (scope, kind, window), (_, cost), state in zip(plan.windows, hits, states, strict=True)
            ),
            tuple(
                Budget(scope, period, key, limit, spent_by_key[key] / MICRO)
                for scope, period, key, limit in plan.budgets
            ),
            plan.spend_keys,
            estimate,
            read,
        )

    async def settle(self, admission: Admission, tokens: int, cost_usd: float) -> None:
        """Correct the token reservation with the tokens used; add the cost to every budget."""
        corrections = [(w.window, tokens - w.cost) for w in admission.windows if w.kind == "tokens"]
        micro = round(cost_usd * MICRO)
        spend = [(key, micro) for key in admission.spend_keys] if micro > 0 else []
        if not any(delta for _, delta in corrections) and not spend:
            return
        if not self.degraded:
            try:
                await self.counters.settle(corrections, spend)
                return
            except (RedisError, OSError) as exc:
                self._fail(exc)
        await self.local.settle(corrections, spend)

    def settle_later(self, admission: Admission, tokens: int, cost_usd: float) -> None:
        """``settle`` in the background: the answer does not wait for it; ``aclose`` does."""
        task = asyncio.create_task(self.settle(admission, tokens, cost_usd))
        self._settling.add(task)
        task.add_done_callback(self._settling.discard)

    async def settled(self) -> None:
        """Wait for the settles under way."""
        while self._settling:
            await asyncio.wait(list(self._settling))

    async def aclose(self) -> None:
        await self.settled()
        await self.counters.aclose()
        if self.local is not self.counters:
            await self.local.aclose()
