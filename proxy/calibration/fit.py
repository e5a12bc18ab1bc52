"""Isotonic regression (pool-adjacent-violators) for ``cogproxy calibration fit``.

Why not scikit-learn: it would pull numpy and scipy (~100 MB) into a sidecar for one loop of
twenty lines; PAV on at most a few thousand weighted points is exact, linear after the sort, and
tested here against its defining properties (monotone, weighted least squares, block means).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from proxy.policy.calibration import CalibrationMap

GRID = 100
"""Reported confidences are grouped to 1/GRID before fitting: at most GRID + 1 map points (the
policy schema allows 101), and ties are pooled before PAV."""
MIN_POINTS = 2


@dataclass(frozen=True, slots=True)
class Point:
    """``weight`` observations at reported confidence ``x`` with mean correctness ``y``."""

    x: float
    y: float
    weight: float = 1.0


@dataclass(frozen=True, slots=True)
class Block:
    """A pooled run of PAV: its weighted mean ``x``, mean correctness ``y`` and ``weight``, and
    the range ``lo``..``hi`` of the reported confidences it covers."""

    x: float
    y: float
    weight: float
    lo: float
    hi: float


def pava(points: Iterable[Point]) -> list[Block]:
    """The weighted isotonic (non-decreasing) fit: one block per pooled run, x strictly increasing
    when the inputs' x are distinct."""
    blocks: list[list[float]] = []  # [weight, sum w*x, sum w*y, lo, hi]
    for p in sorted(points, key=lambda p: p.x):
        if p.weight <= 0:
            continue
        blocks.append([p.weight, p.weight * p.x, p.weight * p.y, p.x, p.x])
        while len(blocks) > 1 and blocks[-2][2] / blocks[-2][0] > blocks[-1][2] / blocks[-1][0]:
            w, wx, wy, _, hi = blocks.pop()
            blocks[-1][0] += w
            blocks[-1][1] += wx
            blocks[-1][2] += wy
            blocks[-1][4] = hi
    return [Block(wx / w, wy / w, w, lo, hi) for w, wx, wy, lo, hi in blocks]


def grouped(points: Iterable[Point], grid: int = GRID) -> list[Point]:
    """Points pooled on a grid of 1/``grid`` (their weighted means kept)."""
    cells: dict[int, list[float]] = {}
    for p in points:
        cell = cells.setdefault(round(p.x * grid), [0.0, 0.0, 0.0])
        cell[0] += p.weight
        cell[1] += p.weight * p.x
        cell[2] += p.weight * p.y
    return [Point(wx / w, wy / w, w) for w, wx, wy in (cells[k] for k in sorted(cells)) if w > 0]


def fit_map(points: Iterable[Point]) -> CalibrationMap | None:
    """The isotonic map: each PAV block a flat segment over its range of reported confidences
    (scikit-learn's semantics), joined linearly to the next; a single block is a flat map (a model
    whose confidence tells nothing). None without points."""
    corners: list[tuple[float, float]] = []
    for b in pava(grouped(points)):
        y = round(min(1.0, max(0.0, b.y)), 4)
        corners += [(round(b.lo, 4), y), (round(b.hi, 4), y)]
    if not corners:
        return None
    kept_x, kept_y = [corners[0][0]], [corners[0][1]]
    for x, y in corners[1:]:
        if x > kept_x[-1]:  # a one-point block, or rounding, ties two corners: keep a function
            kept_x.append(x)
            kept_y.append(max(y, kept_y[-1]))
        else:
            kept_y[-1] = max(y, kept_y[-1])
    if len(kept_x) < MIN_POINTS:  # one reported confidence: flat everywhere
        return CalibrationMap((0.0, 1.0), (kept_y[0], kept_y[0]))
    return CalibrationMap(tuple(kept_x), tuple(kept_y))
