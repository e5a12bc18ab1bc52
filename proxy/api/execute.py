"""``POST /v1/modules/{name}/execute``: one module call, answered sync or streamed.

The response mode is negotiated (``proxy.stream.negotiate``); a retry carrying a recovery
context (``X-Cognitive-Recovery-Session``/``-Seq`` or ``_recovery``) resumes its session
(``proxy.api.streaming``).
"""

from __future__ import annotations

from typing import Any

from aiohttp import web

from proxy.api import calls
from proxy.api.app_keys import METRICS, SETTINGS, Runtime, runtime_of
from proxy.api.body import read_object
from proxy.api.envelopes import answer_response, caller_error
from proxy.api.errors import ApiError
from proxy.api.frames import framer_for
from proxy.api.middleware import RECORD_KEY
from proxy.api.modules import module_not_found
from proxy.api.streaming import (
    BadRecovery,
    recovery_of,
    resume,
    stream_module_execute,
)
from proxy.contract.errors import Code
from proxy.jsonshape import as_dict
from proxy.module.model import Module
from proxy.observability.metrics import OUTCOME_INVALID_INPUT
from proxy.stream.negotiate import (
    MODE_HEADER,
    WARNING_HEADER,
    BadMode,
    ModeSignals,
    Negotiated,
    negotiate,
    transport_of,
)


def _signals(request: web.Request, body: dict[str, Any]) -> ModeSignals:
    return ModeSignals(
        header=request.headers.get(MODE_HEADER),
        option=as_dict(body.get("_options")).get("response_mode"),
        query=request.query.get("response_mode"),
        accept=request.headers.get("Accept", ""),
    )


async def execute(request: web.Request) -> web.StreamResponse:
    """``{"input": {...}, "_options": {...}, "_recovery": {...}}`` -> an envelope or a stream."""
    runtime = runtime_of(request)
    name = request.match_info["name"]
    record = request[RECORD_KEY]
    trace_id = record.trace_id
    module = runtime.registry.get(name)
    if module is None:
        return module_not_found(name, runtime, request)
    record.module = module.name
    try:
        body = await read_object(request)
    except ApiError as exc:
        if exc.status != 400:
            raise
        record.outcome = OUTCOME_INVALID_INPUT
        return caller_error(Code.PARSE_ERROR, exc.message, trace_id)  # the body is not one JSON object
    try:
        recovery = recovery_of(request, body)
        negotiated = (
            Negotiated("streaming", transport_of(request.headers.get("Accept", "")))
            if recovery is not None
            else negotiate(module, _signals(request, body))
        )
    except (BadRecovery, BadMode) as exc:
        record.outcome = OUTCOME_INVALID_INPUT
        return caller_error(Code.INVALID_INPUT, str(exc), trace_id)
    framer = framer_for(negotiated.transport)
    headers: dict[str, str] = {"X-Cognitive-Tier": module.tier}
    if recovery is not None:
        if not request.app[SETTINGS].stream_recovery:
            request.app[METRICS].stream_resumptions.labels("disabled").inc()
            return caller_error(
                Code.RECOVERY_NOT_SUPPORTED, "Stream recovery is disabled on this proxy", trace_id
            )
        resumed = await resume(request, recovery, module, framer, headers)
        if resumed is not None:
            return resumed
    if "input" not in body:
        record.outcome = OUTCOME_INVALID_INPUT
        return _no_input(trace_id)
    if negotiated.refused:
        return _sync_refused(module, trace_id)
    if negotiated.mode == "sync":
        return await _sync(request, runtime, module, body["input"], negotiated, headers)
    return await stream_module_execute(request, runtime, module, body["input"], framer)


def _no_input(trace_id: str) -> web.Response:
    return caller_error(
        Code.INVALID_INPUT,
        'The request body needs an "input" field',
        trace_id,
        suggestion='Send {"input": {...}} with the module input',
    )


def _sync_refused(module: Module, trace_id: str) -> web.Response:
    return caller_error(
        Code.STREAMING_NOT_SUPPORTED,
        f"Module {module.name!r} declares response.mode: streaming (its author's choice); "
        "the request asked for a sync answer",
        trace_id,
        explain="Caller's choice: a sync answer was asked of a module its author declared streaming-only",
    )


async def _sync(
    request: web.Request,
    runtime: Runtime,
    module: Module,
    value: Any,
    negotiated: Negotiated,
    headers: dict[str, str],
) -> web.Response:
    """The envelope as one JSON answer; a streaming request that fell back says so (W4010)."""
    answer = await calls.answer(request, runtime, module, value)
    if negotiated.fallback_reason is None:
        return answer_response(answer, headers=headers)
    envelope = {**answer.envelope, "_warnings": negotiated.warnings()}
    return answer_response(answer, envelope, {**headers, WARNING_HEADER: negotiated.warning_header or ""})
