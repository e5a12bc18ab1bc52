"""The API's one middleware, ``edge_middleware``, and the steps it runs in this order: error
mapping (outermost), the request-target check, the trace id, observation (metrics and the one
log line), the browser guard, the route's scope (``proxy.api.access``), the body budget's
reservation, and the route's methods.

One middleware instead of a chain: each layer of aiohttp's chain is a coroutine frame and a call
per request; the steps are plain functions here.
"""

from __future__ import annotations

import asyncio
import os
import re
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from aiohttp import hdrs, web
from aiohttp.http import HttpVersion11

from proxy.api.access import ROUTE_INDEX, Route, check_method, check_scope
from proxy.api.app_keys import CLIENT_ACTIVITY, METRICS, RUNTIME, SETTINGS, TRACING
from proxy.api.browser_guard import BROWSER_GUARD, check_headers
from proxy.api.budget import BUDGET, BodyBudget, Reservation
from proxy.api.errors import ApiError, Handler, api_error_of, client_closed, error_answer
from proxy.api.refusals import MODULE_ROUTES, refusal_response
from proxy.api.target import check_target_form
from proxy.clients import ANONYMOUS_CALLER, Caller, caller_of
from proxy.limits.limiter import Admission
from proxy.observability import tracing as otel
from proxy.observability.logging import bind_request, request_line
from proxy.observability.metrics import NO_MODULE, OUTCOME_NONE, Metrics
from proxy.observability.tracing import ServerSpan, Tracing, start_server_span
from proxy.service.shadow import ClientActivity
from proxy.settings import Settings

TRACE_HEADER = "X-Cognitive-Trace-Id"


@dataclass(frozen=True, slots=True)
class EdgeApp:
    """What the edge reads of its app on every request, read once: ``edge_dispatch`` reads it
    when the app has started (its state is final then), aiohttp's own dispatch per request
    (``edge_middleware``). Each ``app[key]`` is a Python frame of aiohttp's, each ``request.app``
    a property's."""

    app: web.Application
    settings: Settings
    metrics: Metrics
    activity: ClientActivity
    budget: BodyBudget
    browser_guard: bool
    route_index: Mapping[web.AbstractResource, Route]

    @classmethod
    def of(cls, app: web.Application) -> EdgeApp:
        return cls(
            app,
            app[SETTINGS],
            app[METRICS],
            app[CLIENT_ACTIVITY],
            app[BUDGET],
            app[BROWSER_GUARD],
            app[ROUTE_INDEX],
        )


@dataclass(slots=True)  # built per request: not frozen (a frozen init costs 4x)
class RequestRecord:
    """The request's one state object (``request[RECORD_KEY]``), made by the edge before any step:
    who the client is and the trace id (set by the edge, read by handlers), then what handlers fill
    in, read once by ``_observed`` for metrics and the log line. One request key instead of one
    per fact: each ``request[key] = value`` is a Python frame of aiohttp's (about 1.3 k
    instructions)."""

    app: web.Application
    """``request.app`` (a property), set by the edge: what handlers read the app's state from."""
    trace_id: str = ""
    """The request's trace id (``bind_trace``); empty until the edge bound it."""
    client_key: str | None = None
    """The bearer token the client sent (None without one). Only for forwarding it
    (``forward_client_key``); who the client is, is ``caller``."""
    caller: Caller = ANONYMOUS_CALLER
    """Who the client is (``proxy.clients``' identity rule), set by the edge: every feature that
    keeps something per client (limits, feedback records, stream sessions, context, caches) keys
    it by ``caller.id``."""
    admin_caller: bool = False
    """Whether an admin key opened the request's route (``check_scope``)."""
    reservation: Reservation | None = None
    """The request's body-budget reservation (``proxy.api.budget``), taken by the edge before the
    handler runs: what reads the body holds its bytes in."""
    admission: Admission | None = None
    """What the request was admitted against when limits are configured (``proxy.api.limits``):
    its ``x-ratelimit-*`` headers and the settlement after the answer."""
    module: str = NO_MODULE
    outcome: str = OUTCOME_NONE
    upstream_s: float = 0.0
    route: str | None = None
    """A finer path template than the router's (the passthrough's ``/v1/files/{id}``)."""
    fields: dict[str, Any] = field(default_factory=dict)


RECORD_KEY = web.RequestKey("record", RequestRecord)

_TRACEPARENT = re.compile(r"^[0-9a-f]{2}-(?P<trace>[0-9a-f]{32})-[0-9a-f]{16}-[0-9a-f]{2}\Z")
_REQUEST_ID = re.compile(r"^[A-Za-z0-9._:/=+-]{1,128}\Z")  # \Z: "$" also matches before a final newline
TRACE_ID_BYTES = 16
"""128 random bits: a W3C trace id's size."""
TRACE_ID_PATTERN = _REQUEST_ID
"""Every trace id the proxy hands out matches it (a traceparent's 32 hex digits included)."""


