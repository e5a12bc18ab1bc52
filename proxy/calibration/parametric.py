"""Platt and temperature maps fitted by maximum likelihood (``cogproxy calibration fit``).

Platt: ``sigmoid(a * logit(p) + b)``; temperature: ``sigmoid(logit(p) / T)``, Platt with
``b = 0``. Both are logistic regressions on ``logit(p)`` with one or two parameters: Newton's
method on the convex weighted log-loss converges in a handful of steps, no numerical library
needed. The policy requires ``a > 0`` (a monotone map): when the likelihood's optimum is at
``a <= 0`` (confidence that tells nothing, or worse) the fit is held at ``A_MIN``, where the
convex loss is lowest on the admissible side.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from proxy.calibration.fit import Point
from proxy.policy.calibration import EPS, CalibrationMap

A_MIN = 1e-3
"""The least slope proposed: the policy refuses ``a <= 0`` (temperature ``T <= 0``)."""
STEPS = 100
TOLERANCE = 1e-10


def logit(p: float) -> float:
    q = min(max(p, EPS), 1 - EPS)
    return math.log(q / (1 - q))


def sigmoid(z: float) -> float:
    return 1 / (1 + math.exp(-z)) if z >= 0 else math.exp(z) / (1 + math.exp(z))


def _loss(data: Sequence[tuple[float, float, float]], a: float, b: float) -> float:
    total = 0.0
    for z, y, w in data:
        t = a * z + b
        # -(y log q + (1-y) log(1-q)) with q = sigmoid(t), written to stay finite for large |t|
        total += w * (max(t, 0.0) - t * y + math.log1p(math.exp(-abs(t))))
    return total


def _newton(points: Sequence[Point], a: float, b: float, fit_a: bool, fit_b: bool) -> tuple[float, float]:
    """Minimise the weighted log-loss of ``sigmoid(a * logit(x) + b)`` over the free parameters:
    Newton steps, halved until the loss goes down (a full step can overshoot far from the optimum)."""
    data = [(logit(p.x), p.y, p.weight) for p in points if p.weight > 0]
    loss = _loss(data, a, b)
    for _ in range(STEPS):
        ga = gb = haa = hab = hbb = 0.0
        for z, y, w in data:
            q = sigmoid(a * z + b)
            r = w * (q - y)
            s = w * max(q * (1 - q), 1e-12)
            ga, gb = ga + r * z, gb + r
            haa, hab, hbb = haa + s * z * z, hab + s * z, hbb + s
        if fit_a and fit_b:
            det = haa * hbb - hab * hab
            if det <= 1e-18:
                break
            da, db = (hbb * ga - hab * gb) / det, (haa * gb - hab * ga) / det
        else:
            da = ga / haa if fit_a and haa > 0 else 0.0
            db = gb / hbb if fit_b and hbb > 0 else 0.0
        step = 1.0
        while step > 1e-6 and _loss(data, a - step * da, b - step * db) > loss:
            step /= 2
        a, b = a - step * da, b - step * db
        loss = _loss(data, a, b)
        if step * (abs(da) + abs(db)) < TOLERANCE:
            break
    return a, b


def _top(points: Sequence[Point]) -> float | None:
    """The highest confidence seen: a fitted curve past it is extrapolation, and a logistic one
    climbs fast there (logit(1) is clamped to ~13.8), so the map stays flat above it."""
    seen = [p.x for p in points if p.weight > 0]
    return max(seen) if seen and max(seen) < 1 - EPS else None


def fit_platt(points: Sequence[Point]) -> CalibrationMap:
    a, b = _newton(points, 1.0, 0.0, fit_a=True, fit_b=True)
    if a < A_MIN:  # convex loss: the admissible optimum lies on the boundary a = A_MIN
        a, b = _newton(points, A_MIN, 0.0, fit_a=False, fit_b=True)
        a = A_MIN
    return CalibrationMap(a=a, b=b, upto=_top(points))


def fit_temperature(points: Sequence[Point]) -> CalibrationMap:
    a, _ = _newton(points, 1.0, 0.0, fit_a=True, fit_b=False)
    return CalibrationMap(a=max(a, A_MIN), upto=_top(points))
