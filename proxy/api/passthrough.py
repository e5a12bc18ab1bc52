"""Every other ``/v1/*`` path: a transparent reverse proxy to the provider the policy chooses.

Bodies stream both ways (a 100 MB upload goes through with flat memory; SSE answers are
forwarded as they arrive), as the client's bytes: a compressed upload keeps its
``Content-Encoding``. The request target is validated and normalised first (``api.target``: 400
for absolute-form, dot segments, encoded separators) and the upstream URL is the provider's
``base_url`` with that path, so no client input reaches the upstream's host. Only the request
headers ``api.headers`` forwards (``FORWARDED_HEADERS``, ``OpenAI-*``) go upstream, with the
provider's key injected; the upstream's headers (``x-ratelimit-*``, ``retry-after``, request ids)
and error bodies come back but for ``Set-Cookie`` and hop-by-hop headers. Requests that are safe
to resend (GET/HEAD/DELETE, JSON bodies of idempotent-in-effect endpoints, anything carrying an
``Idempotency-Key``) fail over between the route's providers; uploads are never replayed.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, replace
from functools import partial
from typing import Any

import aiohttp
import structlog
from aiohttp import web
from multidict import CIMultiDict

from proxy.api.app_keys import ROUTER, SESSION, SETTINGS, Runtime, runtime_of
from proxy.api.body import read_body
from proxy.api.errors import ApiError
from proxy.api.failures import failed_relay
from proxy.api.headers import connection_tokens, forwarded, returned_headers
from proxy.api.limits import count_request
from proxy.api.middleware import RECORD_KEY
from proxy.api.offline_passthrough import answer_offline
from proxy.api.relay_answer import serve
from proxy.api.stream_response import HeldHeadResponse
from proxy.api.target import ClientTarget, parse_target, upstream_url
from proxy.observability.tracing import CHAT, AttemptSpan, active, inject_traceparent
from proxy.policy.model import Failover, Policy, ProviderConfig, Target
from proxy.policy.provider_kinds import PROVIDER_KINDS
from proxy.upstream.base import CallInfo, Provider, ProviderError
from proxy.upstream.body import Body
from proxy.upstream.http import auth_headers, client_timeout, status_error
from proxy.upstream.relay import first_chunk, send
from proxy.upstream.router import Routed, RungFailed, Try
from proxy.upstream.sse import StreamCheck, wire_format

log = structlog.get_logger("proxy.passthrough")

IDEMPOTENT_IN_EFFECT = frozenset({"/v1/embeddings", "/v1/moderations"})
SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS", "DELETE"})
PASSTHROUGH_MODEL = "passthrough"
CHUNK = 64 * 1024
_RETRYABLE_STATUS = frozenset({429, 500, 502, 503, 504})

# Static path segments of the OpenAI API: anything else in a path is an id, so the metric label
# is a template (/v1/files/{id}/content), never the raw path.
_STATIC_SEGMENTS = frozenset(
    {
        "assistants",
        "audio",
        "batches",
        "cancel",
        "chat",
        "checkpoints",
        "complete",
        "completions",
        "containers",
        "content",
        "conversations",
        "embeddings",
        "evals",
        "events",
        "files",
        "fine_tuning",
        "generations",
        "images",
        "input_items",
        "items",
        "jobs",
        "messages",
        "models",
        "moderations",
        "parts",
        "realtime",
        "responses",
        "results",
        "runs",
        "sessions",
        "speech",
        "steps",
        "threads",
        "transcriptions",
        "translations",
        "uploads",
        "variations",
        "vector_stores",
        "edits",
        "file_batches",
        "input_tokens",
    }
)


def path_template(path: str) -> str:
    """``/v1/files/file-abc/content`` -> ``/v1/files/{id}/content``; unknown shapes -> ``/v1/other``."""
    segments = [s for s in path.split("/")[2:] if s]
    if not segments or segments[0] not in _STATIC_SEGMENTS or len(segments) > 5:
        return "/v1/other"
    return "/v1/" + "/".join(s if s in _STATIC_SEGMENTS else "{id}" for s in segments)


def providers_for(policy: Policy, path: str) -> tuple[str, ...]:
    """The providers a path goes to, in failover order: the longest matching route prefix, else
    the default provider."""
    best: tuple[str, ...] = ()
    best_len = -1
    for route in policy.passthrough.routes:
        if (path == route.prefix or path.startswith(route.prefix.rstrip("/") + "/")) and len(
            route.prefix
        ) > best_len:
            best, best_len = route.providers, len(route.prefix)
    if best:
        return best
    return (policy.passthrough.provider,) if policy.passthrough.provider else ()


def outgoing_headers(request: web.Request, config: ProviderConfig, ctx: CallInfo) -> CIMultiDict[str]:
    hop = connection_tokens(request.headers)
    headers: CIMultiDict[str] = CIMultiDict(
        (name, value)
        for name, value in request.headers.items()
        if forwarded(name) and name.lower() not in hop
    )
    headers.update(auth_headers(config, ctx))
    for name, value in config.headers.items():
        headers[name] = value
    headers["X-Request-Id"] = ctx.trace_id
    inject_traceparent(headers)  # tracing on: the attempt's client span, not the client's
    return headers


@dataclass(frozen=True, slots=True)
class Outgoing:
    method: str
    target: ClientTarget
    body: bytes | None
    """The buffered body of a resendable request; None when the body streams from the client."""


async def _limited(request: web.Request, limit: int) -> AsyncIterator[bytes]:
    """The client's body as it arrives, refused past ``limit`` bytes."""
    sent = 0
    async for chunk in request.content.iter_chunked(CHUNK):
        sent += len(chunk)
        if sent > limit:
            raise ApiError(
                413,
                f"Request body too large: the passthrough limit is {limit} bytes",
                code="request_too_large",
            )
        yield chunk


