"""Stored answers under a policy: what it would decide, and what it would cost.

``cogproxy policy tune`` and ``cogproxy policy simulate`` both read the judged answers the proxy
stored and ask the same questions of each: which rung answered it (the first rung listing its
target), what confidence the policy decides on (its ``calibration:`` map of the reported one),
and what the pure ``decide()`` makes of it. The store keeps no token counts, so an escalation is
priced as one more call on the next rung at ``Usage`` tokens (flags of both commands).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from proxy.policy.decide import Meta, decide
from proxy.policy.model import Policy
from proxy.state.feedback import AnswerRecord

TOKENS_IN = 1000
TOKENS_OUT = 250
"""Tokens an escalation's extra call is priced at unless told (the store keeps no usage)."""
KNOWN_RISK = "none"
"""The risk decided on when the store kept none (Redis keeps no risk): the confidence gate alone."""


@dataclass(frozen=True, slots=True)
class Usage:
    tokens_in: int = TOKENS_IN
    tokens_out: int = TOKENS_OUT


def rung_of(policy: Policy, target: str) -> int | None:
    """The first rung listing ``target``; None when the policy has none."""
    for index, rung in enumerate(policy.ladder):
        if any(str(t) == target for t in rung.targets):
            return index
    return None


def call_usd(policy: Policy, target: str, usage: Usage) -> float:
    price = policy.price_of(target)
    if price is None:
        return 0.0
    return (usage.tokens_in * price.input_per_mtok + usage.tokens_out * price.output_per_mtok) / 1e6


def escalation_usd(policy: Policy, rung: int, usage: Usage) -> float:
    """One more call on the rung above ``rung`` (its first target); 0 on the top rung."""
    if rung + 1 >= len(policy.ladder) or not policy.ladder[rung + 1].targets:
        return 0.0
    return call_usd(policy, str(policy.ladder[rung + 1].targets[0]), usage)


@dataclass(frozen=True, slots=True)
class Replayed:
    """One stored answer under a policy."""

    record: AnswerRecord
    rung: int
    calibrated: float
    action: str
    """accept, escalate, review or reject."""

    @property
    def correct(self) -> bool:
        return self.record.verdict == "correct"

    @property
    def target(self) -> str:
        return f"{self.record.provider}/{self.record.model}"


def replay(policy: Policy, record: AnswerRecord, rung: int) -> Replayed:
    target = f"{record.provider}/{record.model}"
    calibrated = policy.calibrate(target, record.confidence)
    thresholds = policy.thresholds_for(record.module, record.tier)
    meta = Meta(calibrated, record.risk or KNOWN_RISK)
    return Replayed(record, rung, calibrated, decide(thresholds, meta, rung, len(policy.ladder)).action)


def stored_action(record: AnswerRecord) -> str:
    """The decision stored, as an action: an answer accepted after escalating was accepted."""
    return "accept" if record.decision in ("accept", "escalated") else record.decision


@dataclass(frozen=True, slots=True)
class Placed:
    """The records a policy can place on its ladder, and those it cannot."""

    records: list[tuple[AnswerRecord, int]]
    unplaced: list[AnswerRecord]


def place(policy: Policy, records: Sequence[AnswerRecord]) -> Placed:
    placed, unplaced = [], []
    for r in records:
        rung = rung_of(policy, f"{r.provider}/{r.model}")
        if rung is None:
            unplaced.append(r)
        else:
            placed.append((r, rung))
    return Placed(placed, unplaced)
