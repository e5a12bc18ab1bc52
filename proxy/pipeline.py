"""One module call from input to decided envelope.

    input check -> render prompt -> [rung: provider call -> contract -> decide] -> final envelope

The decision uses only ``meta.confidence``, ``meta.risk`` and the tier's thresholds; ``meta.risk``
is first set from the policy's ``risk_source`` (the model's risk, the module's ``risk_rule`` over
the data, or the higher of the two). A contract failure is an envelope with confidence 0.0 and
escalates like any other weak answer. A provider failure moves the call to the next rung; when no
rung is left the answer is E4001 (E4002 when every failure was a rate limit), or E2002 when the
call's deadline ran out while a target was still answering.

Every answer records its ``Origin``: the HTTP status comes from who produced the final envelope,
never from a code the model wrote.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field, replace
from functools import partial
from typing import Any, Protocol

from proxy.context import cache
from proxy.context.prefetch import read_ahead
from proxy.context.step import CallerContext, Prepared, emit, prepare
from proxy.context.used import ContextUsed
from proxy.contract.engine import ContractResult, allowed_partial, run_contract_off_loop
from proxy.contract.errors import EXPLAIN_MAX, Code, Origin, error_envelope
from proxy.contract.inputs import check_input
from proxy.contract.repair import Repair
from proxy.contract.risk import Risk, RiskSource, routed_risk, rule_risk
from proxy.jsonshape import as_dict
from proxy.media.model import Media
from proxy.media.parts import user_content
from proxy.media.resolve import replaced, stubbed, validation_meta
from proxy.media.step import MediaEnv, capable, prepare_media, unsupported
from proxy.module.model import Module
from proxy.module.prompt import render_prompt
from proxy.module.tools import denied_tool_calls, network_violation, permitted_tools
from proxy.observability.tracing import (
    active,
    contract_attributes,
    found_attributes,
    media_attributes,
    note_exchange,
    traced,
    traced_fetch,
)
from proxy.policy.decide import Decision, Meta, decide
from proxy.policy.model import Policy, Target, Thresholds
from proxy.upstream.base import (
    CallInfo,
    Provider,
    ProviderError,
    content_of,
    finish_reason_of,
    usage_of,
)
from proxy.upstream.router import Routed, Router, RungFailed, Try, real_failures, retry_after_s
from proxy.upstream.streamed import stream_completion


class Listener(Protocol):
    """Sees a module call as it happens (the streaming edge); the decision never depends on it."""

    def attempt(self) -> None:
        """A provider attempt starts: text seen so far (a failed try) is void."""

    def text(self, piece: str) -> bool:
        """A piece of the model's answer, as the provider streams it; True when it became a delta
        of a streamed field (the caller sees it)."""

    def retrying(self, stage: str, from_rung: str, to_rung: str, reason: str) -> None:
        """The answer just seen is set aside: ``stage`` is ``escalating`` or ``reasking``."""


# Bounds on text the proxy writes from provider and contract messages (never from a size the
# model chooses): a provider error in ``cognitive.attempts``, the violations quoted in a re-ask
# prompt (enough to fix, short enough not to crowd the answer), the message of E4001/E4002 and
# of a denied tool call.
ATTEMPT_ERROR_MAX = 300
REASK_VIOLATIONS_MAX = 20
NO_ANSWER_MESSAGE_MAX = 1000

Calibrate = Callable[[float], float]


@dataclass(frozen=True, slots=True)
class Attempt:
    """One provider call made for a module answer, as reported in the ``cognitive`` block."""

    rung: str
    target: str
    outcome: str
    confidence: float | None = None
    risk: str | None = None
    latency_ms: float = 0.0
    error: str | None = None
    repairs: tuple[str, ...] = ()
    usage: Mapping[str, Any] = field(default_factory=dict)
    model_risk: str | None = None
    """``meta.risk`` as the model (or the repair pass) gave it."""
    rule_risk: Risk | None = None
    """The module's ``risk_rule`` over the data; None when the rule cannot say."""
    cost_usd: float = 0.0
    """The attempt's usage at its target's ``price`` (0 when unpriced)."""
    calibrated: float | None = None
    """``confidence`` through the policy's calibration map of the target: what was decided on."""

    @property
    def risks_disagree(self) -> bool:
        return self.rule_risk is not None and self.model_risk != self.rule_risk

    def as_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "rung": self.rung,
            "target": self.target,
            "outcome": self.outcome,
            "confidence": self.confidence,
            "risk": self.risk,
            "latency_ms": round(self.latency_ms, 3),
        }
        if self.confidence is not None:  # an answer, not a provider failure
            out["model_risk"] = self.model_risk
            out["rule_risk"] = self.rule_risk
            out["confidence_calibrated"] = self.calibrated
        if self.error:
            out["error"] = self.error
        if self.repairs:
            out["repairs"] = list(self.repairs)
        if self.usage:
            out["usage"] = dict(self.usage)
            out["cost_usd"] = self.cost_usd
        return out


