"""Envelope -> HTTP response: the one place a module route's envelope becomes an answer.

A module answer's status comes from who produced its envelope (``Origin``) and its code; its
``X-Cognitive-*`` headers from the answer's decision, meta, attempts and cost. A request refused
before its module ran (the caller's mistake, an unknown or unavailable module, a refused stream
recovery, a refusal of the edge) is an envelope too, with ``X-Cognitive-Decision: reject``; its
trace id is stamped here and nowhere else (a module answer's is stamped by the pipeline's
finishing step).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from aiohttp import web

from proxy.api.errors import json_response
from proxy.context.used import CONTEXT_HEADER
from proxy.contract.errors import EXPLAIN_MAX, Code, Origin, error_envelope, http_status
from proxy.jsonshape import as_dict
from proxy.module.resolve import Unavailable
from proxy.pipeline import ModuleAnswer

DECISION_HEADER = "X-Cognitive-Decision"
CACHE_HEADER = "X-Cognitive-Cache"
REJECT: Mapping[str, str] = {DECISION_HEADER: "reject"}


def answer_status(answer: ModuleAnswer) -> int:
    """200 for a success envelope; else the status of its code for who produced it."""
    if answer.envelope.get("ok") is True:
        return 200
    return http_status(str(as_dict(answer.envelope.get("error")).get("code", "")), answer.origin)


def answer_headers(answer: ModuleAnswer) -> dict[str, str]:
    """The decision headers sent on every module answer."""
    meta = answer.meta
    headers = {
        DECISION_HEADER: answer.decision,
        "X-Cognitive-Confidence": f"{meta.get('confidence', 0)}",
        "X-Cognitive-Risk": str(meta.get("risk", "high")),
        "X-Cognitive-Tier": answer.module.tier,
        "X-Cognitive-Attempts": str(answer.all_attempts()),
        "X-Cognitive-Cost-Usd": f"{answer.total_usd():.9f}",
        "X-Cognitive-Escalated-Cost-Usd": f"{answer.cost.escalated_usd:.9f}",
    }
    if answer.answered_by:  # absent when no model answered (a provider failure, a refused input)
        headers["X-Cognitive-Model"] = answer.answered_by
    final = answer.final
    if final is not None and final.calibrated is not None:
        headers["X-Cognitive-Confidence-Calibrated"] = f"{final.calibrated:.6g}"
    if answer.retry_after is not None:
        headers["Retry-After"] = str(max(1, math.ceil(answer.retry_after)))
    if answer.cache is not None:
        headers[CACHE_HEADER] = answer.cache
    if answer.context is not None:
        headers[CONTEXT_HEADER] = answer.context.header()
    return headers


def answer_response(
    answer: ModuleAnswer, envelope: dict[str, Any] | None = None, headers: Mapping[str, str] | None = None
) -> web.Response:
    """A module answer as one JSON envelope (``envelope``: the answer's own, or a copy the route
    extended); ``headers`` add to (and win over) the decision headers."""
    return json_response(
        answer.envelope if envelope is None else envelope,
        status=answer_status(answer),
        headers={**answer_headers(answer), **(headers or {})},
    )


def refused_envelope(
    envelope: dict[str, Any], status: int, trace_id: str | None, headers: Mapping[str, str] | None = None
) -> web.Response:
    """A request answered with an envelope before its module ran: the trace id stamped (the one
    place), ``X-Cognitive-Decision: reject``."""
    if trace_id:
        envelope = {**envelope, "meta": {**as_dict(envelope.get("meta")), "trace_id": trace_id}}
    return json_response(envelope, status=status, headers={**(headers or {}), **REJECT})


def caller_error(
    code: str, message: str, trace_id: str, *, suggestion: str | None = None, explain: str | None = None
) -> web.Response:
    """The caller's own mistake on a module route, before any module ran."""
    envelope = error_envelope(code, message, suggestion=suggestion, explain=explain)
    return refused_envelope(envelope, http_status(code, Origin.CALLER), trace_id)


def unavailable_response(unavailable: Unavailable, trace_id: str) -> web.Response:
    """A composite that loaded but cannot run: its load error (E4004, E4005, E4006), before any
    step or upstream call."""
    envelope = error_envelope(
        unavailable.code,
        f"Module {unavailable.module.name!r} is unavailable: {unavailable.reason}"[:1000],
        details={"load_error": unavailable.reason},
    )
    return refused_envelope(envelope, http_status(unavailable.code), trace_id)


def not_installed_response(name: str, installed: list[str], trace_id: str) -> web.Response:
    """E4006 (404): no module of that name is installed."""
    known = ", ".join(installed) or "none"
    envelope = error_envelope(
        Code.MODULE_NOT_FOUND,
        f"Module {name!r} is not installed (installed: {known})",
        explain=f"Caller error: no module named {name!r} is installed"[:EXPLAIN_MAX],
    )
    return refused_envelope(envelope, http_status(Code.MODULE_NOT_FOUND), trace_id)
