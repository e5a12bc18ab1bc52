"""A module route's request as the inputs of the module-call service (``proxy.service``), and the
service's ``CallReport`` copied into the request's record (its metrics and log line)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from aiohttp import web

from proxy.api.app_keys import CONTEXT_STORE, FEEDBACK, METRICS, REDACT_NAMES, ROUTER, SHADOW, Runtime
from proxy.api.errors import ApiError
from proxy.api.limits import CallLimits
from proxy.api.media import media_env
from proxy.api.middleware import RECORD_KEY
from proxy.context.identity import SESSION_HEADER, USER_HEADER
from proxy.module.model import Module
from proxy.pipeline import Listener, ModuleAnswer
from proxy.service.module_call import CallReport, ModuleCall, Requester, Services, answer_module


def requester_of(request: web.Request) -> Requester:
    headers = request.headers
    record = request[RECORD_KEY]
    return Requester(
        caller=record.caller,
        client_key=record.client_key,
        trace_id=record.trace_id,
        session=headers.get(SESSION_HEADER, "").strip(),
        user=headers.get(USER_HEADER, "").strip(),
        cache_control=headers.get("Cache-Control", ""),
    )


def services_of(request: web.Request) -> Services:
    app = request.app
    return Services(
        metrics=app[METRICS],
        router=app[ROUTER],
        context_store=app[CONTEXT_STORE],
        redact=app[REDACT_NAMES],
        feedback=app[FEEDBACK],
        shadow=app[SHADOW],
        edge_errors=(ApiError,),
    )


def module_call(
    request: web.Request,
    runtime: Runtime,
    module: Module,
    value: Any,
    limits: CallLimits,
    *,
    check_input: bool = True,
    input_checked: bool = False,
    listener: Listener | None = None,
    history: Sequence[Mapping[str, Any]] = (),
    tools: tuple[Mapping[str, Any], ...] = (),
) -> ModuleCall:
    """The service's inputs for a module call of ``request``."""
    return ModuleCall(
        runtime=runtime,
        module=module,
        value=value,
        requester=requester_of(request),
        limits=limits,
        media=media_env(request, runtime.policy.media),
        check_input=check_input,
        input_checked=input_checked,
        listener=listener,
        history=history,
        tools=tools,
    )


def record_report(request: web.Request, report: CallReport) -> None:
    """What the service reports about the call, into the request's log line and metrics."""
    record = request[RECORD_KEY]
    record.module = report.module
    record.outcome = report.outcome
    record.upstream_s += report.upstream_s
    record.fields.update(report.fields)


async def answer(
    request: web.Request,
    runtime: Runtime,
    module: Module,
    value: Any,
    *,
    check_input: bool = True,
    history: Sequence[Mapping[str, Any]] = (),
    tools: tuple[Mapping[str, Any], ...] = (),
) -> ModuleAnswer:
    """One sync module call for ``request``: its answer, its report in the request's record."""
    request[RECORD_KEY].module = module.name  # a 429 before the call is still this module's
    limits = CallLimits.of(request)
    call = module_call(
        request, runtime, module, value, limits, check_input=check_input, history=history, tools=tools
    )
    try:
        answered = await answer_module(call, services_of(request))
    finally:
        limits.keep_admission(request)
    record_report(request, answered.report)
    return answered.answer
