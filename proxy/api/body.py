"""Reading request bodies (bounded by the app's ``client_max_size``) and upstream failures."""

from __future__ import annotations

from typing import Any

import orjson
from aiohttp import web

from proxy.api.errors import ApiError, json_response
from proxy.upstream.base import ProviderError
from proxy.upstream.router import RungFailed


async def read_object(request: web.Request) -> dict[str, Any]:
    """The request's JSON object; 400 in OpenAI's format when it is not one."""
    raw = await request.read()  # aiohttp stops at client_max_size with 413, never reads past it
    try:
        value = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise ApiError(400, f"The request body is not valid JSON: {exc}", code="invalid_json") from exc
    if not isinstance(value, dict):
        raise ApiError(400, "The request body must be a JSON object", code="invalid_json")
    return value


def upstream_failure(exc: ProviderError, trace_id: str) -> web.Response:
    """A provider failure on a passthrough call, as the client sees it.

    The upstream's own 4xx answers pass through unchanged (status and body); rate limits keep
    their ``Retry-After``; connection failures and 5xx are 502, timeouts 504.
    """
    headers = {"X-Cognitive-Trace-Id": trace_id}
    if exc.kind == "client_error" and exc.status is not None and exc.body:
        return web.Response(
            body=exc.body,
            status=exc.status,
            headers=headers,
            content_type=exc.headers.get("Content-Type", "application/json").split(";")[0],
        )
    if exc.kind == "rate_limited":
        headers["Retry-After"] = str(max(1, round(exc.retry_after or 1)))
        status, type_, code = 429, "rate_limit_error", "rate_limited"
    elif exc.kind == "timeout":
        status, type_, code = 504, "server_error", "upstream_timeout"
    else:
        status, type_, code = 502, "server_error", "upstream_error"
    body = {
        "error": {
            "message": f"Upstream provider failed: {exc.message}",
            "type": type_,
            "param": None,
            "code": code,
        }
    }
    return json_response(body, status=status, headers=headers)


def passthrough_failure(exc: RungFailed, trace_id: str) -> web.Response:
    """Every target failed. The proxy's own refusal (all breakers open, or no target) is 503 with
    Retry-After; otherwise the client sees the last upstream failure (a client error as the
    upstream sent it)."""
    if exc.final is not None:
        return upstream_failure(exc.final, trace_id)
    if exc.failures and not all("circuit breaker open" in f.message for f in exc.failures):
        return upstream_failure(exc.failures[-1], trace_id)
    reason = "circuit breakers open" if exc.failures else "no provider target"
    return json_response(
        {
            "error": {
                "message": f"Every provider target is unavailable ({reason})",
                "type": "server_error",
                "param": None,
                "code": "provider_unavailable",
            }
        },
        status=503,
        headers={"Retry-After": "1", "X-Cognitive-Trace-Id": trace_id},
    )
