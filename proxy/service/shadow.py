"""Verdicts without humans (``feedback.shadow`` in the policy).

A sampled share of accepted answers of a rung below the judge rung is asked again on the judge
rung in the background, after the client has its answer: the client's answer is never delayed or
changed. Agreement on the module's judged fields (``Module.judged_fields``) is recorded as a
verdict with ``source: shadow`` through the feedback store and ``record_verdict``, like a
``POST /v1/feedback``; a human verdict is never replaced by a shadow one (the two are compared
instead: ``cognitive_shadow_human_agreement_total``).

Yielding to clients, by construction: a sampled answer is queued only once its request's task
has ended (aiohttp runs each request in a task of its own, which ends after the response is
written); one judgement runs at a time, and it starts, and parses and checks its answer
(``ModuleRun.before_check``) and compares, only once no client request has been in flight in the
process for ``QUIET_S`` (``ClientActivity``, counted by the edge). What is left: a request that
arrives during one of those steps waits for that step (a fraction of one module call's work), and
the judge's reply is read from its socket (and JSON-decoded by the provider client) when it comes.
The judge asks the providers through its own
connection pool (``providers``: a pool of one connection), so it never holds a client's slot; its
verdict reaches Redis through the outbox, in the background.

Bounded: ``MAX_PENDING`` judgements waiting (past it a sampled answer is dropped,
``cognitive_shadow_skipped_total{reason="busy"}``); ``aclose`` cancels what is pending. A process
whose clients never leave it idle judges nothing and drops its samples: that is counted, never
paid by a client. The judge spends as the client ``proxy.clients.SHADOW``, settled through the
limiter: capped by ``budget_usd_per_day`` (shared by replicas with ``--redis-url``) and counted
against the global budgets; a judgement may start while the cap is not yet reached, so the day's
spend can pass it by at most one judge call per process.
"""

from __future__ import annotations

import asyncio
import hashlib
import secrets
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

import structlog

from proxy.clients import SHADOW, Caller, ClientIdentity
from proxy.jsonshape import as_dict
from proxy.limits.limiter import Limiter
from proxy.module.model import Module
from proxy.observability.metrics import Metrics
from proxy.pipeline import ModuleAnswer, ModuleRun, run_module
from proxy.policy.limits import LimitSpec, LimitsPolicy
from proxy.policy.model import Policy, Target
from proxy.service.instrument import record_cost, record_shadow_vs_human, record_verdict, total_tokens
from proxy.state.feedback import SHADOW_SOURCE, AnswerRecord, FeedbackStore, with_verdict
from proxy.upstream.base import Provider
from proxy.upstream.router import Router

if TYPE_CHECKING:
    from proxy.service.module_call import ModuleCall, Services

log = structlog.get_logger("proxy.shadow")

MAX_PENDING = 32
"""Judgements waiting (queued, not yet running) at most; past it a sampled answer is dropped."""
QUIET_S = 0.002
"""The judge takes a step once no client request has been in flight for that long: a client that
sends its next request as soon as it has an answer finds the loop free (the judge's step would
otherwise start in that gap)."""
SHADOW_CALLER = Caller(SHADOW, ClientIdentity(SHADOW))
_FRACTION = 2**64


def sample_key(seed: str | None) -> bytes:
    """The key of the sample: from the policy's ``seed`` (the same on every replica), else drawn
    at random. Clients choose trace ids (``X-Request-Id``, ``traceparent``): with an unkeyed hash,
    one could try ids until it found one in the sample and send every call with it."""
    if seed is None:
        return secrets.token_bytes(32)
    return hashlib.sha256(seed.encode()).digest()


def sampled(trace_id: str, rate: float, key: bytes) -> bool:
    """Whether ``trace_id``'s answer is in the judged share: its 8-byte BLAKE2b keyed with ``key``,
    as a fraction of 2^64, below ``rate``."""
    digest = hashlib.blake2b(trace_id.encode(), digest_size=8, key=key).digest()
    return int.from_bytes(digest, "big") / _FRACTION < rate


