"""Which map to propose: isotonic, Platt or temperature, by cross-validated log-loss.

Each kind is fitted on all folds but one and scored on the verdicts it did not see; the one with
the lowest held-out log-loss is refitted on every verdict and proposed. The held-out ECE and
Brier score, before (the reported confidence) and after (the map fitted without them), are what
the operator reads to judge the proposal.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from proxy.calibration.fit import Point, fit_map
from proxy.calibration.parametric import fit_platt, fit_temperature
from proxy.policy.calibration import EPS, CalibrationMap

FOLDS = 5
SEED = 34
"""Folds are drawn with a fixed seed: the same verdicts give the same proposal."""
ECE_BINS = 10


def _isotonic(points: Sequence[Point]) -> CalibrationMap:
    fitted = fit_map(points)
    return fitted if fitted is not None else CalibrationMap((0.0, 1.0), (0.5, 0.5))


FITTERS: dict[str, Callable[[Sequence[Point]], CalibrationMap]] = {
    "isotonic": _isotonic,
    "platt": fit_platt,
    "temperature": fit_temperature,
}


def as_yaml(kind: str, mapping: CalibrationMap) -> dict[str, object]:
    """The policy's ``calibration.<target>`` entry (a temperature map as ``temperature: T``, or
    as its Platt form ``a = 1/T, b = 0`` when it is flat above ``upto``)."""
    if kind == "temperature" and mapping.upto is None:
        return {"temperature": round(1 / mapping.a, 6)}
    return mapping.as_yaml()


@dataclass(frozen=True, slots=True)
class HeldOut:
    """One kind's figures on verdicts its fit did not see (``before``: the reported confidence)."""

    kind: str
    log_loss: float
    ece_before: float
    ece_after: float
    brier_before: float
    brier_after: float


@dataclass(frozen=True, slots=True)
class Choice:
    kind: str
    mapping: CalibrationMap
    scores: list[HeldOut]

    def as_yaml(self) -> dict[str, object]:
        return as_yaml(self.kind, self.mapping)


def observations(points: Sequence[Point]) -> list[Point]:
    """Unit-weight verdicts: a counter bin of weight w and accuracy y becomes round(w*y) correct
    and round(w*(1-y)) incorrect answers at its confidence (so folds split answers, not bins)."""
    out: list[Point] = []
    for p in points:
        if p.weight == 1:
            out.append(p)
            continue
        right = round(p.weight * p.y)
        out += [Point(p.x, 1.0)] * right + [Point(p.x, 0.0)] * (round(p.weight) - right)
    return out


def log_loss(pairs: Sequence[tuple[float, float]]) -> float:
    """Mean of ``-(y log q + (1-y) log(1-q))`` over (prediction q, correctness y)."""
    total = 0.0
    for q, y in pairs:
        q = min(max(q, EPS), 1 - EPS)
        total -= y * math.log(q) + (1 - y) * math.log(1 - q)
    return total / len(pairs)


def ece(pairs: Sequence[tuple[float, float]]) -> float:
    """Expected calibration error over ECE_BINS bins of width 1/ECE_BINS (the dashboard's)."""
    bins: dict[int, list[float]] = {}
    for q, y in pairs:
        cell = bins.setdefault(min(int(q * ECE_BINS), ECE_BINS - 1), [0.0, 0.0])
        cell[0] += q - y
        cell[1] += 1
    return sum(abs(gap) for gap, _ in bins.values()) / len(pairs)


def brier(pairs: Sequence[tuple[float, float]]) -> float:
    return sum((q - y) ** 2 for q, y in pairs) / len(pairs)


def held_out(points: Sequence[Point], folds: int = FOLDS) -> list[HeldOut]:
    """Each kind's cross-validated figures (needs at least ``folds`` verdicts)."""
    rows = sorted(observations(points), key=lambda p: (p.x, p.y))  # as read: in any order
    random.Random(SEED).shuffle(rows)
    out = []
    for kind, fitter in FITTERS.items():
        after: list[tuple[float, float]] = []
        truth: list[tuple[float, float]] = []
        for k in range(folds):
            train = [p for i, p in enumerate(rows) if i % folds != k]
            mapping = fitter(train)
            for p in rows[k::folds]:
                after.append((mapping(p.x), p.y))
                truth.append((p.x, p.y))
        out.append(HeldOut(kind, log_loss(after), ece(truth), ece(after), brier(truth), brier(after)))
    return out


def choose(points: Sequence[Point], folds: int = FOLDS) -> Choice:
    """The kind with the lowest held-out log-loss, refitted on every verdict."""
    scores = held_out(points, folds)
    best = min(scores, key=lambda s: s.log_loss)
    return Choice(best.kind, FITTERS[best.kind](observations(points)), scores)
