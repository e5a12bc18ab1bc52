"""OpenTelemetry spans of a request, by the semantic conventions pinned in ``SEMCONV_VERSION``.

Off by default. When the app holds a ``Tracing`` (``proxy.observability.otlp`` builds it), the edge
middleware ``activate``s it for the request; everything below reads it with ``active()``. Until an
app of the process exports traces (``enable``), every hook here returns at one module-level check
(``ON``): no span object, no context-variable read, no extra coroutine.

Spans (docs/observability.md, *Traces*): the server span (edge), ``module_call {module}`` (service),
one client span per upstream attempt (``proxy.upstream.router``), and internal spans for the
contract check, the media step, context loads and stores and the result cache (``traced``).
No prompt, completion, media or context content is recorded unless ``Tracing.content`` is set
(``--otel-content``): then messages go through the log redaction and are cut at
``content_max_chars``.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Awaitable, Callable, Mapping, MutableMapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

import orjson
from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.trace import SpanKind, Status, StatusCode, Tracer
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
from yarl import URL

from proxy.contract.engine import ContractResult
from proxy.jsonshape import as_dict
from proxy.media.cache import Fetched
from proxy.media.model import Media
from proxy.redact import scrub

SEMCONV_VERSION = "1.37.0"
"""The OpenTelemetry semantic conventions followed (HTTP and GenAI, ``gen_ai.provider.name``)."""
SCHEMA_URL = f"https://opentelemetry.io/schemas/{SEMCONV_VERSION}"
TRACER_NAME = "cognitive-proxy"
DEFAULT_CONTENT_MAX_CHARS = 4096
"""Recorded content is cut here: a span attribute travels in every export batch, and a 100 kB prompt
would crowd out a batch's other spans (collectors cap a request at a few MB)."""

PROPAGATOR = TraceContextTextMapPropagator()
"""W3C ``traceparent`` / ``tracestate``: the header the proxy already reads for its trace id."""

T = TypeVar("T")
Attributes = Mapping[str, Any]


@dataclass(frozen=True, slots=True)
class Tracing:
    """The app's tracer and what it may record. Held by the app (``TRACING``), never global."""

    tracer: Tracer
    content: bool = False
    """Record message content (redacted, capped): ``--otel-content``."""
    content_max_chars: int = DEFAULT_CONTENT_MAX_CHARS


_ACTIVE: contextvars.ContextVar[Tracing | None] = contextvars.ContextVar("tracing", default=None)

ON = False
"""Whether an app of this process exports traces: set once at start-up (``enable``), never reset;
each app's own ``Tracing`` still decides which requests are traced. The process-wide switch exists
for speed alone: while it is False, tracing costs a request one global read per hook."""


def enable() -> None:
    """Turn the hooks on for the process (an app starts exporting: ``otlp.start_export``)."""
    global ON
    ON = True


def active() -> Tracing | None:
    """The request's ``Tracing``; None when tracing is off (the one check everything makes)."""
    return _ACTIVE.get() if ON else None


def activate(tracing: Tracing) -> contextvars.Token[Tracing | None]:
    return _ACTIVE.set(tracing)


def deactivate(token: contextvars.Token[Tracing | None]) -> None:
    _ACTIVE.reset(token)


# --- the server span (edge) -------------------------------------------------------------------


@dataclass(slots=True)
class ServerSpan:
    """A request's server span, current while the request runs; ``end`` it exactly once."""

    span: trace.Span
    method: str
    tokens: tuple[object, contextvars.Token[Tracing | None]]

    @property
    def trace_id(self) -> str:
        return trace.format_trace_id(self.span.get_span_context().trace_id)

    def end(self, status: int, route: str) -> None:
        span = self.span
        span.set_attribute("http.response.status_code", status)
        if route != "unmatched":
            span.set_attribute("http.route", route)
            span.update_name(f"{self.method} {route}")
        if status >= 500:
            span.set_attribute("error.type", str(status))
            span.set_status(Status(StatusCode.ERROR))
        span.end()
        otel_context.detach(self.tokens[0])  # type: ignore[arg-type]  # the token attach gave
        deactivate(self.tokens[1])


_KNOWN_METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "DELETE", "PATCH", "OPTIONS", "CONNECT", "TRACE"})


def start_server_span(
    tracing: Tracing, method: str, route: str, path: str, scheme: str, headers: Mapping[str, str]
) -> ServerSpan:
    """The request's server span, parented on an incoming ``traceparent``, made current."""
    parent = PROPAGATOR.extract(headers)
    known = method if method in _KNOWN_METHODS else "_OTHER"  # a client's method names no span
    attributes: dict[str, Any] = {"http.request.method": known, "url.path": path, "url.scheme": scheme}
    if known == "_OTHER":
        attributes["http.request.method_original"] = method[:32]
    name = known if route == "unmatched" else f"{known} {route}"
    if route != "unmatched":
        attributes["http.route"] = route
    span = tracing.tracer.start_span(name, parent, SpanKind.SERVER, attributes)
    token = otel_context.attach(trace.set_span_in_context(span, parent))
    return ServerSpan(span, known, (token, activate(tracing)))