@dataclass(frozen=True, slots=True)
class Cost:
    """What a module call cost, and what it would have cost straight on the top rung."""

    usd: float = 0.0
    """Every attempt of the call."""
    escalated_usd: float = 0.0
    """The attempts that were escalated away from (and re-asked answers)."""
    counterfactual_usd: float | None = None
    """The final answer's usage at the top rung's price; None when the top rung is unpriced or no
    answer came back."""

    @property
    def savings_usd(self) -> float | None:
        """What the ladder saved against the top rung (negative: escalation cost more)."""
        return None if self.counterfactual_usd is None else self.counterfactual_usd - self.usd

    def as_dict(self) -> dict[str, Any]:
        savings = self.savings_usd
        return {
            "usd": round(self.usd, 9),
            "escalated_usd": round(self.escalated_usd, 9),
            "counterfactual_usd": None
            if self.counterfactual_usd is None
            else round(self.counterfactual_usd, 9),
            "savings_usd": None if savings is None else round(savings, 9),
        }


def call_cost(policy: Policy, attempts: tuple[Attempt, ...]) -> Cost:
    """The ``Cost`` of a call from its attempts' usage and the policy's prices."""
    total = sum(a.cost_usd for a in attempts)
    answered = [a for a in attempts if a.confidence is not None]
    if not answered:
        return Cost(total, total)
    final = answered[-1]
    top = policy.ladder[-1].targets[0]
    price = policy.price_of(str(top))
    counterfactual = None if price is None else price.cost(final.usage)
    return Cost(total, total - final.cost_usd, counterfactual)


@dataclass(frozen=True, slots=True)
class ModuleAnswer:
    """The decided answer and everything the edge reports about it."""

    module: Module
    envelope: dict[str, Any]
    decision: str
    """accept | escalated (accepted on a later rung) | review | reject"""
    origin: Origin
    """Who produced ``envelope``: the one input of the HTTP status besides its code."""
    attempts: tuple[Attempt, ...] = ()
    model: str | None = None
    repairs: tuple[Repair, ...] = ()
    retry_after: float | None = None
    usage: Mapping[str, int] = field(default_factory=dict)
    upstream_s: float = 0.0
    """Time spent waiting on providers (tries and backoff), for the overhead metric."""
    emitted: dict[str, Any] | None = None
    """The decided answer's valid ``_emitted_context`` (from the contract engine)."""
    cache: str | None = None
    """hit | miss | bypass when the module's answers are cached; None otherwise."""
    saved_tokens: int = 0
    """Tokens a cache hit did not spend (those of the cached answer)."""
    redacted: tuple[str, ...] = ()
    """Paths of ``_context`` values redacted before the model saw them."""
    cost: Cost = Cost()
    downgraded: bool = False
    """The ladder was capped (``limits.on_budget: downgrade``)."""
    steps: tuple[Step, ...] = ()
    """A composite's step answers (composition, ``@call``), in the order they ran."""
    stripped_tools: tuple[str, ...] = ()
    """Client tools the module's ``tools`` policy kept out of the provider request."""
    context: ContextUsed | None = None
    """The context types the model was shown and their sources (None: the call stopped before)."""

    @property
    def meta(self) -> dict[str, Any]:
        return as_dict(self.envelope.get("meta"))

    @property
    def final(self) -> Attempt | None:
        """The attempt whose answer was decided last (None when no model answered)."""
        for attempt in reversed(self.attempts):
            if attempt.confidence is not None:
                return attempt
        return None

    def cognitive(self) -> dict[str, Any]:
        """The ``cognitive`` block (docs/http-api.md, *Module mode over chat*); a composite's
        steps nest in its attempts."""
        block = {
            "module": self.module.name,
            "tier": self.module.tier,
            "decision": self.decision,
            "meta": self.meta,
            "attempts": [a.as_dict() for a in self.attempts]
            + [{"step": s.name, **s.answer.cognitive()} for s in self.steps],
            "cost": {**self.cost.as_dict(), "downgraded": self.downgraded},
        }
        if self.context is not None:
            block["context"] = self.context.as_list()
        return block

    @property
    def answered_by(self) -> str:
        """The ``provider/model`` that produced the decided answer: its own; for a composite, the
        last step's that has one (every step's is in ``cognitive.attempts``); "" when none did."""
        if self.model:
            return self.model
        return next((s.answer.answered_by for s in reversed(self.steps) if s.answer.answered_by), "")

    def total_usd(self) -> float:
        """The cost of this answer and of every nested step."""
        return self.cost.usd + sum(s.answer.total_usd() for s in self.steps)

    def all_attempts(self) -> int:
        """Provider attempts of this answer and of every nested step."""
        return len(self.attempts) + sum(s.answer.all_attempts() for s in self.steps)


