"""Module routes: execute, catalogue, manifest summary. Module answers are always envelopes."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import structlog
from aiohttp import web

from proxy.api.errors import ApiError, json_response
from proxy.api.feedback import answer_record
from proxy.api.instrument import record_module_answer, record_module_cost
from proxy.api.media import media_env
from proxy.api.middleware import CALLER, CLIENT_KEY, RECORD_KEY, TRACE_KEY
from proxy.api.quota import admit_module, caller, settle
from proxy.api.state import CONTEXT_STORE, FEEDBACK, METRICS, REDACT_NAMES, ROUTER, Runtime, runtime_of
from proxy.compose.run import Composer
from proxy.context.identity import (
    SESSION_HEADER,
    USER_HEADER,
    Identity,
    IdentityError,
    check_id,
    namespace_of,
)
from proxy.context.step import ContextCall
from proxy.context.store import ClientQuota, QuotaStore
from proxy.contract.errors import EXPLAIN_MAX, Code, Origin, error_envelope, http_status
from proxy.module.model import Module
from proxy.module.resolve import Unavailable
from proxy.observability.metrics import (
    OTHER,
    OUTCOME_INVALID_INPUT,
    OUTCOME_UNAVAILABLE,
    OUTCOME_UNKNOWN_MODULE,
)
from proxy.pipeline import Call, Listener, ModuleAnswer, internal_error, run_module
from proxy.review import review_record

log = structlog.get_logger("proxy.api")


def unavailable_response(unavailable: Unavailable, request: web.Request) -> web.Response:
    """A composite that loaded but cannot run: its load error (E4004, E4005, E4006) as an
    envelope, before any step or upstream call."""
    request[RECORD_KEY].module = unavailable.module.name
    request[RECORD_KEY].outcome = OUTCOME_UNAVAILABLE
    trace_id = request[TRACE_KEY]
    envelope = error_envelope(
        unavailable.code,
        f"Module {unavailable.module.name!r} is unavailable: {unavailable.reason}"[:1000],
        details={"load_error": unavailable.reason},
    )
    envelope["meta"]["trace_id"] = trace_id
    return json_response(
        envelope,
        status=http_status(unavailable.code),
        headers={"X-Cognitive-Decision": "reject"},
    )


def module_not_found(name: str, runtime: Runtime, request: web.Request) -> web.Response:
    """E4006 (404) as an envelope; the module label is ``other`` (names come from the registry).
    A composite that is installed but unavailable answers its load error instead."""
    unavailable = runtime.registry.unavailable_module(name)
    if unavailable is not None:
        return unavailable_response(unavailable, request)
    request[RECORD_KEY].module = OTHER
    request[RECORD_KEY].outcome = OUTCOME_UNKNOWN_MODULE
    trace_id = request[TRACE_KEY]
    known = ", ".join(runtime.registry.names()) or "none"
    envelope = error_envelope(
        Code.MODULE_NOT_FOUND,
        f"Module {name!r} is not installed (installed: {known})",
        explain=f"Caller error: no module named {name!r} is installed"[:EXPLAIN_MAX],
    )
    envelope["meta"]["trace_id"] = trace_id
    return json_response(
        envelope,
        status=http_status(Code.MODULE_NOT_FOUND),
        headers={"X-Cognitive-Decision": "reject"},
    )


def module_error_response(answer: ModuleAnswer) -> web.Response:
    """A module answer whose status is not 200: the envelope itself is the body."""
    return json_response(answer.envelope, status=answer.status, headers=answer.headers())


def caller_error(
    code: Code, message: str, trace_id: str, *, suggestion: str | None = None, explain: str | None = None
) -> web.Response:
    """The caller's own mistake on a module route, before any module ran: an envelope."""
    envelope = error_envelope(code, message, suggestion=suggestion, explain=explain)
    envelope["meta"]["trace_id"] = trace_id
    return json_response(
        envelope,
        status=http_status(code, Origin.CALLER),
        headers={"X-Cognitive-Decision": "reject"},
    )


BYPASS_DIRECTIVES = frozenset({"no-cache", "no-store"})


def context_call(request: web.Request, history: Sequence[Mapping[str, Any]] = ()) -> ContextCall:
    """The caller's context identity: the client key's hash, ``X-Cognitive-Session`` and
    ``X-Cognitive-User``; ``Cache-Control: no-cache`` bypasses the result cache. Raises
    ``IdentityError`` for an id that is not an opaque short name."""
    identity = Identity(
        namespace_of(request[CALLER].id),
        check_id(request.headers.get(SESSION_HEADER, "").strip(), SESSION_HEADER),
        check_id(request.headers.get(USER_HEADER, "").strip(), USER_HEADER),
    )
    directives = {d.strip().lower() for d in request.headers.get("Cache-Control", "").split(",")}
    cache = runtime_of(request).policy.cache
    return ContextCall(
        QuotaStore(request.app[CONTEXT_STORE], ClientQuota(cache.client_max_entries, cache.client_max_bytes)),
        identity,
        history,
        bypass_cache=bool(directives & BYPASS_DIRECTIVES),
        matcher=request.app[REDACT_NAMES],
    )


@dataclass
class Spent:
    """Tokens and cost of a composite's steps, settled with the request's own."""

    tokens: int = 0
    usd: float = 0.0


