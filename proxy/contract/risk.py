"""Risk levels and the module's risk aggregation rule (spec v2.2 §2.4)."""

from __future__ import annotations

from typing import Any, Final, Literal

Risk = Literal["none", "low", "medium", "high"]
RISKS: Final[tuple[Risk, ...]] = ("none", "low", "medium", "high")
RISK_RANK: Final[dict[str, int]] = {name: rank for rank, name in enumerate(RISKS)}
DEFAULT_RISK: Final[Risk] = "medium"

_LIST_FOR_RULE: Final[dict[str, str]] = {
    "max_changes_risk": "changes",
    "max_issues_risk": "issues",
}


def aggregate_risk(data: Any, rule: str = "max_changes_risk") -> Risk:
    """``max(data.<list>[*].risk)`` for the rule's list; ``"medium"`` when nothing is declared.

    ``explicit`` and ``custom_function`` rules cannot be computed by the runtime, so a missing
    risk falls back to the conservative ``"medium"``. Items without a valid risk are skipped.
    """
    key = _LIST_FOR_RULE.get(rule)
    if key is None or not isinstance(data, dict):
        return DEFAULT_RISK
    items = data.get(key)
    if not isinstance(items, list):
        return DEFAULT_RISK
    ranks = [
        RISK_RANK[item["risk"]]
        for item in items
        if isinstance(item, dict) and isinstance(item.get("risk"), str) and item["risk"] in RISK_RANK
    ]
    return RISKS[max(ranks)] if ranks else DEFAULT_RISK


RiskSource = Literal["model", "rule", "max"]
"""Which risk routes an answer (policy ``risk_source``): the model's ``meta.risk``, the module's
``risk_rule`` computed over the data, or the higher of the two."""
DEFAULT_RISK_SOURCE: Final[RiskSource] = "max"


def rule_risk(data: Any, rule: str) -> Risk | None:
    """The module's ``risk_rule`` computed over ``data``, or None when the rule cannot say.

    Unlike ``aggregate_risk`` (which fills a *missing* risk), nothing is defaulted: ``explicit``
    and ``custom_function`` rules, data without the rule's list, an empty list and a list whose
    items carry no valid risk all give None (a maximum over nothing says nothing).
    """
    key = _LIST_FOR_RULE.get(rule)
    items = data.get(key) if key is not None and isinstance(data, dict) else None
    if not isinstance(items, list):
        return None
    ranks = [
        RISK_RANK[item["risk"]]
        for item in items
        if isinstance(item, dict) and isinstance(item.get("risk"), str) and item["risk"] in RISK_RANK
    ]
    return RISKS[max(ranks)] if ranks else None


def routed_risk(model: str, rule: Risk | None, source: RiskSource) -> str:
    """The risk the router decides on. Without a rule value the model's risk is all there is."""
    if rule is None or source == "model":
        return model
    if source == "rule":
        return rule
    return rule if RISK_RANK[rule] > RISK_RANK.get(model, RISK_RANK["high"]) else model
