"""One module call for a caller: identity -> limits -> pipeline (a composite's steps included) ->
metrics, cost, settlement, feedback record, review.

Every input is explicit (``ModuleCall``: who asks and what, ``Services``: what the process holds);
what the request's log line reports comes back as a ``CallReport``.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import structlog

from proxy.clients import Caller
from proxy.compose.run import Composer
from proxy.context.identity import (
    SESSION_HEADER,
    USER_HEADER,
    Identity,
    IdentityError,
    check_id,
    namespace_of,
)
from proxy.context.prefetch import Prefetched, ReadThrough, planned_identity, planned_reads
from proxy.context.sanitise import NameMatcher
from proxy.context.step import CallerContext
from proxy.context.store import ClientQuota, ContextStore, Mark, QuotaStore
from proxy.contract.errors import Code, Origin, error_envelope
from proxy.media.step import MediaEnv
from proxy.module.model import Module
from proxy.observability.metrics import OUTCOME_INVALID_INPUT, Metrics
from proxy.pipeline import Listener, ModuleAnswer, ModuleRun, finished, internal_error, run_module
from proxy.policy.model import Policy
from proxy.review import review_record
from proxy.service.instrument import record_module_answer, record_module_cost
from proxy.service.records import answer_record, review_facts
from proxy.service.runtime import Runtime
from proxy.service.shadow import ShadowJudge
from proxy.service.spans import traced_module
from proxy.state.feedback import FeedbackStore
from proxy.upstream.router import Router

log = structlog.get_logger("proxy.api")

BYPASS_DIRECTIVES = frozenset({"no-cache", "no-store"})


class Limits(Protocol):
    """The caller's limits for this call (``proxy.api.limits.CallLimits``)."""

    async def admit(
        self,
        policy: Policy,
        value: Any,
        reads: Sequence[str] = (),
        pending: Mapping[str, bytes] | None = None,
        mark: Mark | None = None,
    ) -> int | None:
        """Count the call (once); raise the edge's 429 when it does not fit. Returns the rung a
        downgraded call is capped at. ``reads``: context-store keys to read in the same round
        trip (``mark``: the session call's pending-write mark, read and added with them), kept
        with ``pending`` (the writes the read may not see) as ``prefetched``."""

    @property
    def prefetched(self) -> Prefetched | None:
        """What the first admission read of the call's keys; None: not read (no limits in
        Redis, or Redis could not be asked)."""

    def settle(self, tokens: int, cost_usd: float) -> None:
        """Settle what the call spent, without the answer waiting for it."""


@dataclass(frozen=True, slots=True)
class Requester:
    """Who asks, as the edge parsed the request: the caller's identity, the client key (only to
    forward it), the trace id and the raw context headers."""

    caller: Caller
    client_key: str | None
    trace_id: str
    session: str = ""
    """``X-Cognitive-Session``, stripped (checked by the service)."""
    user: str = ""
    """``X-Cognitive-User``, stripped (checked by the service)."""
    cache_control: str = ""


@dataclass(frozen=True, slots=True)
class Services:
    """What the process holds for module calls."""

    metrics: Metrics
    router: Router
    context_store: ContextStore
    redact: NameMatcher
    feedback: FeedbackStore
    shadow: ShadowJudge | None = None
    """Verdicts without humans (``feedback.shadow``); None: never judged."""
    edge_errors: tuple[type[Exception], ...] = ()
    """Exceptions that are the edge's own answers (a busy memory budget: 503): raised as they are,
    never turned into E4000."""


@dataclass(frozen=True, slots=True)
class ModuleCall:
    """One module call: what is asked, by whom, on which runtime."""

    runtime: Runtime
    module: Module
    value: Any
    requester: Requester
    limits: Limits
    media: MediaEnv = field(default_factory=MediaEnv)
    check_input: bool = True
    """False for plain-text input: the input schema is skipped."""
    input_checked: bool = False
    """True when the edge ran the input check already (``ModuleRun.input_checked``)."""
    listener: Listener | None = None
    """Set when the call streams (``proxy.api.streaming``)."""
    history: Sequence[Mapping[str, Any]] = ()
    """The earlier messages of a chat-style call (``conversation_history``)."""
    tools: tuple[Mapping[str, Any], ...] = ()