# --- internal spans -----------------------------------------------------------------------------


def traced(
    name: str,
    awaitable: Awaitable[T],
    describe: Callable[[T], Attributes] | None = None,
    attributes: Attributes | None = None,
) -> Awaitable[T]:
    """``awaitable`` inside an internal span ``name`` when tracing is on; ``describe`` turns its
    result into attributes. Off: ``awaitable`` itself (no coroutine of its own)."""
    tracing = _ACTIVE.get() if ON else None
    if tracing is None:
        return awaitable
    return _in_span(tracing, name, awaitable, describe, attributes)


async def _in_span(
    tracing: Tracing,
    name: str,
    awaitable: Awaitable[T],
    describe: Callable[[T], Attributes] | None,
    attributes: Attributes | None,
) -> T:
    with tracing.tracer.start_as_current_span(
        name, attributes=attributes, record_exception=False, set_status_on_exception=False
    ) as span:
        try:
            result = await awaitable
        except Exception as exc:
            failed(span, exc)
            raise
        if describe is not None and span.is_recording():
            span.set_attributes(describe(result))
        return result


def failed(span: trace.Span, exc: BaseException) -> None:
    """A failed step's span: ``error.type`` (the error's code, else its class), status ERROR; never
    the exception's message, which may quote the input (a media URL, a context value)."""
    code = getattr(exc, "code", None) or getattr(exc, "kind", None)
    span.set_attribute("error.type", code if isinstance(code, str) else type(exc).__qualname__)
    span.set_status(Status(StatusCode.ERROR))


def traced_fetch(url: str, fetching: Awaitable[Fetched]) -> Awaitable[Fetched]:
    """One media URL fetch in its span ``media.fetch`` (a child of ``media``): the host, never the
    URL (a signed URL's query is a credential); the bytes and redirects of what came back."""
    return traced("media.fetch", fetching, fetched_attributes, {"server.address": URL(url).host or ""})


# --- client spans (one per upstream attempt) -------------------------------------------------


@dataclass(frozen=True, slots=True)
class AttemptSpan:
    """How a router call's attempts are named: GenAI ``{operation} {model}`` by default, or an
    HTTP client span ``{method} {template}`` for the passthrough."""

    operation: str | None = "chat"
    """``gen_ai.operation.name``; None: not a GenAI operation (``/v1/files``)."""
    http_method: str | None = None
    url_template: str | None = None
    describe: Callable[[Any], Attributes] | None = None
    """Attributes of a successful attempt's value (the passthrough's status code)."""
    attributes: Attributes = field(default_factory=dict)
    held: HeldSpan | None = None
    """A streamed attempt: a successful attempt's span is left open, handed to ``held``, and
    ended by the caller when the stream does (with what only the end knows)."""


@dataclass(slots=True)
class HeldSpan:
    """A streamed attempt's client span, kept open from the first chunk to the stream's end."""

    span: trace.Span | None = None

    def end(self, attributes: Attributes, error: BaseException | str | None = None) -> None:
        """Record ``attributes`` and end the span, once; ``error``: the stream broke (what broke
        it, or the reason it ended incomplete: ``truncated``, ``stalled``, ...)."""
        span, self.span = self.span, None
        if span is None:
            return
        span.set_attributes(attributes)
        if isinstance(error, BaseException):
            failed(span, error)
        elif error is not None:
            span.set_attribute("error.type", error)
            span.set_status(Status(StatusCode.ERROR))
        span.end()


CHAT = AttemptSpan()


def attempt_name(spec: AttemptSpan, model: str) -> str:
    if spec.url_template is not None:
        return f"{spec.http_method} {spec.url_template}"
    return f"{spec.operation} {model}"


