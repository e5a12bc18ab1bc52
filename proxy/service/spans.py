"""The module-call span: one per module call, and one per step of a composite (its children).

Named ``module_call {module}``; its ``cognitive.*`` attributes say why the answer was accepted,
escalated, reviewed or rejected (docs/observability.md, *Traces*). No content: the envelope's data
never becomes an attribute.
"""

from __future__ import annotations

from collections.abc import Awaitable
from typing import Any

from proxy.jsonshape import as_dict
from proxy.module.model import Module
from proxy.observability.tracing import traced
from proxy.pipeline import ModuleAnswer

ESCALATED = "escalate"
REASKED = "reask"


def traced_module(module: Module, answer: Awaitable[ModuleAnswer]) -> Awaitable[ModuleAnswer]:
    """``answer`` inside the module-call span (tracing on); as it is otherwise."""
    return traced(
        f"module_call {module.name}",
        answer,
        module_attributes,
        {"cognitive.module": module.name, "cognitive.tier": module.tier},
    )


def module_attributes(answer: ModuleAnswer) -> dict[str, Any]:
    """The decision and what it rested on: reported and calibrated confidence, the risk routed on
    (and the model's and the rule's), the rung reached, escalations, re-asks, cache, cost."""
    meta = answer.meta
    out: dict[str, Any] = {
        "cognitive.decision": answer.decision,
        "cognitive.origin": str(answer.origin),
        "cognitive.attempts": len(answer.attempts),
        "cognitive.escalations": sum(1 for a in answer.attempts if a.outcome == ESCALATED),
        "cognitive.reasks": sum(1 for a in answer.attempts if a.outcome == REASKED),
        "cognitive.cost_usd": answer.cost.usd,
    }
    if isinstance(meta.get("risk"), str):
        out["cognitive.risk"] = meta["risk"]
    final = answer.final
    if final is not None:
        out["cognitive.rung"] = final.rung
        out["cognitive.target"] = final.target
        if final.confidence is not None:
            out["cognitive.confidence"] = final.confidence
        if final.calibrated is not None:
            out["cognitive.confidence.calibrated"] = final.calibrated
        if final.model_risk is not None:
            out["cognitive.risk.model"] = final.model_risk
        if final.rule_risk is not None:
            out["cognitive.risk.rule"] = final.rule_risk
    elif isinstance(meta.get("confidence"), int | float):
        out["cognitive.confidence"] = float(meta["confidence"])
    if answer.cache is not None:
        out["cognitive.cache"] = answer.cache
    savings = answer.cost.savings_usd
    if savings is not None:
        out["cognitive.savings_usd"] = savings
    if answer.downgraded:
        out["cognitive.downgraded"] = True
    if answer.steps:
        out["cognitive.steps"] = len(answer.steps)
    error = as_dict(answer.envelope.get("error"))
    if isinstance(error.get("code"), str):
        out["cognitive.error_code"] = error["code"]
        out["error.type"] = error["code"]
    for name, key in (("input_tokens", "prompt_tokens"), ("output_tokens", "completion_tokens")):
        value = answer.usage.get(key)
        if type(value) is int:
            out[f"gen_ai.usage.{name}"] = value
    return out