@dataclass(frozen=True, slots=True)
class CallReport:
    """What the request's log line and metrics say about the call."""

    module: str
    outcome: str
    upstream_s: float = 0.0
    fields: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Answered:
    answer: ModuleAnswer
    report: CallReport


def caller_context(
    requester: Requester, runtime: Runtime, services: Services, history: Sequence[Mapping[str, Any]] = ()
) -> CallerContext:
    """The caller's context identity: the client key's hash, ``X-Cognitive-Session`` and
    ``X-Cognitive-User``; ``Cache-Control: no-cache`` bypasses the result cache. Raises
    ``IdentityError`` for an id that is not an opaque short name."""
    identity = Identity(
        namespace_of(requester.caller.id),
        check_id(requester.session, SESSION_HEADER),
        check_id(requester.user, USER_HEADER),
    )
    directives = {d.strip().lower() for d in requester.cache_control.split(",")}
    cache = runtime.policy.cache
    return CallerContext(
        ReadThrough(
            QuotaStore(services.context_store, ClientQuota(cache.client_max_entries, cache.client_max_bytes))
        ),
        identity,
        history,
        bypass_cache=bool(directives & BYPASS_DIRECTIVES),
        matcher=services.redact,
    )


@dataclass
class Spent:
    """Tokens and cost of a composite's steps, settled with the request's own."""

    tokens: int = 0
    usd: float = 0.0


def _step_runner(
    call: ModuleCall, services: Services, spent: Spent
) -> Callable[[ModuleRun], Awaitable[ModuleAnswer]]:
    """``run_module`` for the steps of a composite, each recorded like a module answer of its own
    (metrics, cost, review); the composite's own call is recorded once, by ``answer_module``."""
    top, policy, metrics = call.module, call.runtime.policy, services.metrics
    who = call.requester.caller

    async def run(step: ModuleRun) -> ModuleAnswer:
        answer = await traced_module(step.module, run_module(step))  # a child span of the composite's
        if step.module.name != top.name:
            record_module_answer(metrics, policy, answer)
            spent.tokens += record_module_cost(metrics, policy, answer, who.label)
            spent.usd += answer.cost.usd
            metrics.composition_steps.labels(top.name, step.module.name, answer.decision).inc()
            if answer.decision == "review":
                await call.runtime.review.submit(
                    review_record(
                        step.module.name,
                        step.module.tier,
                        step.trace_id,
                        answer.decision,
                        answer.envelope,
                        who.id,
                        review_facts(answer),
                    )
                )
        return answer

    return run


async def _run(
    call: ModuleCall, services: Services, context: CallerContext, top_rung: int | None, spent: Spent
) -> ModuleAnswer:
    """The module call (a composite's steps included), with any unexpected exception turned into
    E4000 (logged with its trace id)."""
    runtime, module, trace_id = call.runtime, call.module, call.requester.trace_id
    try:
        pipeline_call = ModuleRun(
            module,
            call.value,
            runtime.policy,
            runtime.providers,
            services.router,
            trace_id,
            call.requester.client_key,
            call.check_input,
            call.listener,
            context,
            top_rung=top_rung,
            media=call.media,
            tools=call.tools,
            input_checked=call.input_checked,
        )
        if module.is_composite:
            runner = _step_runner(call, services, spent)
            return await Composer(runtime.registry.modules, runner).run(pipeline_call)
        return await run_module(pipeline_call)
    except services.edge_errors:
        raise
    except Exception:  # asyncio.CancelledError is a BaseException and passes through
        log.exception("proxy.internal_error", module=module.name, trace_id=trace_id)
        return finished(internal_error(module), trace_id)


