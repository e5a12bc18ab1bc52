"""The routing decision: a pure function of meta, the thresholds and the rung position."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from proxy.contract.risk import RISK_RANK
from proxy.policy.model import Thresholds

Action = Literal["accept", "escalate", "review", "reject"]


@dataclass(frozen=True, slots=True)
class Meta:
    """The control plane of an answer: all the router may look at."""

    confidence: float
    risk: str


@dataclass(frozen=True, slots=True)
class Decision:
    action: Action
    reason: str
    next_rung: int | None = None


def _missed(thresholds: Thresholds, meta: Meta) -> str | None:
    low = meta.confidence < thresholds.min_confidence
    risky = RISK_RANK.get(meta.risk, RISK_RANK["high"]) > RISK_RANK[thresholds.max_risk]
    parts = []
    if low:
        parts.append(f"confidence {meta.confidence:g} < min_confidence {thresholds.min_confidence:g}")
    if risky:
        parts.append(f"risk {meta.risk} > max_risk {thresholds.max_risk}")
    return " and ".join(parts) or None


def decide(thresholds: Thresholds, meta: Meta, rung: int, rungs: int) -> Decision:
    """Accept when confidence >= min and risk <= max; else the next rung; past the top,
    ``thresholds.exhausted`` (reject, review or accept)."""
    missed = _missed(thresholds, meta)
    if missed is None:
        return Decision("accept", "meets thresholds")
    if rung + 1 < rungs:
        return Decision("escalate", missed, rung + 1)
    return Decision(thresholds.exhausted, f"{missed} on the top rung")
