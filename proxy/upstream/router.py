"""The one retry loop: targets of a rung in failover order, retries with backoff, breakers.

For each target (skipped while its breaker is open):
  try -> success: return | failure: retry on the same target when the failure kind is in
  ``retry_on``, retries are left, the retry budget allows it (the first ``min_per_target``
  retries on the target always; later ones while the shared budget has room) and the wait
  fits the deadline (wait = exponential backoff with full jitter, or the provider's Retry-After if
  longer, read on every failed attempt) -> otherwise the next target. Targets are visited once, in order: a
  fallback never restarts anything. Provider clients never retry on their own.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Generic, Protocol, TypeVar

from proxy.observability.tracing import CHAT, AttemptSpan, Tracing, active, traced_attempt
from proxy.policy.model import Failover, RetryBudget, Target
from proxy.upstream.base import Provider, ProviderError
from proxy.upstream.breaker import Breakers, Ticket, counts_against_breaker

T = TypeVar("T")
Operation = Callable[[Provider, Target, float], Awaitable[T]]

_RETRY_ON_KIND = {
    "connect": "connect",
    "timeout": "timeout",
    "rate_limited": "429",
    "server_error": "5xx",
    "malformed": "malformed",
}


@dataclass(slots=True)  # built per request: not frozen (a frozen init costs 4x)
class Try:
    """One attempt at a target (or a skip of an open breaker), for attempts lists and logs."""

    target: Target
    latency_ms: float
    error: ProviderError | None = None
    retry: bool = False
    skipped: bool = False
    waited_s: float = 0.0
    """Backoff or Retry-After waited before this try (not proxy overhead, not upstream time)."""


class RungFailed(Exception):
    """Every target of the rung failed (or was skipped). ``failures`` in order of occurrence."""

    def __init__(
        self,
        failures: list[ProviderError],
        *,
        deadline_spent: bool = False,
        final: ProviderError | None = None,
    ) -> None:
        super().__init__(failures[-1].message if failures else "no target")
        self.failures = failures
        self.deadline_spent = deadline_spent
        self.final = final
        """Set when a failure must reach the caller as is (a passthrough client error)."""


@dataclass(slots=True)  # built per request: not frozen (a frozen init costs 4x)
class Routed(Generic[T]):
    value: T
    target: Target


class RetryBudgetTracker:
    """The retry budget: a request's first ``min_per_target`` retries on a target are its own (a
    floor that a burst of failures cannot use up: each failing request brings its own); beyond
    them, Envoy's shared budget: such retries in flight <= max(min_concurrency, percent of requests
    in flight)."""

    def __init__(self) -> None:
        self.requests = 0
        self.retries = 0
        """Shared-budget retries in flight (the floor's are not counted)."""

    def allows_retry(self, budget: RetryBudget, granted: int) -> bool:
        """May a request that was granted ``granted`` retries on this target retry it once more?"""
        if granted < budget.min_per_target:
            return True
        return self.retries < max(budget.min_concurrency, budget.percent / 100 * self.requests)


def _reason(failures: list[ProviderError]) -> str:
    return failures[-1].kind if failures else "unknown"


# A client told to wait longer than this would rather hear "try later" from its own retry policy;
# an upstream's Retry-After of hours (or a bogus one) is not passed on as is.
RETRY_AFTER_CAP_S = 300.0


def real_failures(failures: list[ProviderError]) -> list[ProviderError]:
    """The failures of requests actually sent (breaker skips left out)."""
    return [f for f in failures if f.kind != "circuit_open"]


def retry_after_s(failures: list[ProviderError]) -> float | None:
    """When the caller may try again: the largest upstream ``Retry-After``, else (only breaker
    skips) the time until the first half-open trial; capped by ``RETRY_AFTER_CAP_S``."""
    upstream = [f.retry_after for f in real_failures(failures) if f.retry_after is not None]
    skips = [f.retry_after for f in failures if f.kind == "circuit_open" and f.retry_after is not None]
    value = max(upstream) if upstream else (min(skips) if skips else None)
    return None if value is None else min(value, RETRY_AFTER_CAP_S)


def backoff_s(failover: Failover, retry: int, rng: Callable[[], float]) -> float:
    """Full jitter: uniform in [0, min(max, base * 2**retry)]."""
    return failover.backoff.wait_s(retry, rng)


def retry_wait_s(
    failover: Failover, retry: int, retry_after: float | None, rng: Callable[[], float]
) -> float:
    """The wait before retry ``retry``: the jittered backoff, or the upstream's ``Retry-After``
    plus uniform jitter of up to min(Retry-After, ``backoff.max_ms``) when that is longer. Never
    below Retry-After; the jitter spreads the retries of a burst that got the same Retry-After
    instead of bringing them back in one wave (#29.3)."""
    wait = backoff_s(failover, retry, rng)
    if retry_after is None:
        return wait
    spread = min(retry_after, failover.backoff.max_ms / 1000)
    return max(wait, retry_after + rng() * spread)


@dataclass(slots=True)
class _RungCall(Generic[T]):
    """One ``Router.call``: its fixed inputs and the failures seen so far, in order."""

    rung: Sequence[Target]
    providers: Mapping[str, Provider]
    operation: Operation[T]
    failover: Failover
    deadline: float
    on_try: Callable[[Try], None]
    stop_on_client_error: bool
    bound_attempts: bool
    tracing: Tracing | None
    span: AttemptSpan
    failures: list[ProviderError] = field(default_factory=list)


class RouterObserver(Protocol):
    """Where the router reports what happened (metrics): every try and every failover."""

    def attempt(self, target: Target, latency_s: float, error: ProviderError | None) -> None: ...

    def failover(self, from_target: Target, to_target: Target, reason: str) -> None: ...


async def _bounded(operation: Operation[T], provider: Provider, target: Target, timeout: float) -> T:
    """One attempt within ``timeout``, its answer's body included."""
    try:
        async with asyncio.timeout(timeout):
            return await operation(provider, target, timeout)
    except TimeoutError as exc:
        raise ProviderError("timeout", f"{target} gave no full answer within {timeout:g}s") from exc


def _traced(
    tracing: Tracing,
    run: _RungCall[T],
    provider: Provider,
    target: Target,
    timeout: float,
    retry: int,
    admission: str,
) -> Awaitable[T]:
    """One attempt inside its client span (tracing on)."""
    attempt = (
        _bounded(run.operation, provider, target, timeout)
        if run.bound_attempts
        else run.operation(provider, target, timeout)
    )
    model = None if run.span.url_template is not None else target.model
    kind = provider.config.kind
    return traced_attempt(tracing, run.span, kind, target.provider, model, retry, admission, attempt)


class Router:
    def __init__(
        self,
        breakers: Breakers,
        *,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        rng: Callable[[], float] = random.random,
        observer: RouterObserver | None = None,
    ) -> None:
        self.breakers = breakers
        self.observer = observer
        self.budget = RetryBudgetTracker()
        self._clock = clock
        self._sleep = sleep
        self._rng = rng

    async def call(
        self,
        targets: Sequence[Target],
        providers: Mapping[str, Provider],
        operation: Operation[T],
        failover: Failover,
        deadline: float,
        on_try: Callable[[Try], None],
        *,
        stop_on_client_error: bool = False,
        bound_attempts: bool = True,
        span: AttemptSpan = CHAT,
    ) -> Routed[T]:
        """Run ``operation`` on the first target that answers; raise ``RungFailed``.

        Each attempt is bounded by ``per_try_s`` (and what is left of ``deadline``) as a whole, its
        answer's body included, not only between reads: a body dripping a byte at a time fails it.
        ``bound_attempts=False`` leaves the whole-attempt bound to the operation (a streamed
        upload, whose sending time is the client's). With tracing on, each attempt runs in a
        client span named and described by ``span``."""
        run = _RungCall(
            targets,
            providers,
            operation,
            failover,
            deadline,
            on_try,
            stop_on_client_error,
            bound_attempts,
            active(),
            span,
        )
        self.budget.requests += 1
        try:
            for index, target in enumerate(targets):
                result = await self._target(run, target)
                if result is not None:
                    return result
                if self._clock() >= deadline:
                    raise RungFailed(run.failures, deadline_spent=True)
                if self.observer is not None and index + 1 < len(targets):
                    self.observer.failover(target, targets[index + 1], _reason(run.failures))
            raise RungFailed(run.failures)
        finally:
            self.budget.requests -= 1

    async def _admit(self, target: Target, failover: Failover, deadline: float) -> Ticket:
        trial_ttl = min(failover.timeouts.per_try_s, max(deadline - self._clock(), 0.001))
        return await self.breakers.admit(target.state_key, failover.breaker, trial_ttl)

    async def _record(
        self, rung: Sequence[Target], target: Target, ticket: Ticket, failover: Failover, *, failed: bool
    ) -> None:
        # Only a failure can open a breaker, so only a failure asks whether it is the rung's last.
        protect = failed and all(self.breakers.is_open(t.state_key) for t in rung if t != target)
        await self.breakers.record(target.state_key, ticket, failover.breaker, failed=failed, protect=protect)

    async def _target(self, run: _RungCall[T], target: Target) -> Routed[T] | None:
        """Try ``target`` (retrying it while the policy allows); None: go on to the next one."""
        ticket = self.breakers.admit_closed(target.state_key) or await self._admit(
            target, run.failover, run.deadline
        )
        if ticket.admission == "open":
            skipped = ProviderError(
                "circuit_open", f"{target.state_key}: circuit breaker open", retry_after=ticket.retry_in
            )
            run.failures.append(skipped)
            run.on_try(Try(target, 0.0, skipped, skipped=True))
            return None
        provider = run.providers[target.provider]
        retries = 0
        waited = 0.0
        while True:
            remaining = run.deadline - self._clock()
            if remaining <= 0:
                run.failures.append(ProviderError("timeout", "the call's total deadline is spent"))
                raise RungFailed(run.failures, deadline_spent=True)
            started = self._clock()
            retrying = retries > 0
            shared = retries > run.failover.budget.min_per_target
            if shared:
                self.budget.retries += 1
            try:
                per_try = run.failover.timeouts.per_try_s
                # not min(): the builtin's generic argument handling is ~1.5 k instructions a call
                timeout = per_try if per_try < remaining else remaining
                if run.tracing is not None:
                    value = await _traced(
                        run.tracing, run, provider, target, timeout, retries, ticket.admission
                    )
                elif run.bound_attempts:
                    value = await _bounded(run.operation, provider, target, timeout)
                else:  # the operation bounds itself (one coroutine less per attempt)
                    value = await run.operation(provider, target, timeout)
            except ProviderError as exc:
                elapsed = self._clock() - started
                attempt = Try(target, elapsed * 1000, exc, retry=retrying, waited_s=waited)
                await self._failed(run, ticket, exc, attempt, elapsed)
                wait = self._retry_wait(run, exc, retries, trial=ticket.admission == "trial")
                if wait is None:
                    return None
                await self._sleep(wait)
                ticket = await self._admit(target, run.failover, run.deadline)
                if ticket.admission == "open":
                    return None  # the breaker opened meanwhile: no retry into it
                waited = wait
                retries += 1
                continue
            finally:
                if shared:
                    self.budget.retries -= 1
            elapsed = self._clock() - started
            run.on_try(Try(target, elapsed * 1000, retry=retrying, waited_s=waited))
            if self.observer is not None:
                self.observer.attempt(target, elapsed, None)
            if not self.breakers.record_success(target.state_key, ticket, run.failover.breaker):
                await self._record(run.rung, target, ticket, run.failover, failed=False)
            return Routed(value, target)

    async def _failed(
        self, run: _RungCall[T], ticket: Ticket, exc: ProviderError, attempt: Try, elapsed: float
    ) -> None:
        """Report and count a failed attempt; a client error ends the call when asked to."""
        target = attempt.target
        run.failures.append(exc)
        run.on_try(attempt)
        if self.observer is not None:
            self.observer.attempt(target, elapsed, exc)
        if counts_against_breaker(exc):
            await self._record(run.rung, target, ticket, run.failover, failed=True)
        if exc.kind == "client_error" and run.stop_on_client_error:
            raise RungFailed(run.failures, final=exc) from exc

    def _retry_wait(
        self, run: _RungCall[T], exc: ProviderError, retries: int, *, trial: bool
    ) -> float | None:
        """How long to wait before retrying the same target, or None when it must not be retried:
        a breaker trial, a kind not in ``retry_on``, no retries or retry budget left, or no time."""
        failover = run.failover
        if trial or _RETRY_ON_KIND.get(exc.kind) not in failover.retry_on or retries >= failover.retries:
            return None
        wait = retry_wait_s(failover, retries, exc.retry_after, self._rng)
        if self._clock() + wait >= run.deadline or not self.budget.allows_retry(failover.budget, retries):
            return None
        return wait