@dataclass(frozen=True, slots=True)
class Step:
    """One step of a composite: the name it ran under and its full module answer."""

    name: str
    answer: ModuleAnswer


@dataclass(frozen=True, slots=True)
class ModuleRun:
    """The fixed inputs of one module call."""

    module: Module
    input: Any
    policy: Policy
    providers: Mapping[str, Provider]
    router: Router
    trace_id: str = ""
    client_key: str | None = None
    check_input: bool = True
    """False for plain-text input: the input schema is skipped; size and depth are still checked."""
    listener: Listener | None = None
    """Set when the answer streams: providers are asked for a stream and the listener sees it."""
    context: CallerContext | None = None
    """The caller's context store and identity (None: no context is built or stored)."""
    top_rung: int | None = None
    """Cap the ladder at this rung (start there at most): ``limits.on_budget: downgrade``."""
    media: MediaEnv = field(default_factory=MediaEnv)
    """The request's memory budget and the fetched-media cache, for the media step."""
    injected: Mapping[str, Any] | None = None
    """Step answers by name, for ``{{name.meta.risk}}`` in the prompt (composites)."""
    tools: tuple[Mapping[str, Any], ...] = ()
    """The client's tools; only those the module's ``tools`` policy permits are sent."""
    input_checked: bool = False
    """True when the caller ran ``input_error`` on this input already (a stream does, before it
    opens, so that a bad input keeps its 400): the pipeline does not run it again."""
    before_check: Callable[[], Awaitable[None]] | None = None
    """Awaited after a provider answered and before its answer is parsed and checked, outside
    the attempt's timeout: the shadow judge waits there until no client request is in flight."""


def _reject(
    thresholds: Thresholds, decision: Decision, envelope: dict[str, Any], module: Module
) -> dict[str, Any]:
    meta = as_dict(envelope.get("meta"))
    explain = f"Rejected by policy: {decision.reason}"[:EXPLAIN_MAX]
    return error_envelope(
        Code.LOW_CONFIDENCE,
        f"Module {module.name!r} ({module.tier} tier) answer rejected: {decision.reason}",
        explain=explain,
        meta={
            "confidence": meta.get("confidence", 0.0),
            "risk": meta.get("risk", "high"),
            "explain": explain,
        },
        details={"min_confidence": thresholds.min_confidence, "max_risk": thresholds.max_risk},
        partial_data=allowed_partial(module, _last_data(envelope)),
    )


def _last_data(envelope: dict[str, Any] | None) -> Any:
    if envelope is None:
        return None
    return envelope.get("data") if envelope.get("ok") else envelope.get("partial_data")


def _out_of_time(failures: list[ProviderError], deadline_spent: bool) -> bool:
    """E2002 rather than E4001: the deadline ran out while a target was still answering."""
    return deadline_spent and bool(failures) and failures[-1].kind == "timeout"


def _no_answer(
    failures: list[ProviderError], deadline_spent: bool, module: Module, last: dict[str, Any] | None
) -> tuple[dict[str, Any], float | None]:
    """The envelope when no rung produced a decided answer, and its Retry-After (providers only)."""
    if _out_of_time(failures, deadline_spent):
        envelope = error_envelope(
            Code.TIMEOUT,
            "The call's total deadline ran out while a provider was still answering",
            partial_data=allowed_partial(module, _last_data(last)),
        )
        return envelope, None
    sent = real_failures(failures)  # breaker skips left out: the message names a real failure
    rate_limited = bool(sent) and all(f.kind == "rate_limited" for f in sent)
    code = Code.RATE_LIMITED if rate_limited else Code.PROVIDER_UNAVAILABLE
    if sent:
        message = sent[-1].message
    elif failures:
        message = "every target's circuit breaker is open"
    else:
        message = "no provider target is configured"
    envelope = error_envelope(code, f"Every provider target failed; last: {message}"[:NO_ANSWER_MESSAGE_MAX])
    return envelope, retry_after_s(failures) or 1.0


