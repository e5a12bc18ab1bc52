"""What a module answer leaves for feedback (``proxy.service.records``): the risk decided on and
the rungs the call went through before the one that answered."""

from __future__ import annotations

from proxy.contract.errors import Origin
from proxy.pipeline import Attempt, ModuleAnswer
from proxy.service.records import answer_record
from proxy.state.feedback import path_steps
from tests.service.test_shadow_rules import REVIEWER, policy


def test_an_escalated_answer_keeps_its_risk_and_the_rungs_before_it() -> None:
    attempts = (
        Attempt("fast", "p/a", "reask", confidence=0.3, risk="low"),  # a re-ask: no rung's decision
        Attempt("fast", "p/a", "escalate", confidence=0.55, risk="low"),
        Attempt("mid", "p/b", "failed"),  # no answer: no confidence
        Attempt("mid", "p/b", "escalate", confidence=0.7, risk="high"),
        Attempt("top", "p/c", "accept", confidence=0.9, risk="medium"),
    )
    answer = ModuleAnswer(REVIEWER, {"ok": True}, "escalated", Origin.MODEL, attempts)
    record = answer_record(answer, REVIEWER, policy(), "t", "anonymous")
    assert record is not None and (record.rung, record.risk) == ("top", "medium")
    assert path_steps(record.path) == [("p/a", 0.55, "low"), ("p/b", 0.7, "high")]
    first = ModuleAnswer(REVIEWER, {"ok": True}, "accept", Origin.MODEL, attempts[-1:])
    kept = answer_record(first, REVIEWER, policy(), "t", "anonymous")
    assert kept is not None and kept.path == ""  # answered on its first rung
