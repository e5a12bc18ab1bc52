"""Turning what happened into metrics and dotted log events, with bounded labels."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import structlog

from proxy.contract.errors import Origin
from proxy.contract.risk import RISK_RANK
from proxy.jsonshape import as_dict
from proxy.observability.metrics import (
    OTHER,
    OUTCOME_DECIDED,
    OUTCOME_INVALID_INPUT,
    OUTCOME_UNANSWERED,
    Amount,
    Metrics,
    feedback_bucket,
)
from proxy.pipeline import Attempt, ModuleAnswer
from proxy.policy.model import Policy, Target
from proxy.state.feedback import SHADOW_SOURCE, AnswerRecord
from proxy.upstream.base import ProviderError

log = structlog.get_logger("proxy")


def target_labels(policy: Policy | None, target: Target) -> tuple[str, str]:
    """(provider, model) for a target the policy names; ``other`` for anything a request made up."""
    if policy is None:
        return OTHER, OTHER
    if target.name in policy.known_targets:
        return target.provider, target.model
    return (target.provider if target.provider in policy.providers else OTHER), OTHER


def record_usage(
    metrics: Metrics,
    policy: Policy | None,
    target: Target,
    usage: Mapping[str, Any],
    output_s: float | None = None,
) -> None:
    """``cognitive_tokens_total`` of one answer; with ``output_s`` (the time its completion took
    to arrive) also its output speed, ``cognitive_output_tokens_per_second``."""
    prompt, completion = usage.get("prompt_tokens"), usage.get("completion_tokens")
    if type(prompt) is not int:
        prompt = 0
    if type(completion) is not int:
        completion = 0
    provider, model = target_labels(policy, target)
    speed = completion / output_s if completion > 0 and output_s else 0.0
    metrics.usage_children(provider, model)(prompt, completion, speed)


def total_tokens(usage: Mapping[str, Any]) -> int:
    """Input + output tokens of one usage object (OpenAI, Responses or Anthropic names)."""
    total = 0
    for names in _TOKEN_NAMES:
        for name in names:
            value = usage.get(name)
            if type(value) is int:  # not bool, which is an int subclass
                total += max(value, 0)
                break
    return total


_TOKEN_NAMES = (("prompt_tokens", "input_tokens"), ("completion_tokens", "output_tokens"))


def record_cost(
    metrics: Metrics, policy: Policy, module: str, target: Target, usage: Mapping[str, Any], client: str
) -> float:
    """``cognitive_cost_usd_total`` of one answer; returns its USD (0 when the target is unpriced)."""
    price = policy.price_of(target.name)
    if price is None:
        return 0.0
    usd = price.cost(usage)
    if usd > 0:
        provider, model = target_labels(policy, target)
        metrics.child(metrics.cost, module, provider, model, client).inc(usd)
    return usd


def record_module_cost(metrics: Metrics, policy: Policy, answer: ModuleAnswer, client: str) -> int:
    """Cost per attempt, savings against the top rung; returns the call's tokens."""
    module = answer.module.name
    tokens = 0
    for attempt in answer.attempts:
        provider, _, model = attempt.target.partition("/")
        record_cost(metrics, policy, module, Target(provider, model), attempt.usage, client)
        tokens += total_tokens(attempt.usage)
    cost = answer.cost
    savings = cost.savings_usd
    if cost.counterfactual_usd is not None and savings is not None:
        metrics.counterfactual.labels(module).inc(cost.counterfactual_usd)
        if savings > 0:
            metrics.savings.labels(module).inc(savings)
        elif savings < 0:
            metrics.savings_lost.labels(module).inc(-savings)
    return tokens


class MetricsObserver:
    """The router's observer: upstream attempts, latency and failovers."""

    def __init__(self, metrics: Metrics, policy: Callable[[], Policy | None]) -> None:
        self._metrics = metrics
        self._policy = policy
        self._attempts: dict[tuple[str, str, str], Amount] = {}
        """``Metrics.upstream_child`` of each (provider, model, outcome) of a target a policy
        named (labelled by its own provider and model): bounded as the labels are."""

    def attempt(self, target: Target, latency_s: float, error: ProviderError | None) -> None:
        outcome = "ok" if error is None else error.kind
        policy = self._policy()
        if policy is None or target.name not in policy.known_targets:  # labels "other": not kept
            provider, model = target_labels(policy, target)
            self._metrics.observe_upstream(provider, model, outcome, latency_s)
            return
        key = (target.provider, target.model, outcome)
        count = self._attempts.get(key)
        if count is None:
            count = self._attempts[key] = self._metrics.upstream_child(target.provider, target.model, outcome)
        count(latency_s)

    def failover(self, from_target: Target, to_target: Target, reason: str) -> None:
        policy = self._policy()
        names = ["/".join(target_labels(policy, t)) for t in (from_target, to_target)]
        self._metrics.failovers.labels(names[0], names[1], reason).inc()
        log.info("proxy.failover", from_target=names[0], to_target=names[1], reason=reason)


