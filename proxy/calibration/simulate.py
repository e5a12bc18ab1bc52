"""``cogproxy policy simulate``: last week's judged answers decided again under a candidate policy.

``policy explain`` answers "what happens to this one call"; this answers "what happens to the
traffic the verdicts came from": the decisions that change, the cost of the escalations gained
or lost, and the accuracy of the answers the candidate accepts with its exact 95% interval.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field

from proxy.calibration.bounds import clopper_pearson
from proxy.calibration.replay import Usage, escalation_usd, place, replay, stored_action
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
        then, now = stored_action(record), replay(candidate, record, rung)
        if then != now.action:
            out.changes[(then, now.action)] += 1
            extra = escalation_usd(candidate, rung, usage)
            out.cost_delta_usd += extra * ((now.action == "escalate") - (then == "escalate"))
        before.append((then == "accept", now.correct))
        after.append((now.action == "accept", now.correct))
    out.before, out.after = _accuracy(before), _accuracy(after)
    return out


def render(sim: Simulation, usage: Usage) -> str:
    lines = [f"{sim.answers} judged answers replayed"]
    if sim.unplaced:
        lines[0] += f" ({sim.unplaced} left out: their targets are on no rung of the candidate)"
    lines += ["", f"{'decision':<22} {'answers':>8}"]
    for (then, now), n in sorted(sim.changes.items()):
        lines.append(f"{then + ' -> ' + now:<22} {n:>8}")
    lines.append(f"{'changed':<22} {sum(sim.changes.values()):>8}")
    lines += [
        "",
        f"cost change: {sim.cost_delta_usd:+.4f} USD over these answers (an escalation priced as one call "
        f"on the next rung at {usage.tokens_in} in / {usage.tokens_out} out tokens)",
        "",
        f"{'accepted answers':<18} {'answers':>8} {'correct':>8} {'accuracy':>9} {'95% interval':>16}",
    ]
    for name, acc in (("stored", sim.before), ("candidate", sim.after)):
        assert acc is not None
        interval = f"{acc.low:.3f}..{acc.high:.3f}"
        lines.append(f"{name:<18} {acc.accepted:>8} {acc.correct:>8} {acc.value:>9.3f} {interval:>16}")
    return "\n".join(lines)