def refused_by_policies(module: Module, value: Any) -> dict[str, Any] | None:
    """E4007 when the input asks for what the module's ``policies`` deny (a network URL)."""
    where = network_violation(module, value)
    if where is None:
        return None
    return error_envelope(
        Code.PERMISSION_DENIED,
        f"Module {module.name!r} declares policies.network: deny; {where} is a network URL",
        suggestion="Send the content inline (base64 or text) instead of a URL",
    )


def internal_error(module: Module) -> ModuleAnswer:
    """E4000 for an unexpected exception inside a module call (the cause goes to the log)."""
    envelope = error_envelope(Code.INTERNAL_ERROR, "Internal error in the proxy while running the module")
    return ModuleAnswer(module, envelope, "reject", Origin.RUNTIME)


def finished(answer: ModuleAnswer, trace_id: str) -> ModuleAnswer:
    """``answer`` with ``trace_id`` in its meta (a new envelope: the answer is not edited)."""
    meta = answer.envelope.get("meta")
    if not isinstance(meta, dict):
        return answer
    return replace(answer, envelope={**answer.envelope, "meta": {**meta, "trace_id": trace_id}})


def _finish(
    answer: ModuleAnswer,
    prepared: Prepared,
    started: float,
    trace_id: str,
    *,
    emitted: dict[str, Any] | None = None,
    warnings: list[str] | None = None,
) -> ModuleAnswer:
    """The finishing step, the one place a module answer's final envelope is built (a new dict:
    the decided envelope, possibly the cached one, is never edited): what the emit step gave the
    client (``_emitted_context``), the context step's warnings (and ``warnings``), the trace id,
    the model and the call's latency. Nothing changes the envelope after it."""
    envelope = dict(answer.envelope)
    if emitted:
        envelope["_emitted_context"] = emitted
    every = prepared.warnings + (warnings or [])
    if every:
        envelope["_warnings"] = every
    meta = envelope.get("meta")
    if isinstance(meta, dict):
        meta = envelope["meta"] = dict(meta)
        if trace_id:
            meta["trace_id"] = trace_id
        if answer.model:
            meta["model"] = answer.model
        meta["latency_ms"] = round((time.perf_counter() - started) * 1000, 3)
    return replace(answer, envelope=envelope, context=prepared.used)


def build_messages(
    module: Module, value: Any, media: tuple[Media, ...] = (), injected: Mapping[str, Any] | None = None
) -> list[dict[str, Any]]:
    """System and user messages; media follow the user's text as provider parts and the input
    shows their descriptions instead of their bytes; ``injected``: a composite's step answers."""
    prompt = render_prompt(module, replaced(value, media) if media else value, media, injected)
    return [
        {"role": "system", "content": prompt.system},
        {"role": "user", "content": user_content(prompt.user, media)},
    ]


def _meta_of(envelope: dict[str, Any]) -> Meta:
    meta = as_dict(envelope.get("meta"))
    confidence = meta.get("confidence")
    value = (
        float(confidence)
        if isinstance(confidence, (int, float)) and not isinstance(confidence, bool)
        else 0.0
    )
    return Meta(value, str(meta.get("risk", "high")))


@dataclass(frozen=True, slots=True)
class _Assessed:
    meta: Meta
    """What ``decide()`` sees: the calibrated confidence and the routed risk."""
    model_risk: str
    rule_risk: Risk | None
    reported: float
    """``meta.confidence`` as the model reported it (the envelope keeps this one)."""


def _assess(result: ContractResult, module: Module, source: RiskSource, calibrate: Calibrate) -> _Assessed:
    """The meta the router decides on: ``meta.risk`` is the ``risk_source`` choice; the confidence
    goes through the target's calibration map (the envelope keeps the model's)."""
    envelope = result.envelope
    meta = _meta_of(envelope)
    computed = rule_risk(envelope.get("data"), module.risk_rule) if envelope.get("ok") is True else None
    routed = routed_risk(meta.risk, computed, source)
    return _Assessed(Meta(calibrate(meta.confidence), routed), meta.risk, computed, meta.confidence)


