"""Stored answers under a policy: what it would decide, and what it would cost.

``cogproxy policy tune`` and ``cogproxy policy simulate`` both read the judged answers the proxy
stored and ask the same questions of each: which rung answered it (the first rung listing its
target), what confidence the policy decides on (its ``calibration:`` map of the reported one),
and what the pure ``decide()`` makes of it, the stored risk included. ``simulate`` also replays
the rungs a call went through before the one that answered (``AnswerRecord.path``), where the
record kept them. The store keeps no token counts, so a call is priced at ``Usage`` tokens (flags
of both commands).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from proxy.calibration.defaults import TOKENS_IN, TOKENS_OUT
from proxy.policy.decide import Meta, decide
from proxy.policy.model import Policy
from proxy.state.feedback import AnswerRecord, path_steps

KNOWN_RISK = "none"
"""The risk decided on when the record kept none (0.4 stored no risk): the confidence gate alone."""


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


def stored_action(record: AnswerRecord) -> str:
    """The decision stored, as an action: an answer accepted after escalating was accepted."""
    return "accept" if record.decision in ("accept", "escalated") else record.decision


@dataclass(frozen=True, slots=True)
class Placed:
    """The records a policy can place on its ladder, and those it cannot."""

    records: list[tuple[AnswerRecord, int]]
    unplaced: list[AnswerRecord]


def place(policy: Policy, records: Sequence[AnswerRecord]) -> Placed:
    """Each record on the first rung of ``policy`` listing its target; unplaced when none does,
    or when ``policy`` has no tier of the record's name (a tier renamed or dropped since: no
    thresholds to decide it on)."""
    placed, unplaced = [], []
    for r in records:
        rung = rung_of(policy, f"{r.provider}/{r.model}") if r.tier in policy.tiers else None
        if rung is None:
            unplaced.append(r)
        else:
            placed.append((r, rung))
    return Placed(placed, unplaced)


@dataclass(frozen=True, slots=True)
class Step:
    """One rung's stored answer: its target, reported confidence and risk ("" unknown)."""

    target: str
    confidence: float
    risk: str


ACCEPT_LOWER = "accept_lower"
"""The candidate's action when it accepts the answer of a rung below the one that answered: that
answer was never judged (the verdict is the final answer's)."""


@dataclass(frozen=True, slots=True)
class Walked:
    """A stored call replayed under a policy, rung by stored rung."""

    action: str
    """accept, accept_lower, escalate (past the last stored rung), review or reject."""
    calls_saved: tuple[str, ...] = ()
    """Targets of the stored calls the candidate would not make (it decided on an earlier rung)."""
    earlier: bool = False
    """The record kept earlier rungs the policy places below the answer's (decided first)."""


def walk(policy: Policy, record: AnswerRecord, rung: int) -> Walked:
    """Decide ``record``'s stored rungs in order under ``policy``: the earlier rungs of its path
    (those on a rung of ``policy`` below the next stored one), then the answer itself on ``rung``.
    The first decision that is not an escalation to the next stored rung is the candidate's."""
    final = Step(f"{record.provider}/{record.model}", record.confidence, record.risk)
    steps = [Step(*s) for s in path_steps(record.path) or ()] + [final]
    placed = [(step, rung_of(policy, step.target)) for step in steps[:-1]] + [(final, rung)]
    chain: list[tuple[Step, int]] = []
    for step, at in reversed(placed):  # from the answer down: each earlier rung strictly below
        if at is not None and (not chain or at < chain[0][1]):
            chain.insert(0, (step, at))
    thresholds = policy.thresholds_for(record.module, record.tier)
    for index, (step, at) in enumerate(chain):
        meta = Meta(policy.calibrate(step.target, step.confidence), step.risk or KNOWN_RISK)
        action = decide(thresholds, meta, at, len(policy.ladder)).action
        last = index == len(chain) - 1
        if action == "escalate" and not last:
            continue
        saved = tuple(later.target for later, _ in chain[index + 1 :])
        return Walked(ACCEPT_LOWER if action == "accept" and not last else action, saved, len(chain) > 1)
    raise AssertionError("a chain ends with the answer itself")
