"""Calibration maps: a target's reported confidence -> the calibrated confidence decided on.

A map is monotone (non-decreasing) by construction and by load-time validation, so a higher
reported confidence never routes worse than a lower one. Three shapes, one per target:

* ``points``: piecewise-linear through ``(reported, calibrated)`` points, flat outside them
  (what ``cogproxy calibration fit`` proposes: isotonic regression is a step function, and its
  block means joined linearly stay monotone);
* ``platt``: ``sigmoid(a * logit(p) + b)`` with ``a > 0``; flat above ``upto`` when given (a
  fitted map: the highest confidence it saw, past which a logistic curve is extrapolation);
* ``temperature``: ``sigmoid(logit(p) / T)`` (Platt with ``a = 1/T``, ``b = 0``).
"""

from __future__ import annotations

import math
from bisect import bisect_right
from dataclasses import dataclass

# logit(0) and logit(1) are infinite: Platt maps clamp p into [EPS, 1 - EPS] first.
EPS = 1e-6


@dataclass(frozen=True, slots=True)
class CalibrationMap:
    """One target's map; ``xs``/``ys`` for points, else ``a``/``b`` of the Platt form."""

    xs: tuple[float, ...] = ()
    ys: tuple[float, ...] = ()
    a: float = 1.0
    b: float = 0.0
    upto: float | None = None
    """Platt: the map is flat above this reported confidence (None: not bounded)."""

    def __call__(self, p: float) -> float:
        if self.xs:
            return _interpolate(self.xs, self.ys, p)
        if self.upto is not None and p > self.upto:
            p = self.upto
        q = min(max(p, EPS), 1 - EPS)
        z = self.a * math.log(q / (1 - q)) + self.b
        return 1 / (1 + math.exp(-z)) if z >= 0 else math.exp(z) / (1 + math.exp(z))

    def as_yaml(self) -> dict[str, object]:
        """The policy's ``calibration.<target>`` entry for this map."""
        if self.xs:
            return {"points": [[round(x, 4), round(y, 4)] for x, y in zip(self.xs, self.ys, strict=True)]}
        platt: dict[str, float] = {"a": round(self.a, 6), "b": round(self.b, 6)}
        if self.upto is not None:
            platt["upto"] = round(self.upto, 4)
        return {"platt": platt}


def _interpolate(xs: tuple[float, ...], ys: tuple[float, ...], p: float) -> float:
    if p <= xs[0]:
        return ys[0]
    if p >= xs[-1]:
        return ys[-1]
    i = bisect_right(xs, p)
    x0, x1, y0, y1 = xs[i - 1], xs[i], ys[i - 1], ys[i]
    return y0 + (y1 - y0) * (p - x0) / (x1 - x0)


def points_problems(points: list[list[float]]) -> list[str]:
    """Why a points list is not a monotone map (empty when it is)."""
    problems = []
    for i in range(1, len(points)):
        if points[i][0] <= points[i - 1][0]:
            problems.append(
                f"points[{i}]: reported {points[i][0]} not above {points[i - 1][0]} (must increase)"
            )
        if points[i][1] < points[i - 1][1]:
            problems.append(
                f"points[{i}]: calibrated {points[i][1]} below {points[i - 1][1]} (the map must be monotone)"
            )
    return problems


def parse_map(raw: dict[str, object]) -> CalibrationMap:
    """A schema-valid ``calibration.<target>`` entry (monotonicity checked by the loader)."""
    if "points" in raw:
        points = raw["points"]
        assert isinstance(points, list)
        return CalibrationMap(tuple(float(x) for x, _ in points), tuple(float(y) for _, y in points))
    if "platt" in raw:
        platt = raw["platt"]
        assert isinstance(platt, dict)
        upto = platt.get("upto")
        return CalibrationMap(
            a=float(platt["a"]), b=float(platt["b"]), upto=None if upto is None else float(upto)
        )
    temperature = raw["temperature"]
    assert isinstance(temperature, (int, float))
    return CalibrationMap(a=1 / float(temperature))
