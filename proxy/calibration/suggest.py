"""``cogproxy policy tune``'s suggestions, per module and per tier, from judged answers (pure):
what the command prints and the review console's reliability view shows."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from proxy.calibration.replay import place
from proxy.calibration.tune import Tuned, Verdict, tune
from proxy.policy.model import Policy, Thresholds
from proxy.state.feedback import AnswerRecord

DEFAULT_TARGET_ACCURACY = 0.9
"""The console's target when its page names none (``policy tune`` requires one)."""
TARGET_BOUNDS = (0.5, 0.999)
"""The targets the console takes (``?target=``): below one in two is no target, and at 0.999
no realistic count of verdicts passes."""
DELTA_BOUNDS = (0.001, 0.5)
"""The risks the console takes (``?delta=``)."""


@dataclass(frozen=True, slots=True)
class Group:
    """Verdicts a threshold is tuned on: one module's, or a tier's modules' pooled."""

    kind: str
    """``module`` or ``tier``."""
    name: str
    tier: str
    answers: list[tuple[AnswerRecord, int]]


@dataclass(frozen=True, slots=True)
class Suggestion:
    group: Group
    tuned: Tuned
    current: Thresholds
    """The thresholds in force for the group (a module's overrides applied)."""


@dataclass(frozen=True, slots=True)
class Suggestions:
    rows: list[Suggestion]
    unplaced: int
    """Verdicts left out: their targets are on no rung of the policy."""


def groups(placed: Sequence[tuple[AnswerRecord, int]], pooled: bool) -> list[Group]:
    modules: dict[tuple[str, str], list[tuple[AnswerRecord, int]]] = {}
    tiers: dict[str, list[tuple[AnswerRecord, int]]] = {}
    for record, rung in placed:
        modules.setdefault((record.module, record.tier), []).append((record, rung))
        tiers.setdefault(record.tier, []).append((record, rung))
    out = [Group("module", m, t, rows) for (m, t), rows in sorted(modules.items())]
    if pooled:
        out += [Group("tier", t, t, rows) for t, rows in sorted(tiers.items())]
    return out


def current(policy: Policy, group: Group) -> Thresholds:
    if group.kind == "tier":
        return policy.tiers[group.tier]
    return policy.thresholds_for(group.name, group.tier)


def suggest(
    policy: Policy,
    records: Sequence[AnswerRecord],
    target_accuracy: float,
    delta: float,
    *,
    pooled: bool = True,
) -> Suggestions:
    """Per module (and per tier, ``pooled``) the tuned threshold of the judged ``records``, on
    the calibrated confidence the policy's maps give (what a threshold is compared with)."""
    judged = [r for r in records if r.verdict is not None]
    placed = place(policy, judged)
    rows = []
    for group in groups(placed.records, pooled):
        verdicts = [
            Verdict(policy.calibrate(f"{r.provider}/{r.model}", r.confidence), r.verdict == "correct")
            for r, _ in group.answers
        ]
        rows.append(Suggestion(group, tune(verdicts, target_accuracy, delta), current(policy, group)))
    return Suggestions(rows, len(placed.unplaced))


def within(value: float, bounds: tuple[float, float]) -> bool:
    low, high = bounds
    return low <= value <= high