def _routed(result: ContractResult, assessed: _Assessed) -> ContractResult:
    """``result`` with the risk that was routed on in its envelope's ``meta.risk`` (a new
    envelope), so that the caller sees it."""
    meta = result.envelope.get("meta")
    if assessed.meta.risk == assessed.model_risk or not isinstance(meta, dict):
        return result
    return replace(result, envelope={**result.envelope, "meta": {**meta, "risk": assessed.meta.risk}})


def reask_messages(messages: list[dict[str, Any]], text: str, result: ContractResult) -> list[dict[str, Any]]:
    """The conversation for a re-ask: the rejected answer and what was wrong with it."""
    problems = (
        "\n".join(f"- {v}" for v in result.violations[:REASK_VIOLATIONS_MAX]) or "- not a valid envelope"
    )
    return [
        *messages,
        {"role": "assistant", "content": text},
        {
            "role": "user",
            "content": (
                "Your answer did not pass the module contract:\n"
                + problems
                + "\nAnswer again with only the corrected JSON envelope."
            ),
        },
    ]


async def _complete(
    provider: Provider, target: Target, timeout: float, body: dict[str, Any], ctx: CallInfo
) -> tuple[dict[str, Any], str]:
    reply = await provider.complete(body, target.model, ctx, timeout)
    note_exchange(body, reply)
    return reply, content_of(reply)  # no message: a malformed answer, failed over like one


async def _streamed(
    provider: Provider,
    target: Target,
    timeout: float,
    body: dict[str, Any],
    ctx: CallInfo,
    listener: Listener,
) -> tuple[dict[str, Any], str]:
    listener.attempt()
    reply = await stream_completion(provider, body, target.model, ctx, timeout, listener.text)
    note_exchange(body, reply)
    return reply, content_of(reply)


async def _contract(reply: dict[str, Any], text: str, module: Module) -> ContractResult:
    denied = denied_tool_calls(reply, module)
    if denied:  # a violation only the answer shows: the contract fails, like any bad answer
        message = f"The answer calls tools the module denies: {', '.join(denied)}"
        return ContractResult(
            error_envelope(Code.PERMISSION_DENIED, message[:NO_ANSWER_MESSAGE_MAX]),
            error_code=Code.PERMISSION_DENIED,
        )
    checked = run_contract_off_loop(text, module, finish_reason=finish_reason_of(reply))
    return await traced("contract_check", checked, contract_attributes)


class _Attempts:
    """Collects the ``cognitive.attempts`` list: provider failures as they happen, answers
    once their outcome is known."""

    def __init__(self, policy: Policy) -> None:
        self.policy = policy
        self.items: list[Attempt] = []
        self.last_ms = 0.0
        self.upstream_s = 0.0

    def modality_skips(
        self, rung: str, targets: tuple[Target, ...], able: tuple[Target, ...]
    ) -> tuple[Target, ...]:
        """Record the targets of ``rung`` that cannot take the call's media; return the others."""
        for target in targets:
            if target not in able:
                self.items.append(
                    Attempt(rung=rung, target=str(target), outcome="skipped:modality_unsupported")
                )
        return able

    def on_try(self, rung: str) -> Callable[[Try], None]:
        def record(attempt: Try) -> None:
            self.last_ms = attempt.latency_ms
            self.upstream_s += attempt.latency_ms / 1000 + attempt.waited_s
            if attempt.error is not None:
                outcome = "circuit_open" if attempt.skipped else f"provider_error:{attempt.error.kind}"
                self.items.append(
                    Attempt(
                        rung=rung,
                        target=str(attempt.target),
                        outcome=outcome,
                        latency_ms=attempt.latency_ms,
                        error=attempt.error.message[:ATTEMPT_ERROR_MAX],
                    )
                )

        return record

    def record_answer(
        self,
        rung: str,
        target: Target,
        outcome: str,
        assessed: _Assessed,
        result: ContractResult,
        usage: dict[str, Any],
    ) -> None:
        price = self.policy.price_of(str(target))
        self.items.append(
            Attempt(
                rung=rung,
                target=str(target),
                outcome=outcome,
                confidence=assessed.reported,
                risk=assessed.meta.risk,
                latency_ms=self.last_ms,
                error=result.error_code and f"contract:{result.error_code}",
                repairs=tuple(r.kind for r in result.repairs),
                usage=usage,
                model_risk=assessed.model_risk,
                rule_risk=assessed.rule_risk,
                cost_usd=0.0 if price is None else price.cost(usage),
                calibrated=assessed.meta.confidence,
            )
        )


