"""One module call from input to decided envelope.

    input check -> render prompt -> [rung: provider call -> contract -> decide] -> final envelope

The decision uses only ``meta.confidence``, ``meta.risk`` and the tier's thresholds; a contract
failure is an envelope with confidence 0.0 and escalates like any other weak answer. A provider
failure moves the call to the next rung; when no rung is left the answer is E4001 (E4002 when
every failure was a rate limit).
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from proxy.contract.engine import ContractResult, run_contract
from proxy.contract.errors import Code, error_envelope, http_status
from proxy.contract.inputs import check_input
from proxy.contract.repair import Repair
from proxy.jsonshape import as_dict
from proxy.module.model import Module
from proxy.module.prompt import render_prompt
from proxy.policy.decide import Decision, Meta, decide
from proxy.policy.model import Policy, Target, Thresholds
from proxy.upstream.base import CallContext, Provider, ProviderError, content_of, usage_of
from proxy.upstream.router import Routed, Router, RungFailed, Try


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

    def as_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "rung": self.rung,
            "target": self.target,
            "outcome": self.outcome,
            "confidence": self.confidence,
            "risk": self.risk,
            "latency_ms": round(self.latency_ms, 3),
        }
        if self.error:
            out["error"] = self.error
        if self.repairs:
            out["repairs"] = list(self.repairs)
        return out


@dataclass(frozen=True, slots=True)
class ModuleAnswer:
    """The decided answer and everything the edge reports about it."""

    module: Module
    envelope: dict[str, Any]
    decision: str
    """accept | escalated (accepted on a later rung) | review | reject"""
    attempts: tuple[Attempt, ...] = ()
    model: str | None = None
    repairs: tuple[Repair, ...] = ()
    retry_after: float | None = None
    usage: Mapping[str, int] = field(default_factory=dict)
    upstream_s: float = 0.0
    """Time spent waiting on providers (tries and backoff), for the overhead metric."""

    @property
    def status(self) -> int:
        if self.envelope.get("ok") is True:
            return 200
        return http_status(str(as_dict(self.envelope.get("error")).get("code", "")))

    @property
    def meta(self) -> dict[str, Any]:
        return as_dict(self.envelope.get("meta"))

    def cognitive(self) -> dict[str, Any]:
        """The ``cognitive`` block of DESIGN §3."""
        return {
            "module": self.module.name,
            "tier": self.module.tier,
            "decision": self.decision,
            "meta": self.meta,
            "attempts": [a.as_dict() for a in self.attempts],
        }

    def headers(self) -> dict[str, str]:
        """The decision headers sent on every module answer."""
        meta = self.meta
        headers = {
            "X-Cognitive-Decision": self.decision,
            "X-Cognitive-Confidence": f"{meta.get('confidence', 0)}",
            "X-Cognitive-Risk": str(meta.get("risk", "high")),
            "X-Cognitive-Tier": self.module.tier,
            "X-Cognitive-Model": self.model or "",
            "X-Cognitive-Attempts": str(len(self.attempts)),
        }
        if self.retry_after is not None:
            headers["Retry-After"] = str(max(1, round(self.retry_after)))
        return headers


@dataclass(frozen=True, slots=True)
class Call:
    """The fixed inputs of one module call."""

    module: Module
    input: Any
    policy: Policy
    providers: Mapping[str, Provider]
    router: Router
    trace_id: str = ""
    client_key: str | None = None
    check_input: bool = True


def _reject(
    thresholds: Thresholds, decision: Decision, envelope: dict[str, Any], module: Module
) -> dict[str, Any]:
    meta = as_dict(envelope.get("meta"))
    last = envelope.get("data") if envelope.get("ok") else envelope.get("partial_data")
    return error_envelope(
        Code.LOW_CONFIDENCE,
        f"Module {module.name!r} ({module.tier} tier) answer rejected: {decision.reason}",
        explain=f"Rejected by policy: {decision.reason}"[:280],
        meta={
            "confidence": meta.get("confidence", 0.0),
            "risk": meta.get("risk", "high"),
            "explain": f"Rejected by policy: {decision.reason}"[:280],
        },
        details={"min_confidence": thresholds.min_confidence, "max_risk": thresholds.max_risk},
        partial_data=last if isinstance(last, dict) else None,
    )


def _unavailable(failures: list[ProviderError]) -> tuple[dict[str, Any], float]:
    rate_limited = bool(failures) and all(f.kind == "rate_limited" for f in failures)
    retry_after = max((f.retry_after or 0.0 for f in failures), default=0.0) or 1.0
    code = Code.RATE_LIMITED if rate_limited else Code.PROVIDER_UNAVAILABLE
    last = failures[-1].message if failures else "no provider target is configured"
    return error_envelope(code, f"Every provider target failed; last: {last}"[:1000]), retry_after


def _finish(answer: ModuleAnswer, started: float, trace_id: str) -> ModuleAnswer:
    meta = answer.envelope.get("meta")
    if isinstance(meta, dict):
        if trace_id:
            meta["trace_id"] = trace_id
        if answer.model:
            meta["model"] = answer.model
        meta["latency_ms"] = round((time.perf_counter() - started) * 1000, 3)
    return answer


def build_messages(module: Module, value: Any) -> list[dict[str, str]]:
    prompt = render_prompt(module, value)
    return [{"role": "system", "content": prompt.system}, {"role": "user", "content": prompt.user}]


def _meta_of(envelope: dict[str, Any]) -> Meta:
    meta = as_dict(envelope.get("meta"))
    confidence = meta.get("confidence")
    value = (
        float(confidence)
        if isinstance(confidence, (int, float)) and not isinstance(confidence, bool)
        else 0.0
    )
    return Meta(value, str(meta.get("risk", "high")))


def reask_messages(messages: list[dict[str, str]], text: str, result: ContractResult) -> list[dict[str, str]]:
    """The conversation for a re-ask: the rejected answer and what was wrong with it."""
    problems = "\n".join(f"- {v}" for v in result.violations[:20]) or "- not a valid envelope"
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
    provider: Provider, target: Target, timeout: float, body: dict[str, Any], ctx: CallContext
) -> tuple[dict[str, Any], str]:
    reply = await provider.complete(body, target.model, ctx, timeout)
    return reply, content_of(reply)  # no message: a malformed answer, failed over like one


class _Attempts:
    """Collects the ``cognitive.attempts`` list: provider failures as they happen, answers
    once their outcome is known."""

    def __init__(self) -> None:
        self.items: list[Attempt] = []
        self.last_ms = 0.0
        self.upstream_s = 0.0

    def on_try(self, rung: str) -> Callable[[Try], None]:
        def record(attempt: Try) -> None:
            self.last_ms = attempt.latency_ms
            self.upstream_s += attempt.latency_ms / 1000 + attempt.waited_s
            if attempt.error is not None:
                outcome = "circuit_open" if attempt.skipped else f"provider_error:{attempt.error.kind}"
                self.items.append(
                    Attempt(
                        rung,
                        str(attempt.target),
                        outcome,
                        latency_ms=attempt.latency_ms,
                        error=attempt.error.message[:300],
                    )
                )

        return record

    def answer(
        self,
        rung: str,
        target: Target,
        outcome: str,
        meta: Meta,
        result: ContractResult,
        usage: dict[str, Any],
    ) -> None:
        self.items.append(
            Attempt(
                rung,
                str(target),
                outcome,
                meta.confidence,
                meta.risk,
                self.last_ms,
                result.error_code and f"contract:{result.error_code}",
                tuple(r.kind for r in result.repairs),
                usage,
            )
        )


async def run_module(call: Call) -> ModuleAnswer:
    """Run ``call`` through the ladder and return the decided answer (never raises for
    provider or contract failures: those are envelopes)."""
    started = time.perf_counter()
    module, policy = call.module, call.policy
    if call.check_input:
        error = check_input(module, call.input)
        if error is not None:
            return _finish(ModuleAnswer(module, error, "reject"), started, call.trace_id)
    thresholds = policy.thresholds_for(module.name, module.tier)
    start = policy.start_rung(thresholds)
    messages = build_messages(module, call.input)
    ctx = CallContext(trace_id=call.trace_id, client_key=call.client_key, module=module, input=call.input)
    deadline = time.monotonic() + policy.timeouts.total_s
    attempts = _Attempts()
    failures: list[ProviderError] = []

    def ask(
        targets: tuple[Target, ...], conversation: list[dict[str, str]], rung_name: str
    ) -> Awaitable[Routed[tuple[dict[str, Any], str]]]:
        operation = partial(_complete, body={"messages": conversation}, ctx=ctx)
        return call.router.call(
            targets, call.providers, operation, policy.failover, deadline, attempts.on_try(rung_name)
        )

    rung = start
    while rung < len(policy.ladder):
        rung_name = policy.ladder[rung].name
        try:
            routed = await ask(policy.ladder[rung].targets, messages, rung_name)
        except RungFailed as exc:
            failures += exc.failures
            if exc.deadline_spent:
                break
            rung += 1  # no healthy target on this rung: the next one
            continue
        reply, text = routed.value
        result = run_contract(text, module)
        for _ in range(thresholds.reask):
            if result.passed:
                break
            attempts.answer(
                rung_name, routed.target, "reask", _meta_of(result.envelope), result, usage_of(reply)
            )
            try:
                again = await ask((routed.target,), reask_messages(messages, text, result), rung_name)
            except RungFailed as exc:
                failures += exc.failures
                break
            routed, (reply, text) = again, again.value
            result = run_contract(text, module)
        meta = _meta_of(result.envelope)
        decision = decide(thresholds, meta, rung, len(policy.ladder))
        attempts.answer(rung_name, routed.target, decision.action, meta, result, usage_of(reply))
        if decision.action == "escalate" and decision.next_rung is not None:
            rung = decision.next_rung
            continue
        envelope = result.envelope
        label: str = decision.action
        if decision.action == "accept":
            label = "accept" if rung == start else "escalated"
        elif decision.action == "reject":
            envelope = _reject(thresholds, decision, result.envelope, module)
        answer = ModuleAnswer(
            module,
            envelope,
            label,
            tuple(attempts.items),
            str(routed.target),
            result.repairs,
            usage=usage_of(reply),
            upstream_s=attempts.upstream_s,
        )
        return _finish(answer, started, call.trace_id)
    envelope, retry_after = _unavailable(failures)
    return _finish(
        ModuleAnswer(
            module,
            envelope,
            "reject",
            tuple(attempts.items),
            retry_after=retry_after,
            upstream_s=attempts.upstream_s,
        ),
        started,
        call.trace_id,
    )