def _step_runner(
    request: web.Request, runtime: Runtime, top: Module, spent: Spent
) -> Callable[[Call], Awaitable[ModuleAnswer]]:
    """``run_module`` for the steps of a composite, each recorded like a module answer of its own
    (metrics, cost, review); the composite's own call is recorded once, by ``answer_module``."""

    async def run(call: Call) -> ModuleAnswer:
        answer = await run_module(call)
        if call.module.name != top.name:
            record_module_answer(request.app[METRICS], runtime.policy, answer)
            metrics = request.app[METRICS]
            spent.tokens += record_module_cost(metrics, runtime.policy, answer, caller(request).label)
            spent.usd += answer.cost.usd
            request.app[METRICS].composition_steps.labels(top.name, call.module.name, answer.decision).inc()
            if answer.decision == "review":
                await runtime.review.submit(
                    review_record(
                        call.module.name,
                        call.module.tier,
                        call.trace_id,
                        answer.decision,
                        answer.envelope,
                        request[CALLER].id,
                    )
                )
        return answer

    return run


async def _run(
    request: web.Request,
    runtime: Runtime,
    module: Module,
    value: Any,
    check: bool,
    listener: Listener | None,
    context: ContextCall,
    top_rung: int | None,
    tools: tuple[Mapping[str, Any], ...] = (),
    spent: Spent | None = None,
) -> ModuleAnswer:
    """The module call (a composite's steps included), with any unexpected exception turned into
    E4000 (logged with its trace id)."""
    trace_id = request[TRACE_KEY]
    try:
        call = Call(
            module,
            value,
            runtime.policy,
            runtime.providers,
            request.app[ROUTER],
            trace_id,
            request[CLIENT_KEY],
            check,
            listener,
            context,
            top_rung=top_rung,
            media=media_env(request, runtime.policy.media),
            tools=tools,
        )
        if module.is_composite:
            runner = _step_runner(request, runtime, module, spent or Spent())
            return await Composer(runtime.registry.modules, runner).run(call)
        return await run_module(call)
    except ApiError:
        raise  # the edge's own answers (a busy memory budget: 503), not a module failure
    except Exception:  # asyncio.CancelledError is a BaseException and passes through
        log.exception("proxy.internal_error", module=module.name, trace_id=trace_id)
        answer = internal_error(module)
        answer.envelope["meta"]["trace_id"] = trace_id
        return answer


async def answer_module(
    request: web.Request,
    runtime: Runtime,
    module: Module,
    value: Any,
    *,
    check_input: bool = True,
    listener: Listener | None = None,
    history: Sequence[Mapping[str, Any]] = (),
    tools: tuple[Mapping[str, Any], ...] = (),
) -> ModuleAnswer:
    """Run one module call for ``request`` and record it in the review sink when so decided.
    ``listener``: the call streams (see ``proxy.api.streaming``); ``history``: the earlier
    messages of a chat-style call (``conversation_history``)."""
    trace_id = request[TRACE_KEY]
    record = request[RECORD_KEY]
    record.module = module.name
    try:
        context = context_call(request, history)
    except IdentityError as exc:
        record.outcome = OUTCOME_INVALID_INPUT
        answer = ModuleAnswer(module, error_envelope(Code.INVALID_INPUT, str(exc)), "reject", Origin.CALLER)
        answer.envelope["meta"]["trace_id"] = trace_id
        return answer
    top_rung = await admit_module(request, runtime.policy, value)
    spent = Spent()
    answer = await _run(
        request, runtime, module, value, check_input, listener, context, top_rung, tools, spent
    )
    record.upstream_s += answer.upstream_s
    if answer.cache is not None:
        record.fields["cache"] = answer.cache
    record.fields.update(
        tier=module.tier,
        decision=answer.decision,
        confidence=answer.meta.get("confidence"),
        risk=answer.meta.get("risk"),
        attempts=len(answer.attempts),
        target=answer.answered_by or None,
    )
    record.outcome = record_module_answer(request.app[METRICS], runtime.policy, answer)
    tokens = record_module_cost(request.app[METRICS], runtime.policy, answer, caller(request).label)
    await settle(request, tokens + spent.tokens, answer.cost.usd + spent.usd)  # a composite's steps too
    remembered = answer_record(answer, module, runtime.policy, trace_id, request[CALLER].id)
    if remembered is not None:
        request.app[FEEDBACK].remember(remembered, runtime.policy.feedback.max_entries)
    if answer.decision == "review":
        await runtime.review.submit(
            review_record(
                module.name, module.tier, trace_id, answer.decision, answer.envelope, request[CALLER].id
            )
        )
    return answer


def _unavailable_summary(unavailable: Unavailable) -> dict[str, Any]:
    module = unavailable.module
    return {
        "id": module.name,
        "object": "module",
        **module.summary(),
        "available": False,
        "load_error": {"code": unavailable.code, "message": unavailable.reason},
    }


async def list_modules(request: web.Request) -> web.Response:
    runtime = runtime_of(request)
    data = [
        {"id": m.name, "object": "module", **m.summary(), "available": True}
        for m in (runtime.registry.modules[n] for n in runtime.registry.names())
    ]
    data += [
        _unavailable_summary(runtime.registry.unavailable[n]) for n in sorted(runtime.registry.unavailable)
    ]
    return json_response({"object": "list", "data": data})


async def get_module(request: web.Request) -> web.Response:
    runtime = runtime_of(request)
    name = request.match_info["name"]
    module = runtime.registry.get(name)
    if module is None:
        unavailable = runtime.registry.unavailable_module(name)
        if unavailable is not None:  # the manifest, and why it cannot run
            return json_response(_unavailable_summary(unavailable))
        return module_not_found(name, runtime, request)
    return json_response({"id": module.name, "object": "module", **module.summary(), "available": True})
