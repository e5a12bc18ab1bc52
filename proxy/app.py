"""Builds the aiohttp Application: routes, middlewares in a fixed order, lifecycle."""

from __future__ import annotations

from collections.abc import AsyncIterator

import aiohttp
import structlog
from aiohttp import web
from prometheus_client import CollectorRegistry

from proxy.api import chat, meta, modules
from proxy.api.errors import error_middleware
from proxy.api.middleware import auth_middleware, trace_middleware
from proxy.api.state import RUNTIME, SESSION, SETTINGS, Runtime, RuntimeHolder
from proxy.module.registry import ModuleRegistry
from proxy.policy.loader import load_policy
from proxy.settings import Settings
from proxy.upstream.registry import build_providers

log = structlog.get_logger("proxy.app")


def load_runtime(settings: Settings, session: aiohttp.ClientSession) -> Runtime:
    """Policy, modules and provider clients; raises ``PolicyError`` for a bad policy. A broken
    module is logged with its path and reason and the others still load."""
    policy = load_policy(settings.policy_path)
    registry = ModuleRegistry.load(settings.module_dirs)
    for problem in registry.problems:
        log.warning("proxy.module_load_failed", path=str(problem.path), reason=problem.reason)
    return Runtime(policy, registry, build_providers(policy, session))


async def _session_ctx(app: web.Application) -> AsyncIterator[None]:
    settings = app[SETTINGS]
    connector = aiohttp.TCPConnector(limit=settings.pool_size, keepalive_timeout=30)
    async with aiohttp.ClientSession(
        connector=connector, auto_decompress=False, skip_auto_headers=("User-Agent",)
    ) as session:
        app[SESSION] = session
        yield


async def _runtime_ctx(app: web.Application) -> AsyncIterator[None]:
    current = load_runtime(app[SETTINGS], app[SESSION])
    app[RUNTIME].current = current
    log.info("proxy.loaded", policy=current.policy.source, modules=current.registry.names())
    yield


def build_app(settings: Settings) -> web.Application:
    """The proxy as an ``web.Application``; resources open and close with ``cleanup_ctx``."""
    app = web.Application(
        client_max_size=settings.max_body_bytes,
        middlewares=[error_middleware, trace_middleware, auth_middleware],
    )
    app[SETTINGS] = settings
    app[RUNTIME] = RuntimeHolder()
    app[meta.METRICS] = CollectorRegistry(auto_describe=True)
    app.cleanup_ctx.extend([_session_ctx, _runtime_ctx])
    app.router.add_post("/v1/chat/completions", chat.chat_completions)
    app.router.add_get("/v1/models", meta.list_models)
    app.router.add_post("/v1/modules/{name}/execute", modules.execute)
    app.router.add_get("/v1/modules", modules.list_modules)
    app.router.add_get("/v1/modules/{name}", modules.get_module)
    app.router.add_get("/v1/capabilities", meta.capabilities)
    app.router.add_get("/healthz", meta.healthz)
    app.router.add_get("/readyz", meta.readyz)
    app.router.add_get("/metrics", meta.metrics)
    return app
