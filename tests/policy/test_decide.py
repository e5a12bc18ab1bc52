"""decide(): a pure function of meta, thresholds and the rung position."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from proxy.contract.risk import RISK_RANK, RISKS
from proxy.policy.decide import Decision, Meta, decide
from proxy.policy.model import Thresholds

EXEC = Thresholds(0.9, "low", "reject")
DECISION = Thresholds(0.7, "medium", "review")
EXPLORATION = Thresholds(0.3, "high", "accept")


@pytest.mark.parametrize(
    ("thresholds", "confidence", "risk", "rung", "action", "next_rung"),
    [
        (EXEC, 0.95, "low", 0, "accept", None),
        (EXEC, 0.9, "none", 1, "accept", None),
        (EXEC, 0.89, "low", 0, "escalate", 1),
        (EXEC, 0.99, "medium", 0, "escalate", 1),
        (EXEC, 0.5, "high", 1, "reject", None),
        (DECISION, 0.7, "medium", 0, "accept", None),
        (DECISION, 0.69, "low", 0, "escalate", 1),
        (DECISION, 0.9, "high", 1, "review", None),
        (EXPLORATION, 0.3, "high", 0, "accept", None),
        (EXPLORATION, 0.1, "low", 0, "escalate", 1),
        (EXPLORATION, 0.1, "low", 1, "accept", None),
        (EXEC, 0.0, "high", 0, "escalate", 1),
    ],
)
def test_decision_table(
    thresholds: Thresholds, confidence: float, risk: str, rung: int, action: str, next_rung: int | None
) -> None:
    decision = decide(thresholds, Meta(confidence, risk), rung, 2)
    assert (decision.action, decision.next_rung) == (action, next_rung)


def test_reason_names_the_threshold_missed() -> None:
    decision = decide(EXEC, Meta(0.5, "high"), 1, 2)
    assert (
        decision.reason == "confidence 0.5 < min_confidence 0.9 and risk high > max_risk low on the top rung"
    )


def test_unknown_risk_counts_as_high() -> None:
    assert decide(DECISION, Meta(0.9, "catastrophic"), 1, 2).action == "review"


ORDER = {"reject": 0, "review": 1, "escalate": 1, "accept": 2}


@given(st.floats(0, 1), st.floats(0, 1), st.sampled_from(RISKS), st.sampled_from(RISKS), st.integers(0, 2))
def test_property_more_confidence_or_less_risk_never_makes_it_worse(
    c1: float, c2: float, r1: str, r2: str, rung: int
) -> None:
    low_c, high_c = sorted((c1, c2))
    worse_r, better_r = sorted((r1, r2), key=lambda r: -RISK_RANK[r])
    for thresholds in (EXEC, DECISION, EXPLORATION):
        before = decide(thresholds, Meta(low_c, worse_r), rung, 3)
        after = decide(thresholds, Meta(high_c, better_r), rung, 3)
        assert ORDER[after.action] >= ORDER[before.action]


def test_every_decision_pins_its_reason_and_next_rung() -> None:
    assert decide(DECISION, Meta(0.8, "low"), 0, 2) == Decision("accept", "meets thresholds")
    assert decide(DECISION, Meta(0.5, "low"), 0, 3) == Decision(
        "escalate", "confidence 0.5 < min_confidence 0.7", 1
    )
    assert decide(DECISION, Meta(0.9, "high"), 1, 3) == Decision("escalate", "risk high > max_risk medium", 2)
    assert decide(DECISION, Meta(0.9, "high"), 2, 3) == Decision(
        "review", "risk high > max_risk medium on the top rung"
    )