async def _admit(call: ModuleCall, context: CallerContext) -> int | None:
    """The limits check, with the keys the call will read from the context store (its context,
    its result-cache entry) and its session's pending-write mark in the same round trip: one
    round trip to Redis before the model is asked (``proxy.context.prefetch``). Returns the rung
    a downgraded call is capped at."""
    policy, store = call.runtime.policy, context.store
    # without limits the pipeline reads them (``read_ahead``): no round trip to share
    reads = planned_reads(call.module, call.value, context, policy) if policy.limits.active else ()
    mark = None
    if reads and isinstance(store, ReadThrough) and call.limits.prefetched is None:  # not admitted yet
        mark = store.plan_mark(planned_identity(call.module, call.value, context), sent=True)
    pending = store.pending(reads)  # before the read is sent: what it cannot see yet
    try:
        top_rung = await call.limits.admit(policy, call.value, reads, pending, mark)
        prefetched = call.limits.prefetched
        if prefetched is not None and prefetched.keys == reads and isinstance(store, ReadThrough):
            store.hold(prefetched)
            await store.wait_for_writes()  # the client may leave meanwhile
    except BaseException:  # refused (429) or cancelled: no write will follow the mark
        _release(context)
        raise
    return top_rung


def _release(context: CallerContext) -> None:
    """The call's pending-write mark goes, after every write the call queued."""
    if isinstance(context.store, ReadThrough):
        context.store.release()


@dataclass(frozen=True, slots=True)
class Admitted:
    """A call admitted before it runs (``admit_call``): its caller context, whose store holds what
    the admission read (and the session's pending-write mark), and the rung it is capped at."""

    context: CallerContext
    top_rung: int | None


async def admit_call(call: ModuleCall, services: Services) -> Admitted | None:
    """Admit ``call`` before it runs, its reads in the check's round trip (a streamed call, at
    the edge: a 429 is still an HTTP answer); ``answer_module`` then runs it with the returned
    admission. None: the caller's ids are refused (by ``answer_module``, the call counted)."""
    try:
        context = caller_context(call.requester, call.runtime, services, call.history)
    except IdentityError:
        await call.limits.admit(call.runtime.policy, call.value)
        return None
    return Admitted(context, await _admit(call, context))


async def answer_module(call: ModuleCall, services: Services, admitted: Admitted | None = None) -> Answered:
    """Run one module call and record it (metrics, cost, limits, feedback, review when so
    decided). ``admitted``: what ``admit_call`` returned for it (the call is not admitted again)."""
    module, runtime, requester = call.module, call.runtime, call.requester
    if admitted is not None:
        context, top_rung = admitted.context, admitted.top_rung
    else:
        try:
            context = caller_context(requester, runtime, services, call.history)
        except IdentityError as exc:
            envelope = error_envelope(Code.INVALID_INPUT, str(exc))
            refused = finished(ModuleAnswer(module, envelope, "reject", Origin.CALLER), requester.trace_id)
            return Answered(refused, CallReport(module.name, OUTCOME_INVALID_INPUT))
        top_rung = await _admit(call, context)
    spent = Spent()
    try:
        answer = await traced_module(module, _run(call, services, context, top_rung, spent))
    finally:  # the session's writes are queued (an accepted answer's), or there are none
        _release(context)
    fields: dict[str, Any] = {} if answer.cache is None else {"cache": answer.cache}
    fields.update(
        tier=module.tier,
        decision=answer.decision,
        confidence=answer.meta.get("confidence"),
        risk=answer.meta.get("risk"),
        attempts=len(answer.attempts),
        target=answer.answered_by or None,
    )
    outcome = record_module_answer(services.metrics, runtime.policy, answer)
    tokens = record_module_cost(services.metrics, runtime.policy, answer, requester.caller.label)
    call.limits.settle(tokens + spent.tokens, answer.cost.usd + spent.usd)  # a composite's steps too
    remembered = answer_record(answer, module, runtime.policy, requester.trace_id, requester.caller.id)
    if remembered is not None:
        feedback = runtime.policy.feedback
        services.feedback.remember(remembered, feedback.max_entries, feedback.max_per_day)
    if services.shadow is not None:  # in the background: the answer never waits for it
        services.shadow.consider(call, services, answer, remembered)
    if answer.decision == "review":
        await runtime.review.submit(
            review_record(
                module.name,
                module.tier,
                requester.trace_id,
                answer.decision,
                answer.envelope,
                requester.caller.id,
                review_facts(answer),
            )
        )
    return Answered(answer, CallReport(module.name, outcome, answer.upstream_s, fields))