def trace_id_of(request: web.Request, span: ServerSpan | None = None) -> str:
    """W3C ``traceparent``'s trace id, else a sane ``X-Request-Id``, else the server span's trace id
    (tracing on), else a new id."""
    headers = request.headers
    traceparent = headers.get("traceparent")
    if traceparent is not None:
        match = _TRACEPARENT.match(traceparent.strip().lower())
        if match and match["trace"] != "0" * 32:
            return match["trace"]
    request_id = headers.get("X-Request-Id", "").strip()
    if request_id and _REQUEST_ID.match(request_id):
        return request_id
    if span is not None:
        return span.trace_id
    # From the OS's CSPRNG: Mersenne Twister (random) is rebuilt from 156 observed 128-bit ids, and
    # then predicts every later one. Measured (timeit): 1.03 µs an id, 0.28 µs more than getrandbits.
    # os.urandom is what secrets.token_hex reads, without its two Python frames.
    return os.urandom(TRACE_ID_BYTES).hex()


def bind_trace(
    request: web.Request, record: RequestRecord, route: str, span: ServerSpan | None = None
) -> None:
    """Bind the trace id to the request and to every log line of it (``echo_trace_id`` answers it).
    With tracing on, a request that brought no id of its own takes its server span's trace id."""
    trace_id = record.trace_id = trace_id_of(request, span)
    bind_request(trace_id, route)


def echo_trace_id(record: RequestRecord, response: web.StreamResponse) -> None:
    """Called as an answer is prepared (``proxy.api.edge_request``) with the request's record:
    the one place the trace header is set, on every answer the edge middleware saw (plain,
    streamed, envelopes, error bodies), overriding any upstream copy."""
    if record.trace_id:
        response.headers[TRACE_HEADER] = record.trace_id


def bearer_of(request: web.Request) -> str | None:
    header = request.headers.get("Authorization")
    if not header:  # no key (a keyless proxy's every request): nothing to split
        return None
    scheme, _, token = header.partition(" ")
    return token.strip() if scheme.lower() == "bearer" and token.strip() else None


def authenticate(
    request: web.Request, record: RequestRecord, route: Route | None, settings: Settings
) -> None:
    """Who the caller is, and whether its key opens ``route`` (its row's scope, ``check_scope``)."""
    token = record.client_key = bearer_of(request)
    # Identities come from the keys file with the keys; an embedder naming identities alone keys them too.
    keyed = bool(settings.api_keys or settings.client_identities)
    record.caller = caller_of(token, settings.client_identities, keyed=keyed)
    record.admin_caller = check_scope(request, route, token, settings)


def route_of(request: web.Request) -> str:
    """The path template (``/v1/modules/{name}/execute``), never the raw path: a bounded label;
    ``unmatched`` for a path no row of the table names."""
    resource = request.match_info.route.resource
    return (
        resource.canonical if resource is not None and resource in request.app[ROUTE_INDEX] else "unmatched"
    )


@web.middleware
async def edge_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Every step of a request around its handler; every failure leaves as an OpenAI error body."""
    return await edge(request, handler, EdgeApp.of(request.app))


async def edge(request: web.Request, handler: Handler, parts: EdgeApp) -> web.StreamResponse:
    """``edge_middleware`` with its app's ``parts`` at hand."""
    record = request[RECORD_KEY] = RequestRecord(parts.app)
    try:
        check_target_form(request)
        resource = request.match_info.route.resource
        # One lookup for both: the row (route_of_request) and the metric label (route_of).
        row = None if resource is None else parts.route_index.get(resource)
        route = "unmatched" if row is None else resource.canonical  # type: ignore[union-attr]
        if otel.ON and (row is None or not row.probe):  # probes: polled, never traced
            tracing = parts.app[TRACING]
            if tracing is not None:
                return await _traced(request, record, handler, route, row, tracing, parts)
        bind_trace(request, record, route)
        return await _observed(request, record, handler, route, row, parts)
    except BaseException as exc:
        if route_of(request) in MODULE_ROUTES:
            return _module_refusal(request, api_error_of(request, exc))
        return error_answer(request, exc)


def edge_dispatch(app: web.Application) -> Callable[[web.Request], Awaitable[web.StreamResponse]] | None:
    """``app``'s requests as aiohttp's ``Application._handle`` serves them when ``edge_middleware``
    is the app's one middleware: the path resolved in the app's router (the one route table), the
    route's ``Expect`` handler, then the edge around the route's handler. Without aiohttp's
    middleware chain, looked up per request (a cached-chain lookup, a ``partial`` called with a
    keyword, and a middleware of its own restoring ``request.app`` for sub-applications, of which
    the proxy mounts none): about 10 k instructions a request. None for any other application
    (aiohttp's own dispatch serves it)."""
    if list(app.middlewares) != [edge_middleware]:
        return None
    router = app.router
    parts = EdgeApp.of(app)

    async def dispatch(request: web.Request) -> web.StreamResponse:
        match_info = await router.resolve(request)
        match_info.add_app(app)  # request.app, and the app whose on_response_prepare runs
        match_info.freeze()
        request._match_info = match_info  # what Application._handle sets: request.match_info
        if request.headers.get(hdrs.EXPECT):
            answered = await match_info.expect_handler(request)
            await request.writer.drain()
            if answered is not None:
                return answered
        return await edge(request, match_info.handler, parts)

    return dispatch


