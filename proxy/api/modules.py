"""The module catalogue: ``GET /v1/modules`` and ``GET /v1/modules/{name}`` (manifest summaries)."""

from __future__ import annotations

from typing import Any

import structlog
from aiohttp import web

from proxy.api.app_keys import Runtime, runtime_of
from proxy.api.envelopes import not_installed_response, unavailable_response
from proxy.api.errors import json_response
from proxy.api.middleware import RECORD_KEY
from proxy.module.resolve import Unavailable
from proxy.observability.metrics import (
    OTHER,
    OUTCOME_UNAVAILABLE,
    OUTCOME_UNKNOWN_MODULE,
)

log = structlog.get_logger("proxy.api")


def module_not_found(name: str, runtime: Runtime, request: web.Request) -> web.Response:
    """E4006 (404) as an envelope; the module label is ``other`` (names come from the registry).
    A composite that is installed but unavailable answers its load error instead."""
    record = request[RECORD_KEY]
    unavailable = runtime.registry.unavailable_module(name)
    if unavailable is not None:
        record.module, record.outcome = unavailable.module.name, OUTCOME_UNAVAILABLE
        return unavailable_response(unavailable, record.trace_id)
    record.module, record.outcome = OTHER, OUTCOME_UNKNOWN_MODULE
    return not_installed_response(name, runtime.registry.names(), record.trace_id)


def _unavailable_summary(unavailable: Unavailable) -> dict[str, Any]:
    module = unavailable.module
    return {
        "id": module.name,
        "object": "module",
        **module.summary(),
        "available": False,
        "load_error": {"code": unavailable.code, "message": unavailable.reason},
    }


async def list_modules(request: web.Request) -> web.Response:
    runtime = runtime_of(request)
    data = [
        {"id": m.name, "object": "module", **m.summary(), "available": True}
        for m in (runtime.registry.modules[n] for n in runtime.registry.names())
    ]
    data += [
        _unavailable_summary(runtime.registry.unavailable[n]) for n in sorted(runtime.registry.unavailable)
    ]
    return json_response({"object": "list", "data": data})


async def get_module(request: web.Request) -> web.Response:
    runtime = runtime_of(request)
    name = request.match_info["name"]
    module = runtime.registry.get(name)
    if module is None:
        unavailable = runtime.registry.unavailable_module(name)
        if unavailable is not None:  # the manifest, and why it cannot run
            return json_response(_unavailable_summary(unavailable))
        return module_not_found(name, runtime, request)
    return json_response({"id": module.name, "object": "module", **module.summary(), "available": True})
