"""Reliability figures from verdicts: per model and confidence bin, ECE, Brier, per tier.

The same figures the dashboard derives from the ``cognitive_feedback_*`` counters, computed from
either source ``cogproxy calibration report`` reads: the counters (through Prometheus's API) or
the stored answers (Redis). With ``n_b`` verdicts in bin ``b``, ``C_b`` the sum of their
confidences and ``S_b`` the sum of their correctness, ``ECE = sum_b |S_b - C_b| / sum_b n_b``
(the usual ``sum_b n_b/N * |acc_b - conf_b|``, written with sums so counters can give it).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from proxy.observability.metrics import feedback_bucket
from proxy.state.feedback import AnswerRecord

ACCEPTED = ("accept", "escalated")


@dataclass
class Bin:
    count: float = 0.0
    confidence: float = 0.0
    correct: float = 0.0

    @property
    def accuracy(self) -> float:
        return self.correct / self.count if self.count else 0.0

    @property
    def mean_confidence(self) -> float:
        return self.confidence / self.count if self.count else 0.0


@dataclass
class ModelReliability:
    """One ``provider/model`` on one scale (reported or calibrated confidence)."""

    bins: dict[str, Bin] = field(default_factory=dict)
    brier: float = 0.0
    """Sum of squared errors."""

    @property
    def count(self) -> float:
        return sum(b.count for b in self.bins.values())

    @property
    def ece(self) -> float:
        n = self.count
        return sum(abs(b.correct - b.confidence) for b in self.bins.values()) / n if n else 0.0

    @property
    def brier_score(self) -> float:
        n = self.count
        return self.brier / n if n else 0.0


@dataclass
class Reliability:
    models: dict[tuple[str, str], ModelReliability] = field(default_factory=dict)
    """(provider/model, scale) -> figures"""
    outcomes: dict[tuple[str, str], Bin] = field(default_factory=dict)
    """(tier, decision) -> verdict count and correct count"""
    would_have_been: dict[tuple[str, str], float] = field(default_factory=dict)
    """(provider/model, tier) -> accepted answers judged incorrect that came in above the threshold"""
    skipped: int = 0
    """Stored records left out as malformed (Redis only: another version's, damaged, hand-edited)."""

    def model(self, target: str, scale: str) -> ModelReliability:
        return self.models.setdefault((target, scale), ModelReliability())


def from_records(records: Iterable[AnswerRecord]) -> Reliability:
    """The figures of the judged records (their latest verdicts)."""
    out = Reliability()
    for r in records:
        if r.verdict is None or r.score is None:
            continue
        target = f"{r.provider}/{r.model}"
        for scale, p in (("reported", r.confidence), ("calibrated", r.calibrated)):
            figures = out.model(target, scale)
            cell = figures.bins.setdefault(feedback_bucket(p), Bin())
            cell.count += 1
            cell.confidence += p
            cell.correct += r.score
            figures.brier += (p - r.score) ** 2
        outcome = out.outcomes.setdefault((r.tier, r.decision), Bin())
        outcome.count += 1
        outcome.correct += r.verdict == "correct"
        if r.decision in ACCEPTED and r.calibrated >= r.min_confidence and r.verdict == "incorrect":
            key = (target, r.tier)
            out.would_have_been[key] = out.would_have_been.get(key, 0) + 1
    return out


def render(rel: Reliability) -> str:
    """The terminal table: per model and scale, then its bins; per tier and decision; would-have-been."""
    lines = [f"{'model':<32} {'scale':<10} {'verdicts':>9} {'ECE':>7} {'Brier':>7}"]
    for (target, scale), m in sorted(rel.models.items()):
        lines.append(f"{target:<32} {scale:<10} {m.count:>9.0f} {m.ece:>7.3f} {m.brier_score:>7.3f}")
    lines += [
        "",
        f"{'model':<32} {'scale':<10} {'bin':>5} {'verdicts':>9} {'confidence':>11} {'accuracy':>9}",
    ]
    for (target, scale), m in sorted(rel.models.items()):
        for bucket, b in sorted(m.bins.items()):
            figures = f"{b.count:>9.0f} {b.mean_confidence:>11.3f} {b.accuracy:>9.3f}"
            lines.append(f"{target:<32} {scale:<10} {bucket:>5} {figures}")
    lines += ["", f"{'tier':<12} {'decision':<10} {'verdicts':>9} {'accuracy':>9}"]
    for (tier, decision), b in sorted(rel.outcomes.items()):
        lines.append(f"{tier:<12} {decision:<10} {b.count:>9.0f} {b.accuracy:>9.3f}")
    lines += ["", "accepted answers judged incorrect that came in at or above their tier's threshold:"]
    for (target, tier), count in sorted(rel.would_have_been.items()):
        lines.append(f"{target:<32} {tier:<12} {count:>9.0f}")
    if not rel.would_have_been:
        lines.append("none")
    return "\n".join(lines)
