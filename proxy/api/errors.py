"""One place maps errors: ``ApiError`` -> OpenAI error body; anything unexpected -> 500.

Module answers never come through here: their body is always an envelope (see ``api.modules``).
"""

from __future__ import annotations

import asyncio
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

    def response(self) -> web.Response:
        return json_response(
            {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}},
            status=self.status,
            headers=self.headers,
        )


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


@web.middleware
async def error_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Outermost middleware: every failure leaves as an OpenAI error body with the right status."""
    try:
        return await handler(request)
    except ApiError as exc:
        return exc.response()
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        # aiohttp's own texts are specific ("Maximum request body size N exceeded, ...").
        message = exc.text if exc.text and not exc.text.startswith(str(exc.status)) else exc.reason
        return ApiError(
            exc.status,
            message,
            _HTTP_TYPES.get(exc.status, "invalid_request_error"),
            exc.reason.lower().replace(" ", "_"),
        ).response()
    except asyncio.CancelledError:
        raise
    except Exception:
        log.exception("proxy.internal_error", path=request.path)
        return ApiError(
            500, "Internal error in the proxy; see its log for the trace id", "server_error", "internal_error"
        ).response()