def _module_refusal(request: web.Request, error: ApiError) -> web.Response:
    """A refusal on a module route: the spec's envelope (``proxy.api.refusals``)."""
    current = request.app[RUNTIME].current
    module = current.registry.get(request.match_info.get("name", "")) if current is not None else None
    takes_media = module is not None and module.takes_media
    return refusal_response(error, takes_media=takes_media, trace_id=request[RECORD_KEY].trace_id or None)


async def _traced(
    request: web.Request,
    record: RequestRecord,
    handler: Handler,
    route: str,
    row: Route | None,
    tracing: Tracing,
    parts: EdgeApp,
) -> web.StreamResponse:
    """``_observed`` inside the request's server span (its status: what the client got, a refusal
    the outer handler answers included)."""
    span = start_server_span(tracing, request.method, route, request.path, request.scheme, request.headers)
    status = 500
    try:
        bind_trace(request, record, route, span)
        response = await _observed(request, record, handler, route, row, parts)
        status = response.status
        return response
    except (ApiError, web.HTTPException) as exc:
        status = exc.status
        raise
    except asyncio.CancelledError:
        status = 499
        raise
    finally:
        span.end(status, record.route or route)


async def _observed(
    request: web.Request,
    record: RequestRecord,
    handler: Handler,
    route: str,
    row: Route | None,
    parts: EdgeApp,
) -> web.StreamResponse:
    """Count the request, measure the proxy's own time (upstream excluded), and write the one
    canonical log line per request (quiet for the probe routes: polled every few seconds)."""
    started = time.perf_counter()
    activity = parts.activity
    if activity.watching:  # the shadow judge waits for no client request in flight
        activity.enter()
    status = 500
    try:
        response = await _admitted(request, record, parts, handler, row)
        status = response.status
        return response
    except (ApiError, web.HTTPException) as exc:
        status = exc.status
        raise
    except asyncio.CancelledError:
        status = 499  # the client hung up
        raise
    finally:
        total = time.perf_counter() - started
        route = record.route or route
        overhead = total - record.upstream_s
        overhead = overhead if overhead > 0.0 else 0.0  # not max(): ~1.5 k instructions a call
        parts.metrics.observe_request(route, record.module, status, record.outcome, overhead)
        request_line(
            "proxy.request",
            {
                "method": request.method,
                "module": record.module,
                "status": status,
                "upstream_ms": round(record.upstream_s * 1000, 3),
                "overhead_ms": round(overhead * 1000, 3),
                **record.fields,
            },
            quiet=row is not None and row.probe,
        )


EXPECT_CONTINUE = "100-continue"


def unknown_expectation() -> ApiError:
    """The answer to an ``Expect`` other than 100-continue (the value is the client's: never echoed)."""
    return ApiError(417, "Expect: only 100-continue is understood", code="expectation_failed")


async def expect_on_probes(request: web.Request) -> web.StreamResponse | None:
    """The probe listener's ``Expect`` handler. No edge runs after it there (no auth, no guard), so
    an expectation other than 100-continue is answered here, 417 in the OpenAI format; aiohttp's
    own would be ``text/plain`` echoing the client's value."""
    if request.headers.get(hdrs.EXPECT, "").lower() != EXPECT_CONTINUE:
        return unknown_expectation().response()
    await expect_continue(request)
    return None


async def expect_continue(request: web.Request) -> None:
    """Every route's ``Expect`` handler. aiohttp's own runs before every middleware and answers an
    expectation other than 100-continue with ``417 text/plain "Unknown Expect: <value>"``: the
    client's bytes echoed, no OpenAI error, no envelope on a module route, ahead of the host guard
    and auth. This one only sends ``100 Continue`` (HTTP/1.1, as aiohttp's does); any other
    expectation is refused by the edge after the guard and auth (``_admitted``), in the route's
    shape (issue #26 attack pass)."""
    if request.version == HttpVersion11 and request.headers.get(hdrs.EXPECT, "").lower() == EXPECT_CONTINUE:
        await request.writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
        request.writer.output_size = 0  # the answer's own body has not started


async def _admitted(
    request: web.Request, record: RequestRecord, parts: EdgeApp, handler: Handler, route: Route | None
) -> web.StreamResponse:
    """The browser guard, the route's scope, then the handler holding a body-budget reservation;
    a method the route's row does not list is refused just before the handler would run."""
    settings = parts.settings
    if parts.browser_guard:
        check_headers(settings, request.headers)  # check_browser, with the settings at hand
    authenticate(request, record, route, settings)
    expect = request.headers.get(hdrs.EXPECT)
    if expect and expect.lower() != EXPECT_CONTINUE:  # never echoed: the client's bytes
        raise unknown_expectation()
    reservation = record.reservation = Reservation(parts.budget)
    try:
        check_method(request, route)
        return await handler(request)
    except ConnectionResetError as exc:
        closed = client_closed(request)
        if closed is None:
            raise
        raise closed from exc
    finally:
        reservation.release()
