"""Serving a relayed answer to the client, shared by chat passthrough and the generic passthrough:
the response is committed only once the answer's first real chunk is in (``upstream.relay``);
an answer that then fails ends with the SSE error event and is counted."""

from __future__ import annotations

import structlog
from aiohttp import web

from proxy.api.app_keys import METRICS, runtime_of
from proxy.api.failures import broken_stream_event
from proxy.policy.model import Target
from proxy.service.instrument import target_labels
from proxy.upstream.body import Body
from proxy.upstream.relay import StreamEnd, copy
from proxy.upstream.sse import StreamCheck

log = structlog.get_logger("proxy.api")


async def serve(
    request: web.Request,
    response: web.StreamResponse,
    target: Target,
    head: bytes,
    body: Body,
    check: StreamCheck | None,
    *,
    idle_s: float | None,
    until: float | None,
) -> StreamEnd:
    """Prepare ``response``, copy ``head`` and ``body`` into it and end it. A judged stream that
    ends incomplete gets the SSE error event; any other answer cut after its first byte has its
    connection closed (a short body, never one that looks whole)."""
    await response.prepare(request)
    end = await copy(head, body, response.write, check, idle_s=idle_s, until=until)
    metrics = request.app[METRICS]
    provider, model = target_labels(runtime_of(request).policy, target)
    if end.malformed and end.reason != "malformed_chunk":
        metrics.stream_incomplete.labels(provider, model, "malformed_chunk").inc()
    if end.reason is None:
        await response.write_eof()
        return end
    metrics.stream_incomplete.labels(provider, model, end.reason).inc()
    log.info("proxy.stream_incomplete", target=target.name, reason=end.reason, message=end.message)
    if check is None:
        if request.transport is not None:
            request.transport.close()
        return end
    await response.write(broken_stream_event(end.reason, end.message, named=check.wire == "responses"))
    await response.write_eof()
    return end