# How far down __cause__/__context__ our own refusal (the body limit, raised inside the upload
# aiohttp's client reads) is looked for: it sits one or two links down; the bound stops a cycle.
_REFUSAL_DEPTH = 5


def _own_refusal(exc: BaseException) -> ApiError | None:
    """The ``ApiError`` this proxy raised while the upstream call read the client's body, if any."""
    seen: BaseException | None = exc
    for _ in range(_REFUSAL_DEPTH):
        if seen is None:
            return None
        if isinstance(seen, ApiError):
            return seen
        seen = seen.__cause__ or seen.__context__
    return None


def resendable(request: web.Request, template: str) -> bool:
    if request.method in SAFE_METHODS:
        return True
    if "Idempotency-Key" in request.headers:
        return request.content_type != "multipart/form-data"
    return template in IDEMPOTENT_IN_EFFECT and request.content_type == "application/json"


@dataclass(slots=True)
class _Answer:
    """An upstream answer up to its first bytes (its first real event when it is a judged stream)."""

    resp: aiohttp.ClientResponse
    head: bytes
    body: Body
    check: StreamCheck | None
    started: float
    """When the attempt's bound started (``time.monotonic``)."""
    timeout: float


async def _open(
    provider: Provider,
    target: Target,
    timeout: float,
    *,
    request: web.Request,
    outgoing: Outgoing,
    session: aiohttp.ClientSession,
    ctx: CallInfo,
    idle_s: float,
) -> _Answer:
    """Send the request to ``target``'s provider and read its answer up to the first bytes. A
    retryable status (429, 5xx) raises, with the upstream's body and headers, so the router can
    retry or fail over; when nothing is left that answer goes back to the client as the upstream
    sent it. So does a stream that breaks, stalls or ends before its first real event."""
    config = provider.config
    url = upstream_url(config.base_url, outgoing.target)
    data: Any = None
    if outgoing.body is not None:
        data = outgoing.body
    elif request.can_read_body:
        data = _limited(request, request.app[SETTINGS].max_upload_bytes)
    started = time.monotonic()
    try:
        resp = await send(
            session,
            outgoing.method,
            url,
            data=data,
            headers=outgoing_headers(request, config, ctx),
            timeout=client_timeout(timeout, max(timeout, idle_s)),
        )
    except ProviderError as exc:
        refusal = _own_refusal(exc)
        if refusal is not None:
            raise refusal from None  # the client's body broke our limit: 413, not a provider failure
        raise
    if resp.status in _RETRYABLE_STATUS:
        try:
            body = await resp.read()
        except (TimeoutError, aiohttp.ClientError) as exc:
            raise ProviderError("connect", f"{config.name} broke its {resp.status} answer") from exc
        finally:
            resp.release()
        raise status_error(resp.status, body, dict(resp.headers))
    if outgoing.body is None:
        started = time.monotonic()  # a streamed upload's sending time is the client's, not the attempt's
    wire = wire_format(outgoing.target.path) if resp.content_type == "text/event-stream" else None
    check = StreamCheck(wire) if wire is not None and resp.status == 200 else None
    # Released by _relay_answer; nothing waits for the request's sending (a streamed upload may go on).
    answer = Body.of_response(resp, wait_for_close=False)
    try:
        head = await first_chunk(answer, check)
    except BaseException:
        resp.release()
        raise
    return _Answer(resp, head, answer, check, started, timeout)


