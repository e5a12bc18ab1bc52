"""``POST /v1/feedback``: a verdict on a module answer, by its trace id.

Only the client key that made the call (or an admin key, ``--admin-keys``) may judge an answer;
any other key gets the same 404 as an unknown trace id, so trace ids of other clients cannot be
probed. A second verdict replaces the first.
"""

from __future__ import annotations

import hashlib
import hmac
import time
from typing import Any

from aiohttp import web

from proxy.api.body import read_object
from proxy.api.errors import ApiError, json_response
from proxy.api.instrument import record_verdict
from proxy.api.middleware import CLIENT_KEY, RECORD_KEY, TRACE_ID_PATTERN
from proxy.api.state import FEEDBACK, METRICS, SETTINGS, runtime_of
from proxy.module.model import Module
from proxy.pipeline import ModuleAnswer
from proxy.policy.model import Policy
from proxy.state.feedback import AnswerRecord, with_verdict

VERDICT_SCORES = {"correct": 1.0, "incorrect": 0.0, "partially_correct": 0.5}
SOURCE_MAX = 64
NOTE_MAX = 1000
"""A note is kept with the verdict (for ``calibration report``), never in a metric label."""


def key_hash(key: str | None) -> str | None:
    """What a record keeps of the client key: its SHA-256, never the key (keys are random
    secrets, so an unsalted fast hash does not make them guessable)."""
    return None if key is None else hashlib.sha256(key.encode()).hexdigest()


def answer_record(
    answer: ModuleAnswer, module: Module, policy: Policy, trace_id: str, client_key: str | None
) -> AnswerRecord | None:
    """The record of a module answer a model produced (None when no model answered)."""
    final = answer.final
    if final is None or final.confidence is None or not trace_id:
        return None
    provider, _, model = final.target.partition("/")
    now = time.time()
    return AnswerRecord(
        trace_id=trace_id,
        module=module.name,
        tier=module.tier,
        rung=final.rung,
        provider=provider,
        model=model,
        confidence=final.confidence,
        calibrated=final.confidence if final.calibrated is None else final.calibrated,
        risk=str(final.risk),
        decision=answer.decision,
        min_confidence=policy.thresholds_for(module.name, module.tier).min_confidence,
        at=now,
        expires=now + policy.feedback.window_s,
        key_hash=key_hash(client_key),
    )


def _field(body: dict[str, Any], name: str, max_len: int) -> str | None:
    value = body.get(name)
    if value is None:
        return None
    if not isinstance(value, str) or len(value) > max_len:
        raise ApiError(400, f"{name} must be a string of at most {max_len} characters", param=name)
    return value


def _parse(body: dict[str, Any]) -> tuple[str, str, float, str | None, str | None]:
    unknown = sorted(set(body) - {"trace_id", "verdict", "score", "source", "note"})
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
    return trace_id, verdict, float(score), _field(body, "source", SOURCE_MAX), _field(body, "note", NOTE_MAX)


def _may_judge(request: web.Request, record: AnswerRecord) -> bool:
    token = request[CLIENT_KEY]
    if token is not None and any(
        hmac.compare_digest(token.encode(), k.encode()) for k in request.app[SETTINGS].admin_keys
    ):
        return True
    if record.key_hash is None:
        return True  # the call carried no key: the proxy had no client keys then
    presented = key_hash(token) or ""
    return hmac.compare_digest(presented, record.key_hash)


async def post_feedback(request: web.Request) -> web.Response:
    runtime = runtime_of(request)
    trace_id, verdict, score, source, note = _parse(await read_object(request))
    store = request.app[FEEDBACK]
    record = await store.get(trace_id)
    if record is None or not _may_judge(request, record):
        window = runtime.policy.feedback.window_s
        raise ApiError(
            404,
            f"No module answer with trace id {trace_id!r} to judge: unknown, older than the feedback "
            f"window ({window:g} s), evicted from the proxy's bounded store, or made with another key",
            code="trace_not_found",
            param="trace_id",
        )
    request[RECORD_KEY].module = record.module
    judged = with_verdict(record, verdict, score, source, note)
    await store.judged(judged)
    record_verdict(request.app[METRICS], runtime.policy, judged, record)
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
