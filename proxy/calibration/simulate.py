"""``cogproxy policy simulate``: last week's judged answers decided again under a candidate policy.

``policy explain`` answers "what happens to this one call"; this answers "what happens to the
traffic the verdicts came from": the decisions that change, the cost of the escalations gained
or lost, and the accuracy of the answers the candidate accepts with its exact 95% interval. The
stored risk is decided on, and the rungs a call went through before its answer are decided
again where the record kept them (``replay.walk``); records of 0.4 kept neither, and are counted.
An answer of a lower rung the candidate would accept was never judged: it is counted apart, out
of the accuracy.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field

from proxy.calibration.bounds import clopper_pearson
from proxy.calibration.replay import ACCEPT_LOWER, Usage, call_usd, escalation_usd, place, stored_action, walk
from proxy.policy.model import Policy
from proxy.state.feedback import AnswerRecord

CONFIDENCE = 0.95


@dataclass(frozen=True, slots=True)
class Accuracy:
    accepted: int
    correct: int
    low: float
    high: float

    @property
    def value(self) -> float:
        return self.correct / self.accepted if self.accepted else 0.0


@dataclass
class Simulation:
    answers: int = 0
    unplaced: int = 0
    """Answers of targets the candidate's ladder does not list (left out)."""
    without_risk: int = 0
    """Answers whose record kept no risk (0.4's): decided on their confidence alone."""
    without_path: int = 0
    """Answers whose record kept no path (0.4's): only the rung that answered is replayed."""
    with_earlier: int = 0
    """Answers whose record kept at least one earlier rung the candidate places below it."""
    accepted_lower: int = 0
    """Answers the candidate accepts on an earlier rung: their correctness is unknown."""
    changes: Counter[tuple[str, str]] = field(default_factory=Counter)
    """(stored action, candidate action) -> answers, changed ones only."""
    cost_delta_usd: float = 0.0
    """Positive: the candidate spends more (escalations gained minus escalations lost)."""
    before: Accuracy | None = None
    after: Accuracy | None = None

    def as_json(self) -> dict[str, object]:
        return {
            "answers": self.answers,
            "unplaced": self.unplaced,
            "without_risk": self.without_risk,
            "without_path": self.without_path,
            "with_earlier_rungs": self.with_earlier,
            "accepted_lower_rung": self.accepted_lower,
            "changed": sum(self.changes.values()),
            "changes": [{"from": a, "to": b, "answers": n} for (a, b), n in sorted(self.changes.items())],
            "cost_delta_usd": round(self.cost_delta_usd, 6),
            "accepted_accuracy": {
                name: None
                if acc is None
                else {
                    "accepted": acc.accepted,
                    "correct": acc.correct,
                    "accuracy": round(acc.value, 6),
                    "ci95": [round(acc.low, 6), round(acc.high, 6)],
                }
                for name, acc in (("stored", self.before), ("candidate", self.after))
            },
        }


def _accuracy(pairs: Sequence[tuple[bool, bool]]) -> Accuracy:
    """Of (accepted, correct) pairs: the accepted ones' accuracy and its exact interval."""
    accepted = [correct for taken, correct in pairs if taken]
    low, high = clopper_pearson(sum(accepted), len(accepted), 1 - CONFIDENCE) if accepted else (0.0, 1.0)
    return Accuracy(len(accepted), sum(accepted), low, high)


def simulate(candidate: Policy, records: Sequence[AnswerRecord], usage: Usage) -> Simulation:
    placed = place(candidate, [r for r in records if r.verdict is not None])
    out = Simulation(answers=len(placed.records), unplaced=len(placed.unplaced))
    before, after = [], []
    for record, rung in placed.records:
        out.without_risk += not record.risk
        out.without_path += record.path is None
        then, now = stored_action(record), walk(candidate, record, rung)
        out.with_earlier += now.earlier
        out.accepted_lower += now.action == ACCEPT_LOWER
        if then != now.action:
            out.changes[(then, now.action)] += 1
        if now.action == "escalate":  # one more call on the next rung
            out.cost_delta_usd += escalation_usd(candidate, rung, usage)
        out.cost_delta_usd -= sum(call_usd(candidate, target, usage) for target in now.calls_saved)
        correct = record.verdict == "correct"
        before.append((then == "accept", correct))
        after.append((now.action == "accept", correct))
    out.before, out.after = _accuracy(before), _accuracy(after)
    return out


def render(sim: Simulation, usage: Usage) -> str:
    lines = [f"{sim.answers} judged answers replayed"]
    if sim.unplaced:
        lines[0] += (
            f" ({sim.unplaced} left out: "
            "their targets are on no rung of the candidate, or their tiers not in it)"
        )
    if sim.without_risk:
        lines.append(f"{sim.without_risk} stored no risk (older records): decided on confidence alone")
    if sim.without_path:
        lines.append(
            f"{sim.without_path} stored no earlier rungs (older records): only the rung that answered "
            "is replayed, a lower rung's answer is not invented"
        )
    lines.append(f"{sim.with_earlier} went through earlier rungs the candidate decides again")
    lines += ["", f"{'decision':<30} {'answers':>8}"]
    for (then, now), n in sorted(sim.changes.items()):
        lines.append(f"{then + ' -> ' + _shown(now):<30} {n:>8}")
    lines.append(f"{'changed':<30} {sum(sim.changes.values()):>8}")
    if sim.accepted_lower:
        lines.append(
            f"{sim.accepted_lower} accepted on a lower rung: that answer was never judged (the verdict "
            "is the final rung's), so it is left out of the accuracy below"
        )
    lines += [
        "",
        f"cost change: {sim.cost_delta_usd:+.4f} USD over these answers (a call priced at "
        f"{usage.tokens_in} in / {usage.tokens_out} out tokens: an escalation past the stored rungs "
        "one call on the next rung, a stored call not made saved)",
        "",
        f"{'accepted answers':<18} {'answers':>8} {'correct':>8} {'accuracy':>9} {'95% interval':>16}",
    ]
    for name, acc in (("stored", sim.before), ("candidate", sim.after)):
        assert acc is not None
        interval = f"{acc.low:.3f}..{acc.high:.3f}"
        lines.append(f"{name:<18} {acc.accepted:>8} {acc.correct:>8} {acc.value:>9.3f} {interval:>16}")
    return "\n".join(lines)


def _shown(action: str) -> str:
    return "accept (lower rung)" if action == ACCEPT_LOWER else action
