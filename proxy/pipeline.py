"""One module call from input to decided envelope.

    input check -> render prompt -> [rung: provider call -> contract -> decide] -> final envelope

The decision uses only ``meta.confidence``, ``meta.risk`` and the tier's thresholds; a contract
failure is an envelope with confidence 0.0 and escalates like any other weak answer. A provider
failure moves the call to the next rung; when no rung is left the answer is E4001 (E4002 when
every failure was a rate limit).
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import orjson

from proxy.contract.engine import run_contract
from proxy.contract.errors import Code, error_envelope, http_status
from proxy.contract.inputs import check_input
from proxy.contract.repair import Repair
from proxy.jsonshape import as_dict
from proxy.module.model import Module
from proxy.module.prompt import render_prompt
from proxy.policy.decide import Decision, Meta, decide
from proxy.policy.model import Policy, Target, Thresholds
from proxy.upstream.base import CallContext, Provider, ProviderError, content_of


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
    body: dict[str, Any] = {"messages": build_messages(module, call.input)}
    ctx = CallContext(trace_id=call.trace_id, client_key=call.client_key, module=module, input=call.input)
    deadline = started + policy.timeouts.total_s
    attempts: list[Attempt] = []
    failures: list[ProviderError] = []
    rung = start
    while rung < len(policy.ladder):
        target: Target = policy.ladder[rung].targets[0]
        rung_name = policy.ladder[rung].name
        remaining = deadline - time.perf_counter()
        if remaining <= 0:
            failures.append(ProviderError("timeout", f"total deadline of {policy.timeouts.total_s:g}s spent"))
            break
        t0 = time.perf_counter()
        try:
            provider = call.providers[target.provider]
            reply = await provider.complete(
                body, target.model, ctx, min(policy.timeouts.per_try_s, remaining)
            )
            text = content_of(reply)
        except ProviderError as exc:
            failures.append(exc)
            attempts.append(
                Attempt(
                    rung_name,
                    str(target),
                    f"provider_error:{exc.kind}",
                    latency_ms=(time.perf_counter() - t0) * 1000,
                    error=exc.message[:300],
                )
            )
            rung += 1
            continue
        result = run_contract(text, module)
        meta = as_dict(result.envelope.get("meta"))
        confidence = meta.get("confidence")
        confidence = float(confidence) if isinstance(confidence, (int, float)) else 0.0
        risk = str(meta.get("risk", "high"))
        decision = decide(thresholds, Meta(confidence, risk), rung, len(policy.ladder))
        attempts.append(
            Attempt(
                rung_name,
                str(target),
                decision.action,
                confidence,
                risk,
                (time.perf_counter() - t0) * 1000,
                result.error_code and f"contract:{result.error_code}",
            )
        )
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
            tuple(attempts),
            str(target),
            result.repairs,
            usage=as_dict(reply.get("usage")),
        )
        return _finish(answer, started, call.trace_id)
    envelope, retry_after = _unavailable(failures)
    return _finish(
        ModuleAnswer(module, envelope, "reject", tuple(attempts), retry_after=retry_after),
        started,
        call.trace_id,
    )


def envelope_json(answer: ModuleAnswer) -> str:
    return orjson.dumps(answer.envelope).decode()
