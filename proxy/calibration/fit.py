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


def pava(points: Iterable[Point]) -> list[Point]:
    """The weighted isotonic (non-decreasing) fit: one block per pooled run, as (weighted mean x,
    block mean y, block weight), x strictly increasing when the inputs' x are distinct."""
    blocks: list[list[float]] = []  # [weight, sum w*x, sum w*y]
    for p in sorted(points, key=lambda p: p.x):
        if p.weight <= 0:
            continue
        blocks.append([p.weight, p.weight * p.x, p.weight * p.y])
        while len(blocks) > 1 and blocks[-2][2] / blocks[-2][0] > blocks[-1][2] / blocks[-1][0]:
            w, wx, wy = blocks.pop()
            blocks[-1][0] += w
            blocks[-1][1] += wx
            blocks[-1][2] += wy
    return [Point(wx / w, wy / w, w) for w, wx, wy in blocks]


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
    """A monotone piecewise-linear map through the PAV block means; None with fewer than two
    distinct blocks (nothing to interpolate: too few or too uniform verdicts)."""
    blocks = pava(grouped(points))
    if len(blocks) < MIN_POINTS:
        return None
    xs = [round(b.x, 4) for b in blocks]
    ys = [round(min(1.0, max(0.0, b.y)), 4) for b in blocks]
    kept_x, kept_y = [xs[0]], [ys[0]]
    for x, y in zip(xs[1:], ys[1:], strict=True):
        if x > kept_x[-1]:  # rounding may tie two blocks: keep the map a function
            kept_x.append(x)
            kept_y.append(max(y, kept_y[-1]))
    if len(kept_x) < MIN_POINTS:
        return None
    return CalibrationMap(tuple(kept_x), tuple(kept_y))