async def forward(request: web.Request, body: bytes | None = None) -> web.StreamResponse:
    """Proxy ``request`` (whose body may already have been read into ``body``) upstream."""
    runtime: Runtime = runtime_of(request)
    target = parse_target(request.raw_path)
    template = path_template(target.path)
    record = request[RECORD_KEY]
    record.route = template
    names = _provider_names(request, runtime.policy, target)
    first = runtime.policy.providers.get(names[0])
    if first is not None and PROVIDER_KINDS[first.kind].passthrough == "local":  # the offline demo
        return await answer_offline(request, body, first, template)
    _refuse_oversized(request)
    replay = body is not None or resendable(request, template)
    if replay and body is None and request.method not in SAFE_METHODS:
        body = await read_body(request)  # bounded by --max-body-bytes and the body budget
    targets = (
        tuple(Target(n, PASSTHROUGH_MODEL) for n in names)
        if replay
        else (Target(names[0], PASSTHROUGH_MODEL),)
    )
    timeouts = runtime.policy.timeouts
    operation = partial(
        _open,
        request=request,
        outgoing=Outgoing(request.method, target, body if replay else None),
        session=request.app[SESSION],
        ctx=CallInfo(trace_id=record.trace_id, client_key=record.client_key),
        idle_s=timeouts.idle_s,
    )
    started = time.perf_counter()
    now = time.monotonic()
    deadline = now + timeouts.total_s
    failover = runtime.policy.failover if replay else _no_retries(runtime)
    try:
        routed = await request.app[ROUTER].call(
            targets,
            runtime.providers,
            operation,
            failover,
            deadline,
            _log_try,
            bound_attempts=replay,
            span=CHAT if active() is None else _attempt_span(request.method, template),
        )
    except RungFailed as exc:
        record.upstream_s += time.perf_counter() - started
        return failed_relay(exc)
    record.fields["target"] = routed.target.provider
    answer = routed.value
    if answer.check is not None:  # a stream: stream_idle_s between chunks, stream_total_s overall
        idle_s: float | None = timeouts.idle_s
        until = None if timeouts.stream_total_s is None else now + timeouts.stream_total_s
    else:  # a plain answer: its attempt's bound and the call's deadline cover the body too
        idle_s, until = None, min(answer.started + answer.timeout, deadline)
    return await _relay_answer(request, routed, idle_s, until, started)


_GEN_AI_OPERATIONS = {
    "/v1/chat/completions": "chat",
    "/v1/completions": "text_completion",
    "/v1/embeddings": "embeddings",
    "/v1/responses": "chat",
}
"""``gen_ai.operation.name`` of the passthrough paths that are GenAI operations."""


def _attempt_span(method: str, template: str) -> AttemptSpan:
    """A passthrough attempt's client span (tracing on): ``{method} {template}``, its status code."""
    return AttemptSpan(_GEN_AI_OPERATIONS.get(template), method, template, _answer_attributes)


def _answer_attributes(answer: _Answer) -> dict[str, int]:
    return {"http.response.status_code": answer.resp.status}


def _provider_names(request: web.Request, policy: Policy, target: ClientTarget) -> tuple[str, ...]:
    """The passthrough providers of ``target``'s path, in failover order; 404 when none."""
    names = providers_for(policy, target.path)
    if not names:
        raise ApiError(
            404,
            f"{request.method} {target.path} is not handled by this proxy and the policy "
            "names no passthrough provider (passthrough.provider)",
            code="not_found",
        )
    return names


def _refuse_oversized(request: web.Request) -> None:
    """413 for a declared body over ``--max-upload-bytes`` before anything is read or sent."""
    limit = request.app[SETTINGS].max_upload_bytes
    if request.content_length is not None and request.content_length > limit:
        raise ApiError(
            413, f"Request body too large: the passthrough limit is {limit} bytes", code="request_too_large"
        )


def _log_try(attempt: Try) -> None:
    if attempt.error is not None:
        log.info(
            "proxy.upstream_failed",
            target=attempt.target.provider,
            kind=attempt.error.kind,
            status=attempt.error.status,
            retry=attempt.retry,
        )


async def _relay_answer(
    request: web.Request, routed: Routed[_Answer], idle_s: float | None, until: float | None, started: float
) -> web.StreamResponse:
    """The upstream's answer to the client as it arrives (status and headers as sent, less the
    hop-by-hop ones); the time it takes counts as upstream time."""
    answer = routed.value
    upstream = answer.resp
    try:
        response = HeldHeadResponse(
            status=upstream.status, reason=upstream.reason, headers=returned_headers(upstream.headers)
        )
        if upstream.content_length is not None and "Content-Encoding" not in upstream.headers:
            response.content_length = upstream.content_length
        await serve(
            request,
            response,
            routed.target,
            answer.head,
            answer.body,
            answer.check,
            idle_s=idle_s,
            until=until,
        )
        return response
    finally:
        upstream.release()
        request[RECORD_KEY].upstream_s += time.perf_counter() - started


def _no_retries(runtime: Runtime) -> Failover:
    return replace(runtime.policy.failover, retries=0)


async def catch_all(request: web.Request) -> web.StreamResponse:
    """Route handler for every ``/v1/*`` path the proxy does not handle itself."""
    await count_request(request)
    return await forward(request)