def judge_rung(
    policy: Policy, module: Module, answer: ModuleAnswer, record: AnswerRecord | None
) -> int | None:
    """The rung that judges ``answer`` (None: not eligible): an accepted answer of a plain module
    without media inputs (a background call holds no request's memory budget), remembered for
    feedback, from a rung below ``feedback.shadow.judge_rung``."""
    shadow = policy.feedback.shadow
    if record is None or module.is_composite or module.takes_media or answer.decision != "accept":
        return None
    if not shadow.judges(module.name):
        return None
    judge = len(policy.ladder) - 1 if shadow.judge_rung is None else policy.rung_index(shadow.judge_rung)
    rung = policy.rung_index(record.rung)
    return judge if judge is not None and rung is not None and rung < judge else None


def judge_policy(policy: Policy, module: Module, judge: int) -> Policy:
    """``policy`` with ``module`` starting on the judge rung and taking its answer whatever its
    confidence and risk (the judge's answer is compared, not decided on)."""
    override = {
        **policy.modules.get(module.name, {}),
        "start": policy.ladder[judge].name,
        "min_confidence": 0.0,
        "max_risk": "high",
        "exhausted": "accept",
    }
    return replace(policy, modules=MappingProxyType({**policy.modules, module.name: override}))


def disagreements(fields: tuple[str, ...], answered: Any, judged: Any) -> list[str]:
    """The judged fields whose values differ between the two answers' ``data``."""
    mine, theirs = as_dict(answered), as_dict(judged)
    return [name for name in fields if mine.get(name) != theirs.get(name)]


def shadow_limits(policy: Policy) -> LimitsPolicy:
    """The judge's own budget line: ``budget_usd_per_day`` for the shadow client, and the policy's
    global budgets (its request and token windows are the clients')."""
    cap = LimitSpec(usd_per_day=policy.feedback.shadow.budget_usd_per_day)
    spend = policy.limits.global_
    shared = (
        None if spend is None else LimitSpec(usd_per_day=spend.usd_per_day, usd_per_month=spend.usd_per_month)
    )
    return LimitsPolicy(clients=MappingProxyType({SHADOW: cap}), global_=shared)


class ClientActivity:
    """Client requests in flight in this process: the edge calls ``enter`` at the start of each
    request while ``watching`` (set once a policy samples an answer for the judge, so a proxy
    that never judges pays one attribute read per request); the count drops when the request's
    task ends, after its response is written."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.watching = False
        self.in_flight = 0
        self.quiet_since = 0.0
        """When the last request in flight ended (``clock``)."""
        self.waiting = 0
        """Coroutines waiting in ``idle`` (a test reads it)."""
        self._clock = clock

    def enter(self) -> None:
        task = asyncio.current_task()
        if task is not None:
            self.in_flight += 1
            task.add_done_callback(self._left)

    def _left(self, _task: object) -> None:
        self.in_flight -= 1
        if not self.in_flight:
            self.quiet_since = self._clock()

    def until_quiet(self) -> float:
        """Seconds until no client request will have been in flight for ``QUIET_S`` (0: now), if
        none starts meanwhile."""
        if self.in_flight:
            return QUIET_S
        return max(0.0, self.quiet_since + QUIET_S - self._clock())

    async def idle(self) -> None:
        """Return once no client request has been in flight for ``QUIET_S``. It looks again at
        most every ``QUIET_S`` (never woken per request), and the caller's next synchronous step
        runs before any other task: no request starts in between."""
        self.waiting += 1
        try:
            while (wait := self.until_quiet()) > 0:
                await asyncio.sleep(wait)
        finally:
            self.waiting -= 1


ProvidersOf = Callable[[Policy], Mapping[str, Provider]]
"""The judge's provider clients for a policy (the app's: on the judge's own connection pool)."""


