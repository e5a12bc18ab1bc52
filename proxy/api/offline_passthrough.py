"""``/v1/*`` passthrough to a ``kind: offline`` provider: the demo answers of
``proxy.upstream.offline_api`` for embeddings, moderations and plain Responses calls."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import orjson
from aiohttp import web

from proxy.api.body import ensure_encodable, inflate
from proxy.api.errors import ApiError, json_response
from proxy.api.stream_response import HeldHeadResponse
from proxy.policy.model import ProviderConfig
from proxy.upstream import offline_api
from proxy.upstream.offline import DEFAULT_REPLY
from proxy.wire import response_events, sse_event

Answer = Callable[[dict[str, Any], str, ProviderConfig], dict[str, Any]]

ANSWERS: dict[str, Answer] = {
    "/v1/embeddings": lambda body, model, _: offline_api.embeddings(body, model),
    "/v1/moderations": lambda body, model, _: offline_api.moderations(body, model),
    "/v1/responses": lambda body, model, config: offline_api.response(
        body, model, str(config.options.get("reply", DEFAULT_REPLY))
    ),
}


async def answer_offline(
    request: web.Request, body: bytes | None, config: ProviderConfig, template: str
) -> web.StreamResponse:
    """The offline provider's answer to a passthrough request; 404 for what it does not fake."""
    answer = ANSWERS.get(template) if request.method == "POST" else None
    if answer is None:
        raise ApiError(
            404,
            f"The offline demo provider {config.name!r} does not answer {request.method} {template}; "
            "it fakes POST /v1/embeddings, /v1/moderations and /v1/responses. "
            "Use a policy with a real provider for the rest.",
            code="not_found",
        )
    raw = body if body is not None else await request.read()
    try:
        payload = orjson.loads(inflate(request, raw))
    except orjson.JSONDecodeError as exc:
        raise ApiError(400, f"The request body is not valid JSON: {exc}", code="invalid_json") from exc
    if not isinstance(payload, dict):
        raise ApiError(400, "The request body must be a JSON object", code="invalid_json")
    ensure_encodable(payload)  # the demo answers re-encode parts of it, as a provider would read it
    model = payload.get("model") if isinstance(payload.get("model"), str) else "offline"
    try:
        result = answer(payload, str(model), config)
    except offline_api.OfflineRequestError as exc:
        raise ApiError(400, str(exc), code="invalid_value") from exc
    headers: dict[str, str] = {}
    if template != "/v1/responses" or payload.get("stream") is not True:
        return json_response(result, headers=headers)
    response = HeldHeadResponse(
        headers={**headers, "Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
    )
    await response.prepare(request)
    for event in response_events(result):
        await response.write(sse_event(event))
    await response.write_eof()
    return response