async def run_module(call: ModuleRun) -> ModuleAnswer:
    """Run ``call`` through the ladder and return the decided answer (never raises for
    provider or contract failures: those are envelopes).

        context step -> input check -> media step -> [cache lookup] -> ladder -> [cache save]
        -> emit step
    """
    started = time.perf_counter()
    module, policy = call.module, call.policy
    deadline = time.monotonic() + policy.timeouts.total_s
    await read_ahead(module, call.input, call.context, policy)  # the context and cache keys, at once
    prepared = await traced("context.load", prepare(module, call.input, call.context))
    error, media = await _checked_input(call, prepared, deadline)
    if error is not None:
        answer = ModuleAnswer(module, error, "reject", Origin.CALLER)
        return _finish(answer, prepared, started, call.trace_id)
    thresholds = policy.thresholds_for(module.name, module.tier)
    refused = unsupported(policy, media, policy.start_rung(thresholds))
    if refused is not None:
        answer = ModuleAnswer(module, refused, "reject", Origin.RUNTIME)
        return _finish(answer, prepared, started, call.trace_id)
    rule = cache.rule_for(policy, module) if call.context is not None and prepared.identity else None
    key = version = ""
    state: str | None = None
    if rule is not None and call.context is not None and prepared.identity is not None:
        key = cache.cache_key(prepared.identity, module, prepared.input_hash, prepared.client_digest)
        version = cache.policy_version(thresholds)
        state = cache.BYPASS if call.context.bypass_cache else cache.MISS
        if state == cache.MISS:
            entry = await traced(
                "cache.lookup",
                cache.lookup(call.context.store, key, version, prepared.context_digest),
                found_attributes,
            )
            if entry is not None:
                hit = ModuleAnswer(
                    module,
                    entry.envelope,
                    "accept",
                    Origin.MODEL,
                    model=entry.model,
                    emitted=entry.emitted,
                    cache=cache.HIT,
                    saved_tokens=entry.tokens,
                )
                return await _emit(call, prepared, hit, started)
    answer = await _ladder(call, prepared, thresholds, media, deadline)
    if state is not None:
        answer = replace(answer, cache=state)
    finished_answer = await _emit(call, prepared, answer, started)  # the session's writes first:
    if rule is not None and call.context is not None and answer.decision in rule.only_decisions:
        # queued after them, the entry never delays their acknowledgement. No copy: nothing edits
        # a decided envelope (``_finish`` builds a new one).
        entry = cache.Entry(
            version,
            answer.envelope,
            answer.model,
            dict(answer.usage),
            answer.emitted,
            prepared.context_digest,
        )
        await traced("cache.store", cache.save(call.context.store, key, entry, rule.ttl_s))
    return finished_answer


def input_error(module: Module, value: Any, *, schema: bool = True) -> dict[str, Any] | None:
    """The input check of a module call (``_context`` left out of ``value``): the E1xxx envelope
    for a bad input, or None; a media input is sized with its media stubbed."""
    return check_input(module, value, schema=schema, sized=stubbed if module.takes_media else None)


async def _checked_input(
    call: ModuleRun, prepared: Prepared, deadline: float
) -> tuple[dict[str, Any] | None, tuple[Media, ...]]:
    """The input check, the module's ``policies``, then the media step: the error envelope that
    refuses the call, or the call's validated media (the input is sized with its media stubbed)."""
    module, checked = call.module, prepared.checked_input
    error = prepared.error
    if error is None and not call.input_checked:
        error = input_error(module, checked, schema=call.check_input)
    if error is None:
        error = refused_by_policies(module, checked)  # before any media is fetched
    if error is not None or not module.takes_media:
        return error, ()
    env = call.media if active() is None else replace(call.media, watch=traced_fetch)
    found = await traced(
        "media", prepare_media(module, checked, call.policy.media, deadline, env), media_attributes
    )
    return (found, ()) if isinstance(found, dict) else (None, found)


async def _emit(call: ModuleRun, prepared: Prepared, answer: ModuleAnswer, started: float) -> ModuleAnswer:
    """The emit step: store what an accepted answer emitted; give it (and warnings) to the client."""
    emitted, warnings = await traced(
        "context.store",
        emit(answer.module, call.context, prepared, answer.decision, answer.envelope, answer.emitted),
    )
    answer = replace(answer, redacted=tuple(prepared.redacted))
    return _finish(answer, prepared, started, call.trace_id, emitted=emitted, warnings=warnings)


Asked = Routed[tuple[dict[str, Any], str]]
"""A provider's answer on one target: the reply and its text."""


