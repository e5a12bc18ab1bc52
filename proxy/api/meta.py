"""Catalogue and health routes: models, capabilities, liveness, readiness, metrics."""

from __future__ import annotations

import os
from typing import Any

from aiohttp import web
from prometheus_client.exposition import choose_encoder

from proxy import __version__
from proxy.api.app_keys import METRICS, OUTBOX, RUNTIME, SETTINGS, runtime_of
from proxy.api.chat import MODULE_PREFIX
from proxy.api.errors import ApiError, json_response
from proxy.conformance_table import CLAIMED_LEVEL, SPEC_VERSIONS
from proxy.media.step import ladder_modalities, max_media_size_mb
from proxy.stream.negotiate import TRANSPORTS


def _model_entries(request: web.Request) -> list[dict[str, Any]]:
    runtime = runtime_of(request)
    entries: list[dict[str, Any]] = [
        {"id": alias, "object": "model", "created": 0, "owned_by": "cognitive-proxy", "route": target}
        for alias, target in sorted(runtime.policy.aliases.items())
    ]
    entries += [
        {
            "id": MODULE_PREFIX + name,
            "object": "model",
            "created": 0,
            "owned_by": "cognitive-proxy",
            "tier": runtime.registry.modules[name].tier,
        }
        for name in runtime.registry.names()
    ]
    return entries


async def list_models(request: web.Request) -> web.Response:
    """Policy aliases and ``module:<name>`` entries in OpenAI's list format."""
    return json_response({"object": "list", "data": _model_entries(request)})


async def retrieve_model(request: web.Request) -> web.Response:
    """``GET /v1/models/{id}``: the entry ``/v1/models`` lists under that id, else 404."""
    wanted = request.match_info["model"]
    for entry in _model_entries(request):
        if entry["id"] == wanted:
            return json_response(entry)
    raise ApiError(
        404,
        f"The model {wanted!r} does not exist; GET /v1/models lists the models of this proxy",
        code="model_not_found",
        param="model",
    )


async def capabilities(request: web.Request) -> web.Response:
    """The runtime's capability declaration (spec v2.5 §8.1, in its shape, plus the proxy's own)."""
    runtime = runtime_of(request)
    settings = request.app[SETTINGS]
    media = ladder_modalities(runtime.policy)
    return json_response(
        {
            "runtime": "cognitive-proxy",
            "version": __version__,
            "capabilities": {
                "streaming": True,
                "multimodal": {"input": media, "output": []},
                "max_media_size_mb": max_media_size_mb(media),
                "supported_transports": list(TRANSPORTS),
                "stream_recovery": settings.stream_recovery,
                "stream_session_ttl_s": settings.stream_session_ttl_s,
            },
            "spec_versions": list(SPEC_VERSIONS),
            "v2_5_features": ["streaming", "multimodal"] if media else ["streaming"],
            "conformance_level": CLAIMED_LEVEL,
            "response_modes": ["sync", "streaming"],
            "chat_completions": {"stream": True, "module_stream": "envelope"},
            "modalities": {"input": ["text", *media], "output": ["text"]},
            "max_body_bytes": request.app[SETTINGS].max_body_bytes,
            "modules": len(runtime.registry.modules),
            "providers": sorted(runtime.policy.providers),
        }
    )


async def healthz(request: web.Request) -> web.Response:
    """Liveness: answers as long as the process serves."""
    return json_response({"status": "ok"})


async def readyz(request: web.Request) -> web.Response:
    """Readiness: 200 only once the policy and the modules are loaded."""
    current = request.app[RUNTIME].current
    if current is None:
        return json_response({"status": "loading"}, status=503, headers={"Retry-After": "1"})
    body = {
        "status": "ready",
        "policy": current.policy.source,
        "modules": len(current.registry.modules),
        "module_problems": [str(p) for p in current.registry.problems],
    }
    worker = request.app[SETTINGS].worker
    if worker is not None:  # which of the --workers processes answered (each accepts on the port)
        body["worker"] = {"slot": worker, "pid": os.getpid()}
    outbox = request.app.get(OUTBOX)
    if outbox is not None:  # Redis down still serves (local breaker state, records kept): ready
        body["redis"] = "up" if outbox.up else "down"
        body["redis_pending_writes"] = len(outbox)
    return json_response(body)


async def metrics(request: web.Request) -> web.Response:
    """Prometheus text, or OpenMetrics when the scraper's ``Accept`` asks for it."""
    encoder, content_type = choose_encoder(request.headers.get("Accept", ""))
    return web.Response(body=encoder(request.app[METRICS].exposed()), headers={"Content-Type": content_type})
