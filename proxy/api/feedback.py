"""``POST /v1/feedback``: a verdict on a module answer, by its trace id.

A client judges its own answers only: the record is looked up by (its identity, the trace id),
the identity by ``proxy.clients``' rule (with client keys, the key's; without, the one anonymous
client). Another client's trace id gets the same 404 as an unknown one, so trace ids cannot be
probed, and a trace id two clients chose (``X-Request-Id``) names each one's own answer. An admin
key (``--admin-keys``) judges any client's answer: ``client`` names whose when several clients'
answers carry the trace id. A second verdict replaces the first.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import structlog
from aiohttp import web

from proxy.api.app_keys import FEEDBACK, METRICS, runtime_of
from proxy.api.body import read_object
from proxy.api.errors import ApiError, json_response
from proxy.api.middleware import RECORD_KEY, TRACE_ID_PATTERN
from proxy.api.review_items import review_items
from proxy.service.instrument import record_verdict
from proxy.service.runtime import Runtime
from proxy.state.feedback import SHADOW_SOURCE, VERDICT_SCORES, AnswerRecord, FeedbackStore, with_verdict
from proxy.state.review_queue import QueueUnavailable

log = structlog.get_logger("proxy.feedback")

SOURCE_MAX = 64
CLIENT_MAX = 64
"""A client identity: a keys-file name (64 at most) or ``key-`` and 16 hex digits."""
NOTE_MAX = 1000
"""A note is kept with the verdict (for ``calibration report``), never in a metric label."""


NOT_FOUND_REASONS = (
    "unknown, older than the feedback window ({window:g} s), evicted from the proxy's bounded store, "
    "or made by another client (a record belongs to the client identity that made the call: with "
    "client keys, the key's name or hash; without client keys every caller is one client, whatever "
    "bearer it sends)"
)


def _field(body: dict[str, Any], name: str, max_len: int) -> str | None:
    value = body.get(name)
    if value is None:
        return None
    if not isinstance(value, str) or len(value) > max_len:
        raise ApiError(400, f"{name} must be a string of at most {max_len} characters", param=name)
    return value


@dataclass(frozen=True, slots=True)
class Verdict:
    trace_id: str
    verdict: str
    score: float
    source: str | None
    note: str | None
    client: str | None
    """Whose answer, named by an admin key (a client judges its own)."""


def _parse(body: dict[str, Any]) -> Verdict:
    unknown = sorted(set(body) - {"trace_id", "verdict", "score", "source", "note", "client"})
    if unknown:
        raise ApiError(400, f"unknown field {unknown[0]!r}", param=unknown[0])
    trace_id = body.get("trace_id")
    if not isinstance(trace_id, str) or not TRACE_ID_PATTERN.match(trace_id):
        raise ApiError(400, "trace_id must be the X-Cognitive-Trace-Id of a module answer", param="trace_id")
    verdict = body.get("verdict")
    if not isinstance(verdict, str) or verdict not in VERDICT_SCORES:
        raise ApiError(400, f"verdict must be one of {', '.join(VERDICT_SCORES)}", param="verdict")
    score = body.get("score", VERDICT_SCORES[verdict])
    if isinstance(score, bool) or not isinstance(score, (int, float)) or not 0 <= score <= 1:
        raise ApiError(400, "score must be a number from 0 to 1", param="score")
    source = _field(body, "source", SOURCE_MAX)
    if source == SHADOW_SOURCE:
        raise ApiError(
            400, f"source {SHADOW_SOURCE!r} is the proxy's own judge's (feedback.shadow)", param="source"
        )
    return Verdict(
        trace_id,
        verdict,
        float(score),
        source,
        _field(body, "note", NOTE_MAX),
        _field(body, "client", CLIENT_MAX),
    )


async def _record_for(request: web.Request, asked: Verdict) -> AnswerRecord | None:
    """The caller's own record of the trace id; for an admin key, the one client's record
    (``client`` names it when several carry the trace id)."""
    store = request.app[FEEDBACK]
    record = request[RECORD_KEY]
    if not record.admin_caller:  # set by the edge: the route's scope takes an admin key
        if asked.client is not None:
            raise ApiError(
                400,
                "client may be named by an admin key only: a client judges its own answers",
                param="client",
            )
        return await store.get(record.caller.id, asked.trace_id)
    return await admin_record(store, asked.trace_id, asked.client)


async def admin_record(store: FeedbackStore, trace_id: str, client: str | None) -> AnswerRecord | None:
    """Any client's record of ``trace_id`` (an admin's verdict); ``client`` names whose when
    several clients' answers carry it (409 when it is needed and missing)."""
    found = await store.find(trace_id)
    if client is not None:
        found = [record for record in found if record.client == client]
    if len(found) > 1:
        names = ", ".join(record.client for record in found)
        raise ApiError(
            409,
            f"Several clients' answers carry trace id {trace_id!r} ({names}): name one with client",
            code="ambiguous_trace",
            param="client",
        )
    return found[0] if found else None


async def apply_verdict(
    app: web.Application, runtime: Runtime, record: AnswerRecord, asked: Verdict
) -> AnswerRecord:
    """``asked`` on ``record``: stored in place of it and counted in ``cognitive_feedback_*`` (the
    one path of a verdict: ``POST /v1/feedback`` and the review console)."""
    judged = with_verdict(record, asked.verdict, asked.score, asked.source, asked.note)
    await app[FEEDBACK].judged(judged)
    record_verdict(app[METRICS], runtime.policy, judged, record)
    return judged


FEEDBACK_REVIEWER = "POST /v1/feedback"
"""Who closed a console item judged through the API (the console lists it)."""


async def _close_review(request: web.Request, record: AnswerRecord, verdict: str) -> None:
    """A verdict on an answer sent to review closes its console item: nobody is asked to judge
    it again. The verdict is recorded either way; a queue that cannot be reached is logged."""
    if record.decision != "review":
        return
    items = review_items(request)
    if items is None:
        return
    try:
        await items.close_answer(record.client, record.trace_id, verdict, FEEDBACK_REVIEWER, time.time())
    except QueueUnavailable as exc:
        log.warning("proxy.review_close_failed", trace_id=record.trace_id, error=str(exc))


async def post_feedback(request: web.Request) -> web.Response:
    runtime = runtime_of(request)
    asked = _parse(await read_object(request))
    trace_id, verdict, score = asked.trace_id, asked.verdict, asked.score
    record = await _record_for(request, asked)
    if record is None:
        reasons = NOT_FOUND_REASONS.format(window=runtime.policy.feedback.window_s)
        raise ApiError(
            404,
            f"No module answer with trace id {trace_id!r} to judge: {reasons}",
            code="trace_not_found",
            param="trace_id",
        )
    request[RECORD_KEY].module = record.module
    await apply_verdict(request.app, runtime, record, asked)
    await _close_review(request, record, verdict)
    return json_response(
        {
            "object": "feedback",
            "trace_id": trace_id,
            "verdict": verdict,
            "score": score,
            "replaced": record.verdict is not None,
            "module": record.module,
            "model": f"{record.provider}/{record.model}",
            "confidence": record.confidence,
            "confidence_calibrated": record.calibrated,
        }
    )