def record_module_answer(metrics: Metrics, policy: Policy, answer: ModuleAnswer) -> str:
    """Confidence, risk, risk disagreements, decisions, escalations, repairs, contract errors and
    tokens of one answer; returns the request's outcome. An input refused before any model call
    is the caller's mistake, not a decision: a contract error and outcome ``invalid_input``; a call
    no model answered (providers down, the deadline) is outcome ``unanswered``, not a reject."""
    module, tier = answer.module.name, answer.module.tier
    if answer.stripped_tools:
        metrics.tools_stripped.labels(module).inc(len(answer.stripped_tools))
        log.info("proxy.tools_stripped", module=module, tools=list(answer.stripped_tools)[:20])
    rungs = [r.name for r in policy.ladder]
    answered = [a for a in answer.attempts if a.confidence is not None]
    for index, attempt in enumerate(answered):
        _record_attempt(metrics, policy, answer, attempt, final=index == len(answered) - 1)
        if attempt.outcome == "escalate" and attempt.rung in rungs:
            _record_escalation(metrics, module, attempt, rungs)
    if answer.redacted:
        metrics.context_redactions.labels(module).inc(len(answer.redacted))
    if answer.cache is not None:
        metrics.cache.labels(module, answer.cache).inc()
        if answer.saved_tokens:
            metrics.cache_saved_tokens.labels(module).inc(answer.saved_tokens)
    if not answer.attempts and answer.cache is None:
        code = str(as_dict(answer.envelope.get("error")).get("code", ""))
        if code.startswith("E1"):  # the input broke the module's input contract
            metrics.contract_errors.labels(module, code).inc()
            return OUTCOME_INVALID_INPUT
    if not answered and answer.cache is None and answer.origin is Origin.RUNTIME:
        return OUTCOME_UNANSWERED
    metrics.decisions.labels(module, tier, answer.decision).inc()
    risk = str(answer.meta.get("risk", ""))
    if answered:
        metrics.risk.labels(module, tier, risk if risk in RISK_RANK else OTHER).inc()
    return OUTCOME_DECIDED


def _record_attempt(
    metrics: Metrics, policy: Policy, answer: ModuleAnswer, attempt: Attempt, *, final: bool
) -> None:
    """One answered attempt: its confidence, risk disagreement, repairs, contract error, tokens."""
    module, tier = answer.module.name, answer.module.tier
    assert attempt.confidence is not None
    metrics.confidence.labels(module, tier, "final" if final else "intermediate").observe(attempt.confidence)
    if final and attempt.calibrated is not None:
        metrics.confidence_calibrated.labels(module, tier).observe(attempt.calibrated)
    if attempt.risks_disagree:
        metrics.risk_disagreements.labels(module).inc()
        log.info(
            "proxy.risk_disagreement",
            module=module,
            target=attempt.target,
            model_risk=attempt.model_risk,
            rule_risk=attempt.rule_risk,
        )
    for kind in attempt.repairs:
        metrics.repairs.labels(module, kind).inc()
    if attempt.repairs:
        log.info("proxy.repaired", module=module, target=attempt.target, kinds=list(attempt.repairs))
    if attempt.error and attempt.error.startswith("contract:"):
        metrics.contract_errors.labels(module, attempt.error.removeprefix("contract:")).inc()
    provider, _, model = attempt.target.partition("/")
    record_usage(metrics, policy, Target(provider, model), attempt.usage)


def _record_escalation(metrics: Metrics, module: str, attempt: Attempt, rungs: list[str]) -> None:
    position = rungs.index(attempt.rung)
    to_rung = rungs[position + 1] if position + 1 < len(rungs) else OTHER
    metrics.escalations.labels(module, attempt.rung, to_rung).inc()
    log.info(
        "proxy.escalated",
        module=module,
        from_rung=attempt.rung,
        to_rung=to_rung,
        confidence=attempt.confidence,
        risk=attempt.risk,
    )


def record_verdict(metrics: Metrics, policy: Policy, record: AnswerRecord, previous: AnswerRecord) -> None:
    """Count a verdict: the reliability counters take an answer's first human verdict only (a
    counter cannot take back a replaced one); later verdicts count in
    ``cognitive_feedback_replaced_total``. A shadow verdict counts in ``cognitive_verdicts_total``
    only, so the reliability counters stay the humans' and the two sources are compared, not mixed."""
    assert record.verdict is not None and record.score is not None
    metrics.verdicts.labels(record.module, source_label(record.source), record.verdict).inc()
    if record.source == SHADOW_SOURCE:
        return
    if previous.source == SHADOW_SOURCE:
        record_shadow_vs_human(metrics, record.module, previous.verdict, record.verdict)
    elif previous.verdict is not None:
        changed = (previous.verdict, previous.score) != (record.verdict, record.score)
        metrics.feedback_replaced.labels(record.module, "true" if changed else "false").inc()
        return
    provider, model = target_labels(policy, Target(record.provider, record.model))
    y = record.score
    for scale, p in (("reported", record.confidence), ("calibrated", record.calibrated)):
        bucket = feedback_bucket(p)
        labels = (record.module, provider, model, scale, bucket)
        metrics.feedback.labels(*labels, record.verdict).inc()
        metrics.feedback_confidence.labels(*labels).inc(p)
        metrics.feedback_score.labels(*labels).inc(y)
        metrics.feedback_brier.labels(record.module, provider, model, scale).inc((p - y) ** 2)
    gate = "above" if record.calibrated >= record.min_confidence else "below"  # the gate it passed
    metrics.feedback_outcomes.labels(
        record.module, record.tier, provider, model, record.decision, gate, record.verdict
    ).inc()


def source_label(source: str | None) -> str:
    """The bounded ``source`` label of a verdict: ``shadow`` for the proxy's own judge, else
    ``human`` (a client's ``source`` is free text, never a label)."""
    return "shadow" if source == SHADOW_SOURCE else "human"


def record_shadow_vs_human(metrics: Metrics, module: str, shadow: str | None, human: str | None) -> None:
    """One answer judged by both the shadow judge and a human: do they agree?"""
    metrics.shadow_vs_human.labels(module, "true" if shadow == human else "false").inc()
