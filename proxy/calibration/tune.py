"""Thresholds from verdicts with a finite-sample guarantee (``cogproxy policy tune``).

For a target accuracy ``A`` and a risk ``delta``: the lowest ``min_confidence`` on a grid such
that, with probability at least ``1 - delta`` over the verdicts, the accuracy of the answers it
accepts is at least ``A``. Each threshold ``t`` is a hypothesis "the error rate among answers at
or above ``t`` exceeds ``1 - A``", rejected when the Clopper-Pearson upper bound of that error rate
at level ``delta`` is at most ``1 - A``. The thresholds are tested in a fixed order, strict to
loose, stopping at the first that is not rejected (fixed-sequence testing): the family-wise error
stays at ``delta`` without a multiplicity correction, so the guarantee holds for the threshold
chosen, not only for each one tested (Angelopoulos et al., "Learn then Test", 2021). Thresholds
accepting fewer answers than any bound could ever pass on are not tested (that count depends on
``A`` and ``delta`` alone, never on the verdicts).

What it does not cover: the bound is about the population the verdicts came from. Traffic that
drifts, or verdicts given to a biased sample of answers, are outside it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from proxy.calibration.bounds import bound_at_most, error_upper_bound

GRID = tuple(round(1 - i / 100, 2) for i in range(101))
"""Candidate thresholds, strict to loose (the order of the fixed sequence)."""
MAX_VERDICTS = 10_000_000
"""The most verdicts ``more_needed`` searches up to."""


@dataclass(frozen=True, slots=True)
class Verdict:
    """A judged answer as the threshold sees it: the confidence decided on, right or not."""

    confidence: float
    correct: bool


@dataclass(frozen=True, slots=True)
class Tuned:
    """The outcome for one group of verdicts (a module, or a tier's modules pooled)."""

    verdicts: int
    threshold: float | None
    """None: no threshold passes (too few verdicts, or accuracy below the target everywhere)."""
    accepted: int = 0
    errors: int = 0
    bound: float = 1.0
    """Upper bound on the error rate of the accepted answers (probability ``1 - delta``)."""
    more_needed: int | None = None
    """With no threshold: about how many more verdicts like these would give one; None when
    none would (the observed accuracy is below the target at every threshold)."""

    @property
    def accuracy_bound(self) -> float:
        return 1 - self.bound

    @property
    def accepted_share(self) -> float:
        return self.accepted / self.verdicts if self.verdicts else 0.0


def first_tested(target_accuracy: float, delta: float) -> int:
    """Where the sequence starts: the first threshold accepting at least this many answers, the
    fewest whose bound passes at half the tolerated error rate. Stricter thresholds accept so few
    answers that one wrong one would end the sequence before it reaches any useful threshold; the
    count depends on the target, delta and how many answers each threshold accepts, never on the
    verdicts, so it keeps the order fixed."""
    epsilon = 1 - target_accuracy
    needed = _sample_size(epsilon / 2, epsilon, delta)
    assert needed is not None  # a rate below epsilon always passes with enough verdicts
    return needed


def _counts(verdicts: Sequence[Verdict]) -> list[tuple[float, int, int]]:
    """Per grid threshold, strict to loose: (threshold, answers at or above it, wrong ones)."""
    ordered = sorted(verdicts, key=lambda v: v.confidence, reverse=True)
    out, n, errors = [], 0, 0
    for threshold in GRID:
        while n < len(ordered) and ordered[n].confidence >= threshold:
            errors += not ordered[n].correct
            n += 1
        out.append((threshold, n, errors))
    return out


def tune(verdicts: Sequence[Verdict], target_accuracy: float, delta: float) -> Tuned:
    """The loosest threshold of the fixed sequence whose hypothesis is rejected (of thresholds
    accepting the same answers, the strictest: none below the confidences seen)."""
    if not 0 < target_accuracy < 1 or not 0 < delta < 1:
        raise ValueError("target accuracy and delta are in (0, 1)")
    epsilon = 1 - target_accuracy
    floor = first_tested(target_accuracy, delta)
    chosen: tuple[float, int, int] | None = None
    for threshold, n, errors in _counts(verdicts):
        if n < floor:
            continue
        if bound_at_most(errors, n, delta, epsilon):
            if chosen is None or n > chosen[1]:  # no looser than the answers seen: no extrapolation
                chosen = (threshold, n, errors)
        else:
            break
    if chosen is None:
        return Tuned(len(verdicts), None, more_needed=more_needed(verdicts, target_accuracy, delta))
    threshold, n, errors = chosen
    return Tuned(len(verdicts), threshold, n, errors, error_upper_bound(errors, n, delta))


def more_needed(verdicts: Sequence[Verdict], target_accuracy: float, delta: float) -> int | None:
    """About how many more verdicts, with the same accept share and error rate at the best
    threshold, would make the bound pass there; None when the error rate is above target."""
    epsilon, total = 1 - target_accuracy, len(verdicts)
    floor = first_tested(target_accuracy, delta)
    best: int | None = None
    seen: set[tuple[int, int]] = set()
    for _, n, errors in _counts(verdicts):
        if n == 0 or errors / n >= epsilon or (n, errors) in seen:
            continue
        seen.add((n, errors))  # neighbouring thresholds often accept the same answers
        needed = _sample_size(errors / n, epsilon, delta)
        if needed is None:
            continue
        more = max(1, math.ceil(max(needed, floor) * total / n) - total)
        best = more if best is None else min(best, more)
    return best


def _sample_size(rate: float, epsilon: float, delta: float) -> int | None:
    """The least n whose bound, at ``rate * n`` errors, is at most ``epsilon``."""

    def passes(n: int) -> bool:
        return bound_at_most(math.floor(rate * n), n, delta, epsilon)

    high = 1
    while not passes(high):
        high *= 2
        if high > MAX_VERDICTS:
            return None
    low = high // 2
    while high - low > 1:
        mid = (low + high) // 2
        if passes(mid):
            high = mid
        else:
            low = mid
    return high
