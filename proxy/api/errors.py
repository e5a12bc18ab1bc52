"""One place maps errors to OpenAI error bodies: ``ApiError`` -> body and status, anything else a
handler raises -> its ``ApiError`` (500 for an unexpected one).

Provider failures are mapped in ``api.failures``; module answers never come through here: their
body is always an envelope (see ``api.modules``).
"""

from __future__ import annotations

import math
from collections.abc import Awaitable, Callable
from typing import Any

import orjson
import structlog
from aiohttp import web

log = structlog.get_logger("proxy.api")

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class ApiError(Exception):
    """An error answered in OpenAI's format: ``{"error": {"message", "type", "code"}}``."""

    def __init__(
        self,
        status: int,
        message: str,
        type_: str = "invalid_request_error",
        code: str | None = None,
        *,
        headers: dict[str, str] | None = None,
        param: str | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type_
        self.code = code
        self.headers = headers or {}
        self.param = param

    def body(self) -> dict[str, Any]:
        """The OpenAI error object this error answers with."""
        return error_body(self.message, self.type, self.code, self.param)

    def response(self) -> web.Response:
        return json_response(self.body(), status=self.status, headers=self.headers)


class ClientReadTimeout(TimeoutError):
    """The client stalled while sending its request body (``--client-read-timeout``).

    A ``TimeoutError``: aiohttp then drops the rest of the body quietly and closes."""


def request_timeout() -> ApiError:
    return ApiError(
        408,
        "The request was not received in time (--client-read-timeout); the connection is closed",
        code="request_timeout",
        headers={"Connection": "close"},
    )


def error_body(message: str, type_: str, code: str | None, param: str | None = None) -> dict[str, Any]:
    """The OpenAI error object: ``{"error": {"message", "type", "param", "code"}}``."""
    return {"error": {"message": message, "type": type_, "param": param, "code": code}}


def retry_after_value(seconds: float | None) -> str:
    """A ``Retry-After`` header value: whole seconds rounded up, at least 1."""
    return str(max(1, math.ceil(seconds or 0.0)))


def json_response(body: Any, *, status: int = 200, headers: dict[str, str] | None = None) -> web.Response:
    return web.Response(
        body=orjson.dumps(body), status=status, headers=headers, content_type="application/json"
    )


_HTTP_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    404: "not_found_error",
    405: "invalid_request_error",
    413: "invalid_request_error",
    429: "rate_limit_error",
}


def error_answer(request: web.Request, exc: BaseException) -> web.StreamResponse:
    """The answer to ``exc`` raised by a handler: an OpenAI error body with the right status.
    Re-raises what is not an error answer (cancellation, an HTTP redirect)."""
    return api_error_of(request, exc).response()


CLIENT_CLOSED = 499
"""The status of a request whose client hung up (nginx's): counted and logged, never sent."""


def client_closed(request: web.Request) -> ApiError | None:
    """A ``ConnectionResetError`` a handler raised as the client's hang-up, or None when the client
    is still there. A write to a connection the client reset raises aiohttp's
    ``ClientConnectionResetError`` when it comes before the handler's cancel (the transport
    closing, its ``connection_lost`` on the loop's next turn): the same hang-up as that cancel,
    not an internal error (issue s44 attack pass)."""
    transport = request.transport
    if transport is not None and not transport.is_closing():
        return None
    return ApiError(CLIENT_CLOSED, "The client closed the connection", code="client_closed")


KEPT_HTTP_HEADERS = ("Allow",)
"""What an aiohttp ``HTTPException`` says in a header that its OpenAI-format answer keeps (a 405's
``Allow``)."""


def api_error_of(request: web.Request, exc: BaseException) -> ApiError:
    """``exc`` raised by a handler as the ``ApiError`` it answers (500 for an unexpected one,
    logged). Re-raises what is not an error answer (cancellation, an HTTP redirect)."""
    if isinstance(exc, ApiError):
        return exc
    if isinstance(exc, ClientReadTimeout):
        return request_timeout()
    if isinstance(exc, web.HTTPException):
        if exc.status < 400:
            raise exc
        # aiohttp's own texts are specific ("Maximum request body size N exceeded, ...").
        message = exc.text if exc.text and not exc.text.startswith(str(exc.status)) else exc.reason
        kept = {name: exc.headers[name] for name in KEPT_HTTP_HEADERS if name in exc.headers}
        return ApiError(
            exc.status,
            message,
            _HTTP_TYPES.get(exc.status, "invalid_request_error"),
            exc.reason.lower().replace(" ", "_"),
            headers=kept or None,
        )
    if not isinstance(exc, Exception):  # CancelledError, KeyboardInterrupt, SystemExit
        raise exc
    log.exception("proxy.internal_error", path=request.path, exc_info=exc)
    return ApiError(
        500, "Internal error in the proxy; see its log for the trace id", "server_error", "internal_error"
    )


@web.middleware
async def error_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Every failure leaves as an OpenAI error body with the right status (the admin listener's
    only middleware; the API's ``edge_middleware`` maps errors the same way)."""
    try:
        return await handler(request)
    except BaseException as exc:  # error_answer re-raises cancellation and redirects
        return error_answer(request, exc)