@dataclass(slots=True)
class _Ladder:
    """One module call's walk down the rungs: what its asks, re-asks and decisions share."""

    call: ModuleRun
    thresholds: Thresholds
    capable: list[tuple[Target, ...]]
    """Per usable rung (the whole ladder, or fewer when capped by ``top_rung``): its targets that
    have the module's required capabilities."""
    media: tuple[Media, ...]
    messages: list[dict[str, Any]]
    extra: dict[str, Any]
    """What every request body carries besides the messages: the permitted client tools."""
    stripped: tuple[str, ...]
    ctx: CallInfo
    deadline: float
    attempts: _Attempts
    failures: list[ProviderError] = field(default_factory=list)
    deadline_spent: bool = False
    last: dict[str, Any] | None = None
    """The last contract envelope seen: its data may become the ``partial_data`` of a failure."""

    @property
    def rungs(self) -> int:
        return len(self.capable)

    def ask(
        self, targets: tuple[Target, ...], conversation: list[dict[str, Any]], rung: str
    ) -> Awaitable[Asked]:
        body = {"messages": conversation, **self.extra}
        ctx, listener = self.ctx, self.call.listener
        operation = (
            partial(_streamed, body=body, ctx=ctx, listener=listener)
            if listener is not None
            else partial(_complete, body=body, ctx=ctx)
        )
        policy = self.call.policy
        return self.call.router.call(
            targets,
            self.call.providers,
            operation,
            policy.failover,
            self.deadline,
            self.attempts.on_try(rung),
        )

    def targets(self, rung: int) -> tuple[Target, ...]:
        """The rung's capable targets that can take the call's media (the others recorded as
        skipped); empty: the rung is skipped like an unavailable one."""
        policy = self.call.policy
        targets = self.capable[rung]
        if not targets or not self.media:
            return targets
        name = policy.ladder[rung].name
        return self.attempts.modality_skips(name, targets, capable(targets, policy, self.media))

    def assess(self, result: ContractResult, target: Target) -> _Assessed:
        calibrate = partial(self.call.policy.calibrate, str(target))
        return _assess(result, self.call.module, self.thresholds.risk_source, calibrate)

    def cost(self) -> Cost:
        return call_cost(self.call.policy, tuple(self.attempts.items))

    @property
    def downgraded(self) -> bool:
        """The ladder was capped below its top rung (``limits.on_budget: downgrade``)."""
        return self.rungs < len(self.call.policy.ladder)


def _start_ladder(
    call: ModuleRun, prepared: Prepared, thresholds: Thresholds, media: tuple[Media, ...], deadline: float
) -> _Ladder:
    module, policy = call.module, call.policy
    rungs = len(policy.ladder) if call.top_rung is None else min(call.top_rung + 1, len(policy.ladder))
    tools, stripped = permitted_tools(module, call.tools)
    ctx = CallInfo(
        trace_id=call.trace_id,
        client_key=call.client_key,
        module=module,
        input=prepared.checked_input,
        media=media,
    )
    return _Ladder(
        call=call,
        thresholds=thresholds,
        capable=[policy.capable(rung.targets, module.runtime) for rung in policy.ladder[:rungs]],
        media=media,
        messages=build_messages(module, prepared.model_input, media, call.injected),
        extra={"tools": list(tools)} if tools else {},
        stripped=stripped,
        ctx=ctx,
        deadline=deadline,
        attempts=_Attempts(policy),
    )


def _incapable(module: Module, policy: Policy) -> ModuleAnswer:
    """No target from the start rung on has the module's required capabilities: E4001, the
    error-codes.md code closest to "no provider can serve this" (the taxonomy has no capability
    code; E4003 is CONTEXT_OVERFLOW)."""
    missing = policy.missing_capabilities(module.runtime)
    envelope = error_envelope(
        Code.PROVIDER_UNAVAILABLE,
        f"No provider target can serve module {module.name!r}: missing capability {', '.join(missing)}",
        suggestion="Declare the capability for a target of the policy (capabilities:), "
        "or set runtime_requirements.structured_output: false in module.yaml",
        details={"missing_capabilities": missing, "reason": "capability_unavailable"},
    )
    return ModuleAnswer(module, envelope, "reject", Origin.RUNTIME)


