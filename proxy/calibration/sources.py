"""Where ``cogproxy calibration`` reads verdicts: Prometheus's HTTP API or the Redis store."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import aiohttp
from redis.exceptions import RedisError

from proxy.calibration.fit import Point
from proxy.calibration.reliability import Bin, Reliability, from_records
from proxy.state.feedback import AnswerRecord, scan_records
from proxy.state.redis_access import redacted
from proxy.state.redis_client import RedisOptions

PROMETHEUS_TIMEOUT_S = 30.0
WINDOW = re.compile(r"^\d+[smhdwy]$")
_MODULE = re.compile(r"^[a-z0-9][a-z0-9-]*$")


class SourceError(Exception):
    """The source could not be read (message for the operator)."""


def _selector(module: str | None, extra: str = "") -> str:
    parts = [f'module="{module}"'] if module else []
    if extra:
        parts.append(extra)
    return "{" + ",".join(parts) + "}"


async def _query(session: aiohttp.ClientSession, url: str, expr: str) -> list[dict[str, Any]]:
    try:
        async with session.post(f"{url.rstrip('/')}/api/v1/query", data={"query": expr}) as resp:
            body = await resp.json(content_type=None)
    except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
        raise SourceError(f"Prometheus at {url}: {exc or type(exc).__name__}") from exc
    if not isinstance(body, dict) or body.get("status") != "success":
        error = body.get("error") if isinstance(body, dict) else body
        raise SourceError(f"Prometheus at {url} refused {expr!r}: {error}")
    result: list[dict[str, Any]] = body["data"]["result"]
    return result


async def from_prometheus(url: str, window: str, module: str | None = None) -> Reliability:
    """The figures over the last ``window`` from the ``cognitive_feedback_*`` counters."""
    if not WINDOW.match(window):
        raise SourceError(f"window {window!r}: a Prometheus duration such as 1h, 7d")
    if module is not None and not _MODULE.match(module):
        raise SourceError(f"module {module!r}: not a module name")
    rel = Reliability()
    by = "provider, model, scale, bucket"
    sel = _selector(module)

    def increase(metric: str, by: str, selector: str = sel) -> str:
        return f"sum by ({by}) (increase({metric}{selector}[{window}]))"

    def bins(field: str) -> Callable[[dict[str, str], float], None]:
        def put(labels: dict[str, str], value: float) -> None:
            target = f"{labels['provider']}/{labels['model']}"
            cell = rel.model(target, labels["scale"]).bins.setdefault(labels["bucket"], Bin())
            setattr(cell, field, value)

        return put

    def brier(labels: dict[str, str], value: float) -> None:
        rel.model(f"{labels['provider']}/{labels['model']}", labels["scale"]).brier = value

    def outcome(labels: dict[str, str], value: float) -> None:
        cell = rel.outcomes.setdefault((labels["tier"], labels["decision"]), Bin())
        cell.count += value
        if labels["verdict"] == "correct":
            cell.correct += value

    def would(labels: dict[str, str], value: float) -> None:
        rel.would_have_been[(f"{labels['provider']}/{labels['model']}", labels["tier"])] = value

    wrong_above = _selector(module, 'decision=~"accept|escalated",gate="above",verdict="incorrect"')
    queries: list[tuple[str, Callable[[dict[str, str], float], None]]] = [
        (increase("cognitive_feedback_total", by), bins("count")),
        (increase("cognitive_feedback_confidence_total", by), bins("confidence")),
        (increase("cognitive_feedback_correct_total", by), bins("correct")),
        (increase("cognitive_feedback_brier_total", "provider, model, scale"), brier),
        (increase("cognitive_feedback_outcomes_total", "tier, decision, verdict"), outcome),
        (increase("cognitive_feedback_outcomes_total", "provider, model, tier", wrong_above), would),
    ]
    timeout = aiohttp.ClientTimeout(total=PROMETHEUS_TIMEOUT_S)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        for expr, put in queries:
            for sample in await _query(session, url, expr):
                put(sample["metric"], float(sample["value"][1]))
    for figures in rel.models.values():  # a bin with no verdicts in the window is no bin
        figures.bins = {k: b for k, b in figures.bins.items() if b.count > 0}
    return rel


async def judged_records(
    redis: RedisOptions | str, module: str | None = None, on_skipped: Callable[[str], None] | None = None
) -> list[AnswerRecord]:
    """The judged answers stored in Redis (a URL, or the options with its access), of ``module``
    only when given; records that are not sane ones are left out and passed to ``on_skipped``."""
    try:
        options = RedisOptions(redis) if isinstance(redis, str) else redis
    except ValueError as exc:  # its message quotes none of the URL
        raise SourceError(str(exc)) from None
    records = []
    try:
        async for record in scan_records(options, on_skipped=on_skipped):
            if record.verdict is not None and (module is None or record.module == module):
                records.append(record)
    except (RedisError, OSError) as exc:
        raise SourceError(f"Redis at {redacted(options.url)}: {exc}") from exc
    return records


async def from_redis(
    redis: RedisOptions | str, module: str | None = None
) -> tuple[Reliability, dict[str, list[Point]]]:
    """The figures of the judged answers in Redis, and per target the points to fit; records that
    are not sane ones are left out and counted (``Reliability.skipped``)."""
    skipped: list[str] = []
    records = await judged_records(redis, module, skipped.append)
    points: dict[str, list[Point]] = {}
    for r in records:
        if r.score is not None:  # a judged record has its score (``feedback.from_redis`` checks)
            points.setdefault(f"{r.provider}/{r.model}", []).append(Point(r.confidence, r.score))
    figures = from_records(records)
    figures.skipped = len(skipped)
    return figures, points


def points_from_bins(rel: Reliability) -> dict[str, list[Point]]:
    """Per target, one weighted point per reported-confidence bin (what the counters keep)."""
    out: dict[str, list[Point]] = {}
    for (target, scale), figures in rel.models.items():
        if scale == "reported":
            out[target] = [
                Point(b.mean_confidence, b.accuracy, b.count) for b in figures.bins.values() if b.count
            ]
    return out


async def prometheus_records(url: str, window: str, module: str | None = None) -> list[AnswerRecord]:
    """The first human verdicts of the last ``window`` as answer records, one per verdict (the same
    record repeated), each at the lower edge of its bin on the ``calibrated`` scale: the confidence
    decided on, so a threshold on a bin edge accepts exactly the answers of the bins at or above
    it. Counts are Prometheus's ``increase()``, rounded."""
    if not WINDOW.match(window):
        raise SourceError(f"window {window!r}: a Prometheus duration such as 1h, 7d")
    if module is not None and not _MODULE.match(module):
        raise SourceError(f"module {module!r}: not a module name")
    calibrated = _selector(module, 'scale="calibrated"')
    by = "module, provider, model, bucket, verdict"
    verdicts = f"sum by ({by}) (increase(cognitive_feedback_total{calibrated}[{window}]))"
    tiers = (
        f"sum by (module, tier) (increase(cognitive_feedback_outcomes_total{_selector(module)}[{window}]))"
    )
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=PROMETHEUS_TIMEOUT_S)) as session:
        tier_of = {s["metric"]["module"]: s["metric"]["tier"] for s in await _query(session, url, tiers)}
        rows = await _query(session, url, verdicts)
    records: list[AnswerRecord] = []
    for sample in rows:
        labels, count = sample["metric"], round(float(sample["value"][1]))
        edge, verdict, name = float(labels["bucket"]), labels["verdict"], labels["module"]
        record = AnswerRecord(
            trace_id="",
            module=name,
            tier=tier_of.get(name, ""),
            rung="",
            provider=labels["provider"],
            model=labels["model"],
            confidence=edge,
            calibrated=edge,
            risk="",
            decision="",
            min_confidence=0.0,
            at=0.0,
            expires=0.0,
            verdict=verdict,
            score=1.0 if verdict == "correct" else 0.0,
        )
        records += [record] * count
    return records
