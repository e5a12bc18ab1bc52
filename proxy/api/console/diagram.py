"""A reliability diagram as numbers for an inline SVG: per model and scale, each confidence bin
placed at (mean confidence, accuracy) against the diagonal, sized by its verdicts. The figures
are ``proxy.calibration.reliability``'s, the ones ``cogproxy calibration report`` prints."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from proxy.calibration.reliability import Reliability, from_records
from proxy.state.feedback import AnswerRecord

SIZE = 240
"""The plot's side in SVG units (the axes' 0..1 spans it)."""
MARGIN = 32
MAX_RADIUS = 12.0
MIN_RADIUS = 3.0


@dataclass(frozen=True, slots=True)
class Dot:
    bucket: str
    count: float
    confidence: float
    accuracy: float
    x: float
    y: float
    r: float


@dataclass(frozen=True, slots=True)
class Diagram:
    target: str
    scale: str
    """reported | calibrated"""
    verdicts: float
    ece: float
    brier: float
    dots: tuple[Dot, ...]


def _x(p: float) -> float:
    return round(MARGIN + p * SIZE, 2)


def _y(p: float) -> float:
    return round(MARGIN + (1 - p) * SIZE, 2)


def diagrams(rel: Reliability) -> list[Diagram]:
    """One diagram per (model, scale), sorted as the report sorts them."""
    out = []
    for (target, scale), figures in sorted(rel.models.items()):
        most = max((b.count for b in figures.bins.values()), default=1.0) or 1.0
        dots = tuple(
            Dot(
                bucket,
                b.count,
                b.mean_confidence,
                b.accuracy,
                _x(b.mean_confidence),
                _y(b.accuracy),
                round(MIN_RADIUS + (MAX_RADIUS - MIN_RADIUS) * b.count / most, 2),
            )
            for bucket, b in sorted(figures.bins.items())
        )
        out.append(Diagram(target, scale, figures.count, figures.ece, figures.brier_score, dots))
    return out


def diagrams_of(records: Iterable[AnswerRecord]) -> list[Diagram]:
    return diagrams(from_records(records))


TICKS = tuple((round(t / 10, 1), _x(t / 10), _y(t / 10)) for t in range(0, 11, 2))
"""(value, x, y) of the axes' ticks."""