async def _ladder(
    call: ModuleRun, prepared: Prepared, thresholds: Thresholds, media: tuple[Media, ...], deadline: float
) -> ModuleAnswer:
    """The rungs: provider call -> contract (with re-asks) -> decide, escalating until a decision.
    A rung's targets without the module's capabilities, or that cannot take the call's media, are
    skipped like unavailable ones."""
    ladder = call.policy.ladder
    run = _start_ladder(call, prepared, thresholds, media, deadline)
    start = rung = min(call.policy.start_rung(thresholds), run.rungs - 1)
    if not any(run.capable[start:]):
        return _incapable(call.module, call.policy)
    while rung < run.rungs:
        rung_name = ladder[rung].name
        targets = run.targets(rung)
        if not targets:
            rung += 1
            continue
        try:
            routed = await run.ask(targets, run.messages, rung_name)
        except RungFailed as exc:
            run.failures += exc.failures
            if exc.deadline_spent:
                run.deadline_spent = True
                break
            rung += 1  # no healthy target on this rung: the next one
            continue
        routed, result = await _with_reasks(run, routed, rung_name)
        assessed = run.assess(result, routed.target)
        result = _routed(result, assessed)
        decision = decide(thresholds, assessed.meta, rung, run.rungs)
        reply = routed.value[0]
        run.attempts.record_answer(
            rung_name, routed.target, decision.action, assessed, result, usage_of(reply)
        )
        run.last = result.envelope
        if decision.action == "escalate" and decision.next_rung is not None:
            if call.listener is not None:
                call.listener.retrying(
                    "escalating", rung_name, ladder[decision.next_rung].name, decision.reason
                )
            rung = decision.next_rung
            continue
        return _decided(run, decision, result, routed, first_rung=rung == start)
    return _unanswered(run)


async def _with_reasks(run: _Ladder, routed: Asked, rung_name: str) -> tuple[Asked, ContractResult]:
    """The contract on an answer, re-asking the same target (up to the tier's ``reask``) while
    the answer fails it; a re-ask the provider cannot answer keeps the last failed result."""
    module, listener = run.call.module, run.call.listener
    reply, text = routed.value
    wait = run.call.before_check
    if wait is not None:
        await wait()
    result = await _contract(reply, text, module)
    for _ in range(run.thresholds.reask):
        if result.passed:
            break
        assessed = run.assess(result, routed.target)
        run.attempts.record_answer(rung_name, routed.target, "reask", assessed, result, usage_of(reply))
        if listener is not None:
            listener.retrying("reasking", rung_name, rung_name, f"contract:{result.error_code}")
        try:
            again = await run.ask((routed.target,), reask_messages(run.messages, text, result), rung_name)
        except RungFailed as exc:
            run.failures += exc.failures
            break
        routed, (reply, text) = again, again.value
        if wait is not None:
            await wait()
        result = await _contract(reply, text, module)
    return routed, result


def _decided(
    run: _Ladder, decision: Decision, result: ContractResult, routed: Asked, *, first_rung: bool
) -> ModuleAnswer:
    """The answer of a rung that decided (accept, review or reject)."""
    module = run.call.module
    envelope = result.envelope
    label: str = decision.action
    origin = Origin.MODEL if result.passed else Origin.CONTRACT
    if decision.action == "accept":
        label = "accept" if first_rung else "escalated"
    elif decision.action == "reject":
        envelope = _reject(run.thresholds, decision, result.envelope, module)
        origin = Origin.POLICY
    meta = envelope.get("meta")
    if run.media and isinstance(meta, dict):
        envelope = {**envelope, "meta": {**meta, "media_validation": validation_meta(run.media)}}
    return ModuleAnswer(
        module=module,
        envelope=envelope,
        decision=label,
        origin=origin,
        attempts=tuple(run.attempts.items),
        model=str(routed.target),
        repairs=result.repairs,
        usage=usage_of(routed.value[0]),
        upstream_s=run.attempts.upstream_s,
        emitted=result.emitted,
        cost=run.cost(),
        downgraded=run.downgraded,
        stripped_tools=run.stripped,
    )


def _unanswered(run: _Ladder) -> ModuleAnswer:
    """No rung decided: every target failed, was skipped, or the deadline ran out."""
    module = run.call.module
    envelope, retry_after = _no_answer(run.failures, run.deadline_spent, module, run.last)
    return ModuleAnswer(
        module=module,
        envelope=envelope,
        decision="reject",
        origin=Origin.RUNTIME,
        attempts=tuple(run.attempts.items),
        retry_after=retry_after,
        upstream_s=run.attempts.upstream_s,
        cost=run.cost(),
        downgraded=run.downgraded,
        stripped_tools=run.stripped,
    )