async def traced_attempt(
    tracing: Tracing,
    spec: AttemptSpan,
    kind: str,
    provider: str,
    model: str | None,
    retry: int,
    breaker: str,
    awaitable: Awaitable[T],
) -> T:
    """One upstream attempt inside its client span; the provider call under it carries this
    span's ``traceparent`` (``inject_traceparent``). A failure's kind becomes ``error.type``."""
    attributes: dict[str, Any] = {
        "gen_ai.provider.name": provider_name(kind),
        "cognitive.provider": provider,
        "cognitive.retry": retry,
        "cognitive.breaker.state": BREAKER_STATES.get(breaker, breaker),
    }
    if spec.operation is not None:
        attributes["gen_ai.operation.name"] = spec.operation
    if model is not None:
        attributes["gen_ai.request.model"] = model
    if spec.url_template is not None:
        attributes["http.request.method"] = spec.http_method or "_OTHER"
        attributes["url.template"] = spec.url_template
    if spec.attributes:
        attributes.update(spec.attributes)
    span = tracing.tracer.start_span(
        attempt_name(spec, model or ""), kind=SpanKind.CLIENT, attributes=attributes
    )
    with trace.use_span(span, end_on_exit=False, record_exception=False, set_status_on_exception=False):
        try:
            value = await awaitable
        except BaseException as exc:
            failure = getattr(exc, "kind", None)  # a ProviderError's kind; else the exception's type
            span.set_attribute("error.type", failure if isinstance(failure, str) else type(exc).__qualname__)
            status = getattr(exc, "status", None)
            if isinstance(status, int):
                span.set_attribute("http.response.status_code", status)
            span.set_status(Status(StatusCode.ERROR))
            span.end()
            raise
        if spec.describe is not None:
            span.set_attributes(spec.describe(value))
    if spec.held is not None:
        spec.held.span = span
    else:
        span.end()
    return value


BREAKER_STATES = {"closed": "closed", "trial": "half_open"}
"""The breaker's admission of an attempt as the span says it (a trial is the half-open probe)."""

_PROVIDER_NAMES = {"openai": "openai", "anthropic": "anthropic", "offline": "cognitive_proxy.offline"}
"""A provider kind's ``gen_ai.provider.name`` (the conventions' well-known values where one fits)."""


def provider_name(kind: str) -> str:
    return _PROVIDER_NAMES.get(kind, kind)


def with_traceparent(headers: dict[str, str]) -> dict[str, str]:
    """``headers`` as they are (tracing off), or a copy carrying the current span's ``traceparent``."""
    if not ON or _ACTIVE.get() is None:
        return headers
    carried = dict(headers)
    inject_traceparent(carried)
    return carried


def inject_traceparent(headers: MutableMapping[str, str]) -> None:
    """Set ``traceparent`` (and ``tracestate``) of the current span on an outgoing request;
    nothing when tracing is off (a client's own ``traceparent`` then goes on as it came)."""
    if ON and _ACTIVE.get() is not None:
        for name in ("traceparent", "tracestate"):
            headers.pop(name, None)
        PROPAGATOR.inject(headers)


def note_exchange(body: Mapping[str, Any], reply: Mapping[str, Any]) -> None:
    """The GenAI attributes of one chat completion on the current (client) span: request
    parameters, response model, id, finish reasons and token usage; with ``content``, the
    messages and the answer, redacted and capped."""
    tracing = _ACTIVE.get() if ON else None
    if tracing is None:
        return
    span = trace.get_current_span()
    if not span.is_recording():
        return
    span.set_attributes(exchange_attributes(body, reply))
    if tracing.content:
        span.set_attributes(content_attributes(body, reply, tracing.content_max_chars))


_REQUEST_PARAMETERS = (
    ("temperature", "gen_ai.request.temperature", float),
    ("top_p", "gen_ai.request.top_p", float),
    ("max_tokens", "gen_ai.request.max_tokens", int),
    ("max_completion_tokens", "gen_ai.request.max_tokens", int),
    ("seed", "gen_ai.request.seed", int),
)
_USAGE = (
    (("prompt_tokens", "input_tokens"), "gen_ai.usage.input_tokens"),
    (("completion_tokens", "output_tokens"), "gen_ai.usage.output_tokens"),
)


def exchange_attributes(body: Mapping[str, Any], reply: Mapping[str, Any]) -> dict[str, Any]:
    """The attributes ``note_exchange`` records (no content)."""
    return {**request_attributes(body), **response_attributes(reply)}


def request_attributes(body: Mapping[str, Any]) -> dict[str, Any]:
    """A chat request's parameters: temperature, top_p, max tokens, seed."""
    out: dict[str, Any] = {}
    for key, name, kind in _REQUEST_PARAMETERS:
        value = body.get(key)
        if isinstance(value, int | float) and not isinstance(value, bool):
            out[name] = kind(value)
    return out


def streamed_attributes(head: bytes, finish_reasons: list[str], usage: Mapping[str, Any]) -> dict[str, Any]:
    """A streamed chat completion's model and id (read from its first chunk's bytes ``head``),
    finish reasons and usage, as ``response_attributes`` names them; only when traced."""
    first: Any = {}
    line = head.partition(b"\n")[0].strip() if head.startswith(b"data: ") else b""
    with contextlib.suppress(orjson.JSONDecodeError):
        first = orjson.loads(line[6:]) if line else {}
    first = first if isinstance(first, dict) else {}
    return response_attributes(
        {
            "model": first.get("model"),
            "id": first.get("id"),
            "choices": [{"finish_reason": reason} for reason in finish_reasons],
            "usage": dict(usage),
        }
    )