@dataclass(frozen=True, slots=True)
class _Job:
    """What a judgement needs, kept as the client's call left it: the judge's run is built when
    the judgement starts, never on the client's path."""

    module: Module
    value: Any
    """The client's input."""
    check_input: bool
    policy: Policy
    providers: Mapping[str, Provider]
    """The runtime's (the judge's own pool's replace them when the app gives a factory)."""
    router: Router
    judge: int
    """The judge rung's index."""
    data: Any
    """The client's answer's ``data``."""
    record: AnswerRecord
    feedback: FeedbackStore


class ShadowJudge:
    """The process's background judgements (one per worker), one at a time."""

    def __init__(
        self,
        metrics: Metrics,
        limiter: Limiter,
        activity: ClientActivity | None = None,
        providers: ProvidersOf | None = None,
    ) -> None:
        self._metrics = metrics
        self._limiter = limiter
        self.activity = activity or ClientActivity()
        self._providers_of = providers
        self._queue: deque[_Job] = deque()
        self._running: asyncio.Task[None] | None = None
        self._busy = False
        self._closed = False
        self._limits: tuple[Policy, LimitsPolicy] | None = None
        self._providers: tuple[Policy, Mapping[str, Provider]] | None = None
        self._judged_by: tuple[Policy, dict[tuple[str, int], Policy]] | None = None
        self.started = 0
        """Judgements started (a test reads it)."""
        self._sample_key: tuple[str | None, bytes] = (None, b"")

    @property
    def pending(self) -> int:
        """Judgements queued or running."""
        return len(self._queue) + self._busy

    def _key(self, seed: str | None) -> bytes:
        """The sample's key for ``seed``, derived once per seed (a reload may change it)."""
        if self._sample_key[0] != seed or not self._sample_key[1]:
            self._sample_key = (seed, sample_key(seed))
        return self._sample_key[1]

    def consider(
        self, call: ModuleCall, services: Services, answer: ModuleAnswer, record: AnswerRecord | None
    ) -> None:
        """Queue ``answer``'s judgement when it is eligible and sampled, once the current task (the
        client's request) has ended; returns at once."""
        policy, module = call.runtime.policy, call.module
        judge = judge_rung(policy, module, answer, record)
        shadow = policy.feedback.shadow
        if judge is None or record is None:
            return
        if not sampled(record.trace_id, shadow.rate, self._key(shadow.seed)):
            return
        self.activity.watching = True
        if len(self._queue) >= MAX_PENDING:  # full already: nothing kept for it
            self._metrics.shadow_skipped.labels("busy").inc()
            return
        runtime = call.runtime
        data = answer.envelope.get("data")
        job = _Job(
            module, call.value, call.check_input, policy, runtime.providers, services.router, judge, data,
            record, services.feedback,
        )  # fmt: skip
        task = asyncio.current_task()
        if task is None:
            self._enqueue(job)
        else:
            task.add_done_callback(lambda _: self._enqueue(job))

    def _run_of(self, job: _Job) -> ModuleRun:
        """The judge's module call for ``job``: the judge rung's answer, taken whatever it says."""
        return ModuleRun(
            job.module,
            job.value,
            self._judge_policy(job),
            self._providers_for(job.policy, job.providers),
            job.router,
            trace_id=job.record.trace_id,
            check_input=job.check_input,
            top_rung=job.judge,
            before_check=self.activity.idle,
        )

    def _judge_policy(self, job: _Job) -> Policy:
        """``judge_policy`` of the job's, built once per policy, module and judge rung."""
        if self._judged_by is None or self._judged_by[0] is not job.policy:
            self._judged_by = (job.policy, {})
        key = (job.module.name, job.judge)
        built = self._judged_by[1].get(key)
        if built is None:
            built = self._judged_by[1][key] = judge_policy(job.policy, job.module, job.judge)
        return built

    def _providers_for(self, policy: Policy, runtime: Mapping[str, Provider]) -> Mapping[str, Provider]:
        """The judge's clients for ``policy``, built once per policy (the runtime's without a factory)."""
        if self._providers_of is None:
            return runtime
        if self._providers is None or self._providers[0] is not policy:
            self._providers = (policy, self._providers_of(policy))
        return self._providers[1]

    def _enqueue(self, job: _Job) -> None:
        if self._closed:
            return
        if len(self._queue) >= MAX_PENDING:
            self._metrics.shadow_skipped.labels("busy").inc()
            return
        self._queue.append(job)
        if self._running is None:
            self._running = asyncio.get_running_loop().create_task(self._drain())

    async def _drain(self) -> None:
        """Judge the queue, one at a time, each starting while no client request is in flight."""
        try:
            while self._queue:
                await self.activity.idle()
                job = self._queue.popleft()
                self._busy = True
                try:
                    await self._judge(job)
                finally:
                    self._busy = False
        finally:
            self._running = None

    def _limits_of(self, policy: Policy) -> LimitsPolicy:
        """The judge's limits for ``policy``, built once per policy (the limiter caches plans by it)."""
        if self._limits is None or self._limits[0] is not policy:
            self._limits = (policy, shadow_limits(policy))
        return self._limits[1]

    async def _judge(self, job: _Job) -> None:
        self.started += 1
        try:
            await self._judged(job)
        except asyncio.CancelledError:
            raise
        except Exception:  # a judgement must never take the worker down; it is counted as failed
            log.exception("proxy.shadow_failed", module=job.module.name, trace_id=job.record.trace_id)
            self._metrics.shadow_judgements.labels(job.module.name, "failed").inc()

    async def _judged(self, job: _Job) -> None:
        metrics, module = self._metrics, job.module.name
        admission = await self._limiter.admit(self._limits_of(job.policy), SHADOW_CALLER, 0, count=False)
        if admission.over_budget is not None:
            metrics.shadow_skipped.labels("over_budget").inc()
            return
        answer = await run_module(self._run_of(job))
        tokens = self._spent(job.policy, answer)
        await self._limiter.settle(admission, tokens, answer.cost.usd)
        envelope = answer.envelope
        if answer.final is None or not envelope.get("ok"):
            metrics.shadow_judgements.labels(module, "failed").inc()
            return
        await self.activity.idle()
        differ = disagreements(job.module.judged_fields, job.data, envelope.get("data"))
        await self._record(job, differ, answer.answered_by)

    def _spent(self, policy: Policy, answer: ModuleAnswer) -> int:
        """Meter the judge's attempts (cost by client ``cogproxy-shadow``); returns its tokens."""
        tokens = 0
        for attempt in answer.attempts:
            provider, _, model = attempt.target.partition("/")
            record_cost(
                self._metrics, policy, answer.module.name, Target(provider, model), attempt.usage, SHADOW
            )
            tokens += total_tokens(attempt.usage)
        self._metrics.shadow_spend.inc(answer.cost.usd)
        return tokens

    async def _record(self, job: _Job, differ: list[str], judge: str) -> None:
        metrics, module, record = self._metrics, job.module.name, job.record
        verdict = "incorrect" if differ else "correct"
        current = await job.feedback.get(record.client, record.trace_id)
        if current is None:
            metrics.shadow_judgements.labels(module, "gone").inc()
            return
        metrics.shadow_judgements.labels(module, "disagree" if differ else "agree").inc()
        if current.verdict is not None and current.source != SHADOW_SOURCE:
            record_shadow_vs_human(metrics, module, verdict, current.verdict)  # a human's stays
            return
        note = f"judged by {judge}" + (f"; differs on {', '.join(differ)}" if differ else "")
        judged = with_verdict(current, verdict, 0.0 if differ else 1.0, SHADOW_SOURCE, note)
        await job.feedback.judged(judged)
        record_verdict(metrics, job.policy, judged, current)

    async def aclose(self) -> None:
        """Drop what is queued, cancel the judgement under way and wait for it to end."""
        self._closed = True
        self._queue.clear()
        running = self._running
        if running is not None:
            running.cancel()
            await asyncio.gather(running, return_exceptions=True)
