"""Provider failure -> HTTP answer, in one place (as httpx has one ``map_httpcore_exceptions``).

Every OpenAI-format path that calls a provider comes here when the call failed:

* chat completions passed through (``failed_call``): the proxy's error body, its status from
  ``FAILURE_ANSWERS``, but an upstream's own 4xx answer as it came;
* the ``/v1/*`` reverse proxy and the Responses API passed through (``failed_relay``): the
  upstream's own answer as it came whenever there was one, else as ``failed_call``;
* a relayed stream that fails after its first byte (``broken_stream_event``): one SSE error event.

Module calls answer envelopes instead (``pipeline``): E4001 503 and E4002 429, the statuses this
table gives those failures.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import orjson
from aiohttp import web

from proxy.api.errors import error_body, json_response, retry_after_value
from proxy.api.headers import returned_headers
from proxy.upstream.base import FailureKind, ProviderError
from proxy.upstream.router import RungFailed, real_failures, retry_after_s

RETRY_STATUSES = frozenset({429, 503})
"""Answers that carry ``Retry-After``."""


@dataclass(frozen=True, slots=True)
class FailureAnswer:
    """What the client hears for a failure: status, OpenAI error ``type`` and ``code``."""

    status: int
    type: str
    code: str

    @property
    def retry_after(self) -> bool:
        """Whether the answer carries ``Retry-After`` (the largest of the tries, else 1)."""
        return self.status in RETRY_STATUSES


# What the client hears when a provider failure is the last word (no upstream answer passed on).
FAILURE_ANSWERS: Mapping[FailureKind, FailureAnswer] = {
    "connect": FailureAnswer(502, "server_error", "upstream_error"),
    "server_error": FailureAnswer(502, "server_error", "upstream_error"),
    "malformed": FailureAnswer(502, "server_error", "upstream_error"),
    "timeout": FailureAnswer(504, "server_error", "upstream_timeout"),
    "rate_limited": FailureAnswer(429, "rate_limit_error", "rate_limited"),
    "circuit_open": FailureAnswer(503, "server_error", "provider_unavailable"),
    "client_error": FailureAnswer(400, "invalid_request_error", "upstream_client_error"),
}
UPSTREAM_UNAVAILABLE = FailureAnswer(503, "server_error", "upstream_unavailable")
"""An upstream 503 says "unavailable, try later" (often with Retry-After): kept, not made a 502."""

FAILED_MESSAGE = "Upstream provider failed: {}"
UNAVAILABLE_MESSAGE = "Every provider target is unavailable ({})"
STREAM_FAILED_MESSAGE = "Upstream stream failed ({}): {}"
STREAM_ERROR_CODE = "upstream_stream_error"


def failure_answer(exc: ProviderError) -> FailureAnswer:
    """Status, type and code for a provider failure (the one kind -> HTTP status table)."""
    if exc.kind == "server_error" and exc.status == 503:
        return UPSTREAM_UNAVAILABLE
    return FAILURE_ANSWERS[exc.kind]


def failed_call(exc: RungFailed) -> web.Response:
    """Every target failed. The client hears the last failure of a request actually sent (a
    client error as the upstream sent it), with the largest upstream ``Retry-After``; when every
    target was skipped by its breaker (or there is none), the proxy's own 503 with the time until
    the first half-open trial."""
    if exc.final is not None:
        return _provider_failure(exc.final)
    retry_after = retry_after_s(exc.failures)
    sent = real_failures(exc.failures)
    if sent:
        return _provider_failure(sent[-1], retry_after)
    reason = "circuit breakers open" if exc.failures else "no provider target"
    answer = FAILURE_ANSWERS["circuit_open"]
    return json_response(
        error_body(UNAVAILABLE_MESSAGE.format(reason), answer.type, answer.code),
        status=answer.status,
        headers={"Retry-After": retry_after_value(retry_after)},
    )


def failed_relay(exc: RungFailed) -> web.Response:
    """The upstream's own answer when there was one (status, headers, body as sent; the largest
    Retry-After of the tries); otherwise the proxy's (``failed_call``)."""
    sent = real_failures(exc.failures)
    last = sent[-1] if sent else None
    if last is not None and last.status is not None and last.body:
        headers = dict(returned_headers(last.headers))
        retry_after = retry_after_s(exc.failures)
        if retry_after is not None and last.status in RETRY_STATUSES:
            headers = {k: v for k, v in headers.items() if k.lower() != "retry-after"}
            headers["Retry-After"] = retry_after_value(retry_after)
        return web.Response(body=last.body, status=last.status, headers=headers)
    return failed_call(exc)


def _provider_failure(exc: ProviderError, retry_after: float | None = None) -> web.Response:
    """One provider failure as the client sees it. The upstream's own 4xx answers pass through
    unchanged (status and body); otherwise the status comes from ``failure_answer``, and 429/503
    carry ``Retry-After`` (``retry_after``, else the failure's own, else 1)."""
    if exc.kind == "client_error" and exc.status is not None and exc.body:
        return web.Response(
            body=exc.body,
            status=exc.status,
            headers={},
            content_type=exc.headers.get("Content-Type", "application/json").split(";")[0],
        )
    answer = failure_answer(exc)
    headers: dict[str, str] = {}
    if answer.retry_after:
        headers["Retry-After"] = retry_after_value(
            retry_after if retry_after is not None else exc.retry_after
        )
    body = error_body(FAILED_MESSAGE.format(exc.message), answer.type, answer.code)
    return json_response(body, status=answer.status, headers=headers)


def broken_stream_event(reason: str, message: str, *, named: bool) -> bytes:
    """The event that ends a relayed stream which failed after its first byte (``reason`` as
    counted in ``cognitive_stream_incomplete_total``)."""
    return stream_error_event(STREAM_FAILED_MESSAGE.format(reason, message), STREAM_ERROR_CODE, named=named)


def stream_error_event(message: str, code: str, *, named: bool = False) -> bytes:
    """The SSE event that ends a stream the proxy could not finish: the OpenAI error object as the
    event's data (the OpenAI SDKs raise on a ``data`` holding ``error``); ``named`` streams (the
    Responses API) get ``event: error`` and the Responses error fields too."""
    error = error_body(message, "server_error", code)
    if not named:
        return b"data: " + orjson.dumps(error) + b"\n\n"
    event = {"type": "error", "code": code, "message": message, "param": None, **error}
    return b"event: error\ndata: " + orjson.dumps(event) + b"\n\n"
