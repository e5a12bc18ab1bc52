"""``POST /v1/chat/completions``: passthrough chat, and module mode over chat."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Mapping
from dataclasses import dataclass
from functools import partial
from typing import Any

import orjson
import structlog
from aiohttp import web

from proxy.api import calls
from proxy.api.app_keys import METRICS, ROUTER, Runtime, runtime_in
from proxy.api.body import ensure_encodable, read_object
from proxy.api.envelopes import answer_headers, answer_response, answer_status
from proxy.api.errors import ApiError, json_response
from proxy.api.failures import failed_call
from proxy.api.frames import fingerprint, tool_call_id
from proxy.api.limits import admit, caller, estimate_body_tokens, settle
from proxy.api.middleware import RECORD_KEY, RequestRecord
from proxy.api.modules import module_not_found
from proxy.api.output_mode import output_mode
from proxy.api.relay_answer import serve
from proxy.api.stream_response import HeldHeadResponse
from proxy.api.streaming import stream_module_chat
from proxy.contract.errors import Code
from proxy.contract.inputs import text_input
from proxy.jsonshape import as_dict, as_list
from proxy.observability.metrics import NO_MODULE
from proxy.observability.tracing import (
    CHAT,
    AttemptSpan,
    Attributes,
    HeldSpan,
    active,
    request_attributes,
    response_attributes,
    streamed_attributes,
)
from proxy.pipeline import ModuleAnswer
from proxy.policy.model import ANY_MODEL, Policy, Target
from proxy.service.instrument import record_cost, record_usage, target_labels, total_tokens
from proxy.stream.negotiate import MODE_HEADER, SSE, WARNING_HEADER, BadMode, ModeSignals, negotiate
from proxy.upstream.base import CallInfo, Provider, Relayed
from proxy.upstream.body import Body
from proxy.upstream.relay import first_chunk
from proxy.upstream.router import Operation, Routed, RungFailed, T, Try
from proxy.upstream.sse import StreamCheck
from proxy.wire import DONE, UsageSniffer, completion, completion_chunks, envelope_text, sse_frame

log = structlog.get_logger("proxy.api")

MODULE_PREFIX = "module:"


def resolve_model(policy: Policy, name: str) -> tuple[Target, ...] | None:
    """A passthrough model name -> the targets to try: an alias (to a rung or provider/model),
    a rung name, a ``provider/model`` the policy names, or any ``provider/model`` of a provider
    with ``allow_any_model`` (sharing that provider's one ``provider/*`` breaker state)."""
    name = policy.aliases.get(name, name)
    index = policy.rung_index(name)
    if index is not None:
        return policy.ladder[index].targets
    provider, _, model = name.partition("/")
    config = policy.providers.get(provider)
    if not model or config is None:
        return None
    if name in policy.known_targets:
        return (Target(provider, model),)
    if config.allow_any_model:
        return (Target(provider, model, state=f"{provider}/{ANY_MODEL}"),)
    return None


def model_names(runtime: Runtime) -> list[str]:
    """What a chat request may name: aliases, rungs, the ``provider/model`` targets of the
    policy, ``provider/*`` of ``allow_any_model`` providers, and modules."""
    policy = runtime.policy
    return (
        sorted(policy.aliases)
        + [rung.name for rung in policy.ladder]
        + sorted(policy.known_targets)
        + sorted(f"{p.name}/{ANY_MODEL}" for p in policy.providers.values() if p.allow_any_model)
        + [MODULE_PREFIX + n for n in runtime.registry.names()]
    )


def message_text(message: dict[str, Any]) -> str:
    content = message.get("content")
    if isinstance(content, str):
        return content
    return "".join(
        str(as_dict(p).get("text", "")) for p in as_list(content) if as_dict(p).get("type") == "text"
    )


def module_history(body: dict[str, Any]) -> list[dict[str, Any]]:
    """The messages before the last user message (the module input): the source of
    ``conversation_history``, as ``{role, content}`` with text content."""
    messages = [as_dict(m) for m in as_list(body.get("messages"))]
    last = max((i for i, m in enumerate(messages) if m.get("role") == "user"), default=0)
    return [{"role": m.get("role"), "content": message_text(m)} for m in messages[:last]]


def module_input(body: dict[str, Any]) -> tuple[Any, bool]:
    """The last user message as module input, and whether to check it against the schema:
    a JSON object is the input as is; plain text becomes ``{"$ARGUMENTS": text, "query": text}``
    and skips the input schema, as the reference runtime does."""
    users = [m for m in as_list(body.get("messages")) if as_dict(m).get("role") == "user"]
    if not users:
        raise ApiError(400, "Module calls need a user message holding the input", param="messages")
    text = message_text(users[-1])
    try:
        value = orjson.loads(text)
    except orjson.JSONDecodeError:
        value = None
    if isinstance(value, dict):
        return value, True
    return text_input(text), False


async def _module_chat(
    request: web.Request, runtime: Runtime, name: str, body: dict[str, Any]
) -> web.StreamResponse:
    module = runtime.registry.get(name)
    if module is None:
        return module_not_found(name, runtime, request)
    value, check = module_input(body)
    mode = output_mode(body)
    wants_stream = body.get("stream") is True
    try:
        negotiated = negotiate(
            module,
            ModeSignals(header=request.headers.get(MODE_HEADER), accept=SSE if wants_stream else ""),
        )
    except BadMode as exc:
        raise ApiError(400, str(exc), code="invalid_response_mode") from exc
    if negotiated.refused:
        raise ApiError(
            406,
            f"Module {module.name!r} answers streaming only: send stream: true",
            code=Code.STREAMING_NOT_SUPPORTED,
        )
    if wants_stream and negotiated.mode == "streaming":
        return await stream_module_chat(
            request, runtime, module, value, check, body, module_history(body), mode
        )
    answer = await calls.answer(
        request, runtime, module, value, check_input=check, history=module_history(body), tools=mode.tools
    )
    if answer_status(answer) != 200:
        return answer_response(answer)
    reply = completion(f"{MODULE_PREFIX}{name}", envelope_text(answer.envelope))
    if mode.tool is not None:
        as_tool_call(reply, mode.tool)
    if answer.usage:
        reply["usage"] = dict(answer.usage)
    reply["cognitive"] = answer.cognitive()
    reply["system_fingerprint"] = decision_fingerprint(answer)
    headers = answer_headers(answer)
    if negotiated.warning_header is not None:
        headers[WARNING_HEADER] = negotiated.warning_header
    if wants_stream:
        return await _stream_module(request, reply, answer, headers, body)
    return json_response(reply, headers=headers)


def as_tool_call(reply: dict[str, Any], tool: str) -> None:
    """``reply``'s content (the envelope) moved to the arguments of a call of the forced ``tool``."""
    choice = reply["choices"][0]
    message = choice["message"]
    call = {
        "id": tool_call_id(),
        "type": "function",
        "function": {"name": tool, "arguments": message["content"]},
    }
    message.update(content=None, tool_calls=[call])
    choice["finish_reason"] = "tool_calls"


def decision_fingerprint(answer: ModuleAnswer) -> str:
    """The decision in ``system_fingerprint`` (``frames.fingerprint``)."""
    return fingerprint(answer.decision, answer.module.tier, answer.meta)


async def _stream_module(
    request: web.Request,
    reply: dict[str, Any],
    answer: ModuleAnswer,
    headers: dict[str, str],
    body: dict[str, Any],
) -> web.StreamResponse:
    """A valid SSE stream carrying the final envelope: the answer of a module that does not
    stream (``response.mode: sync``), sent with the W4010 warning header."""
    include_usage = bool(as_dict(body.get("stream_options")).get("include_usage"))
    chunks = completion_chunks(reply, include_usage=include_usage)
    # The last chunk with a choice: the usage-only chunk, when asked for, comes after it.
    final = -2 if include_usage else -1
    chunks[final]["cognitive"] = answer.cognitive()
    response = HeldHeadResponse(
        headers={**headers, "Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
    )
    await response.prepare(request)
    for chunk in chunks:
        await response.write(sse_frame(chunk))
    await response.write(DONE)
    await response.write_eof()
    return response


@dataclass(slots=True)  # built per request: not frozen (a frozen init costs 4x)
class _Route:
    """The router call of one passthrough chat request: its targets, deadline, attempt log and
    accounting."""

    request: web.Request
    runtime: Runtime
    targets: tuple[Target, ...]
    started: float
    """``time.monotonic()`` when the request was taken up: the deadlines count from it."""
    app: web.Application
    """``request.app`` (a property), read once."""
    record: RequestRecord
    """``request[RECORD_KEY]``, read once."""

    def log_try(self, attempt: Try) -> None:
        self.record.upstream_s += attempt.latency_ms / 1000 + attempt.waited_s
        if attempt.error is not None and not attempt.skipped:
            log.info(
                "proxy.upstream_failed",
                target=str(attempt.target),
                kind=attempt.error.kind,
                retry=attempt.retry,
            )

    def __call__(
        self, operation: Operation[T], *, bounded: bool = False, span: AttemptSpan = CHAT
    ) -> Awaitable[Routed[T]]:
        """``bounded``: the operation bounds each attempt itself (``Provider.relay``); ``span``:
        how a traced attempt is described."""
        policy = self.runtime.policy
        return self.app[ROUTER].call(
            self.targets,
            self.runtime.providers,
            operation,
            policy.failover,
            self.started + policy.timeouts.total_s,
            self.log_try,
            stop_on_client_error=True,
            bound_attempts=not bounded,
            span=span,
        )

    async def account(self, target: Target, usage: Mapping[str, Any], output_s: float) -> None:
        """Tokens, cost, output speed, and the settlement of the request's limits."""
        request, policy = self.request, self.runtime.policy
        metrics = self.app[METRICS]
        record_usage(metrics, policy, target, usage, output_s)
        # Unpriced and unlimited (the defaults): no client label to look up, no tokens to add.
        usd = (
            0.0
            if policy.price_of(target.name) is None
            else record_cost(metrics, policy, NO_MODULE, target, usage, caller(request).label)
        )
        if self.record.admission is not None:
            settle(request, total_tokens(usage), usd)


async def _passthrough(
    request: web.Request, record: RequestRecord, runtime: Runtime, body: dict[str, Any], model: str
) -> web.StreamResponse:
    targets = resolve_model(runtime.policy, model)
    if not targets:
        raise ApiError(
            404,
            f"The model {model!r} does not exist on this proxy. Available: {', '.join(model_names(runtime))}",
            code="model_not_found",
            param="model",
        )
    ensure_encodable(body)
    if runtime.policy.limits.active:  # admit's own first test: without limits, no coroutine to await
        await admit(request, runtime.policy, partial(estimate_body_tokens, body), downgradable=False)
    ctx = CallInfo(trace_id=record.trace_id, client_key=record.client_key)
    route = _Route(request, runtime, targets, time.monotonic(), record.app, record)
    if body.get("stream") is not True:
        return await _relay_plain(route, body, ctx)
    return await _relay_stream(route, body, ctx)


async def _relay_plain(route: _Route, body: dict[str, Any], ctx: CallInfo) -> web.StreamResponse:
    """A plain completion: the upstream body as it came, its usage accounted."""
    asked = time.perf_counter()
    span = CHAT if active() is None else _relayed_span(body)
    try:
        routed = await route(partial(_relay, body=body, ctx=ctx), bounded=True, span=span)
    except RungFailed as exc:
        return failed_call(exc)
    await route.account(routed.target, routed.value.usage, time.perf_counter() - asked)
    route.record.fields["target"] = routed.target.name
    return web.Response(
        body=routed.value.body,
        headers={
            "X-Cognitive-Model": routed.target.name,
            "Content-Type": "application/json",
        },
    )


async def _relay_stream(route: _Route, body: dict[str, Any], ctx: CallInfo) -> web.StreamResponse:
    """A streamed completion: relayed chunk by chunk within the idle and stream bounds."""
    request, policy = route.request, route.runtime.policy
    timeouts, record = policy.timeouts, route.record
    asked = time.perf_counter()
    held = None if active() is None else HeldSpan()  # traced: the attempt's span lasts the stream
    try:
        opened = await route(
            partial(_open_stream, body=body, ctx=ctx),
            span=CHAT if held is None else AttemptSpan(attributes=request_attributes(body), held=held),
        )
    except RungFailed as exc:
        return failed_call(exc)
    stream = opened.value
    record.fields["target"] = opened.target.name
    ttft = time.perf_counter() - asked
    metrics = request.app[METRICS]
    metrics.child(metrics.ttft, *target_labels(policy, opened.target)).observe(ttft)
    response = HeldHeadResponse(
        headers={
            "X-Cognitive-Model": opened.target.name,
            "Content-Type": "text/event-stream",
            "Cache-Control": "no-cache",
        }
    )
    streaming_since = time.perf_counter()
    broke: BaseException | str | None = None
    try:
        end = await serve(
            request,
            response,
            opened.target,
            stream.head,
            stream.body,
            stream.check,
            idle_s=timeouts.idle_s,
            until=None if timeouts.stream_total_s is None else route.started + timeouts.stream_total_s,
        )
        broke = end.reason
    except BaseException as exc:
        broke = exc
        raise
    finally:
        await stream.body.close()
        stream.check.flush()  # the usage sniffer gets its bytes from the check's batches
        # Forwarding a stream is waiting on the upstream: not the proxy's own time.
        record.upstream_s += time.perf_counter() - streaming_since
        await route.account(opened.target, stream.usage.usage, time.perf_counter() - streaming_since)
        if held is not None:
            attributes = streamed_attributes(stream.head, stream.check.finish_reasons(), stream.usage.usage)
            held.end(attributes, broke)
    return response


def _relayed_span(body: dict[str, Any]) -> AttemptSpan:
    """A traced plain passthrough attempt: the request's parameters, and what the answer says of
    itself (model, id, finish reasons, usage), read from the reply the usage is accounted from."""
    return AttemptSpan(attributes=request_attributes(body), describe=_relayed_attributes)


def _relayed_attributes(relayed: Relayed) -> Attributes:
    return response_attributes(relayed.reply)


@dataclass(frozen=True, slots=True)
class _Opened:
    head: bytes
    body: Body
    check: StreamCheck
    usage: UsageSniffer
    """Fed by ``check``, a batch at a time."""


def _relay(
    provider: Provider, target: Target, timeout: float, *, body: dict[str, Any], ctx: CallInfo
) -> Awaitable[Relayed]:
    """The router's operation for a plain completion: the provider's own coroutine (no frame of
    its own to wrap it)."""
    return provider.relay(body, target.model, ctx, timeout)


async def _open_stream(
    provider: Provider,
    target: Target,
    timeout: float,
    *,
    body: dict[str, Any],
    ctx: CallInfo,
) -> _Opened:
    """Start a stream and read it up to its first real chunk: failures up to here (a drop, a stall,
    a truncation, a malformed first chunk) may be retried and fail over; nothing reached the client."""
    # No socket read bound: the attempt (router) bounds the reads up to the first chunk, and the
    # copy's one deadline per stream (idle_s) those after it.
    answer = await provider.relay_stream(body, target.model, ctx, timeout)
    usage = UsageSniffer()
    check = StreamCheck("chat", sniff=usage.feed)
    try:
        head = await first_chunk(answer, check)
    except BaseException:
        await answer.close()
        raise
    return _Opened(head, answer, check, usage)


async def chat_completions(request: web.Request) -> web.StreamResponse:
    """OpenAI-compatible chat completions; ``model: "module:<name>"`` or the
    ``X-Cognitive-Module`` header runs a module instead of proxying."""
    record = request[RECORD_KEY]  # read once: the app, the body's reservation, the trace id
    runtime = runtime_in(record.app)
    body = await read_object(request, record)
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise ApiError(400, "The request needs a model (a string)", param="model", code="missing_model")
    header_module = request.headers.get("X-Cognitive-Module", "").strip()
    if header_module:
        return await _module_chat(request, runtime, header_module, body)
    if model.startswith(MODULE_PREFIX):
        return await _module_chat(request, runtime, model[len(MODULE_PREFIX) :], body)
    return await _passthrough(request, record, runtime, body, model)