def response_attributes(reply: Mapping[str, Any]) -> dict[str, Any]:
    """An OpenAI ``chat.completion``'s model, id, finish reasons and token usage."""
    out: dict[str, Any] = {}
    if isinstance(reply.get("model"), str):
        out["gen_ai.response.model"] = reply["model"]
    if isinstance(reply.get("id"), str):
        out["gen_ai.response.id"] = reply["id"]
    choices = reply.get("choices")
    if isinstance(choices, list):
        reasons = [
            c["finish_reason"]
            for c in choices
            if isinstance(c, dict) and isinstance(c.get("finish_reason"), str)
        ]
        if reasons:
            out["gen_ai.response.finish_reasons"] = reasons
    usage = reply.get("usage")
    if isinstance(usage, dict):
        for names, name in _USAGE:
            for key in names:
                value = usage.get(key)
                if type(value) is int:
                    out[name] = value
                    break
    return out


MAX_MESSAGES = 16
"""Messages recorded per attribute at most (the last ones: a long conversation's newest turns)."""


def content_attributes(body: Mapping[str, Any], reply: Mapping[str, Any], limit: int) -> dict[str, str]:
    """``gen_ai.input.messages`` / ``gen_ai.output.messages`` as JSON, redacted; each message's
    text cut at ``limit`` characters, at most ``MAX_MESSAGES`` messages."""
    out: dict[str, str] = {}
    messages = body.get("messages")
    if isinstance(messages, list):
        out["gen_ai.input.messages"] = capped(messages[-MAX_MESSAGES:], limit)
    choices = reply.get("choices")
    if isinstance(choices, list):
        answers = [c.get("message") for c in choices[:MAX_MESSAGES] if isinstance(c, dict)]
        out["gen_ai.output.messages"] = capped(answers, limit)
    return out


def capped(messages: list[Any], limit: int) -> str:
    """``messages`` through the log redaction, as JSON, each text cut at ``limit`` characters."""
    return orjson.dumps([_cut(scrub(m), limit) for m in messages], default=str).decode()


def _cut(message: Any, limit: int) -> Any:
    if not isinstance(message, dict) or not isinstance(message.get("content"), str):
        return message
    text = message["content"]
    return message if len(text) <= limit else {**message, "content": text[:limit] + "…"}


def first_token(seconds: float) -> None:
    """The stream's first token on the current (client) span: a span event."""
    if not ON or _ACTIVE.get() is None:
        return
    span = trace.get_current_span()
    if span.is_recording():
        span.add_event("gen_ai.first_token", {"gen_ai.response.time_to_first_chunk": seconds})


# --- what the internal spans say (no content) -------------------------------------------------


def contract_attributes(result: ContractResult) -> dict[str, Any]:
    """The contract check's outcome: passed, the error code, the repairs and violations made."""
    out: dict[str, Any] = {"cognitive.contract.passed": result.passed}
    if result.error_code is not None:
        out["cognitive.contract.error_code"] = result.error_code
        out["error.type"] = result.error_code
    if result.repairs:
        out["cognitive.contract.repairs"] = [r.kind for r in result.repairs]
    if result.violations:
        out["cognitive.contract.violations"] = len(result.violations)
    return out


def media_attributes(found: dict[str, Any] | tuple[Media, ...]) -> dict[str, Any]:
    """The media step's outcome: how many inputs, their types and bytes (never the bytes)."""
    if isinstance(found, dict):
        code = as_dict(found.get("error")).get("code")
        return {"cognitive.media.refused": True, "error.type": str(code)}
    return {
        "cognitive.media.count": len(found),
        "cognitive.media.bytes": sum(m.size for m in found),
        "cognitive.media.types": sorted({m.media_type for m in found}),
        "cognitive.media.fetched": sum(1 for m in found if m.form == "url"),
    }


def fetched_attributes(fetched: Fetched) -> dict[str, Any]:
    """A media fetch's outcome: its bytes, the redirects followed and the type served."""
    out: dict[str, Any] = {
        "cognitive.media.bytes": len(fetched.data),
        "cognitive.media.redirects": max(len(fetched.chain) - 1, 0),
    }
    if fetched.content_type:
        out["cognitive.media.served_type"] = fetched.content_type.split(";", 1)[0].strip()
    return out


def found_attributes(entry: object) -> dict[str, bool]:
    """A store lookup: whether it found anything."""
    return {"cognitive.cache.hit": entry is not None}
