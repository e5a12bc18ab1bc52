"""What a module answer leaves for ``POST /v1/feedback``: its answer record."""

from __future__ import annotations

import time
from typing import Any

from proxy.module.model import Module
from proxy.pipeline import ModuleAnswer
from proxy.policy.model import Policy
from proxy.state.feedback import AnswerRecord, pack_path


def answer_record(
    answer: ModuleAnswer, module: Module, policy: Policy, trace_id: str, client: str
) -> AnswerRecord | None:
    """The record of a module answer a model produced (None when no model answered), with the
    rungs that escalated before it (``AnswerRecord.path``)."""
    final = answer.final
    if final is None or final.confidence is None or not trace_id:
        return None
    provider, _, model = final.target.partition("/")
    now = time.time()
    return AnswerRecord(
        trace_id=trace_id,
        module=module.name,
        tier=module.tier,
        rung=final.rung,
        provider=provider,
        model=model,
        confidence=final.confidence,
        calibrated=final.confidence if final.calibrated is None else final.calibrated,
        risk=str(final.risk),
        decision=answer.decision,
        min_confidence=policy.thresholds_for(module.name, module.tier).min_confidence,
        at=now,
        expires=now + policy.feedback.window_s,
        client=client,
        path=pack_path(
            [
                (a.target, a.confidence, str(a.risk))
                for a in answer.attempts
                if a.outcome == "escalate" and a.confidence is not None
            ]
        ),
    )


def review_facts(answer: ModuleAnswer) -> dict[str, Any]:
    """How an answer sent to review was decided, for the review record (the console shows it)."""
    final = answer.final
    facts: dict[str, Any] = {"cost_usd": answer.cost.usd}
    if final is not None:
        facts.update(
            rung=final.rung,
            target=final.target,
            confidence=final.confidence,
            calibrated=final.confidence if final.calibrated is None else final.calibrated,
            risk=final.risk,
            model_risk=final.model_risk,
            rule_risk=final.rule_risk,
        )
    return facts
