"""Builds the aiohttp Application: routes, the edge middleware, response headers, lifecycle."""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator, Sequence

import aiohttp
import structlog
from aiohttp import web

from proxy import __version__
from proxy.api import limits, routes, streaming
from proxy.api.access import Route
from proxy.api.app_keys import (
    CLIENT_ACTIVITY,
    CONTEXT_STORE,
    FEEDBACK,
    JUDGE_SESSION,
    METRICS,
    OUTBOX,
    REDACT_NAMES,
    REVIEW_QUEUE,
    REVIEW_STREAMS,
    ROUTER,
    RUNTIME,
    SESSION,
    SETTINGS,
    SHADOW,
    TRACING,
    Runtime,
    RuntimeHolder,
)
from proxy.api.browser_guard import BROWSER_GUARD, guards_browsers
from proxy.api.budget import BUDGET, BodyBudget
from proxy.api.console import pages as console_pages
from proxy.api.console.pages import TEMPLATES
from proxy.api.edge_request import on_response_prepare
from proxy.api.errors import error_middleware
from proxy.api.media import MEDIA_CACHES, MediaCaches
from proxy.api.middleware import edge_middleware
from proxy.context.sanitise import NameMatcher
from proxy.context.store import CLIENT_QUOTA, ContextStore, MemoryContextStore
from proxy.module.registry import ModuleRegistry
from proxy.observability.metrics import Metrics
from proxy.observability.trace_export import TraceExport
from proxy.policy.loader import load_policy
from proxy.policy.model import Policy
from proxy.reload import RELOADER, Reloader
from proxy.review import QueueingSink, RedisStreamSink, build_sink
from proxy.server import SERVER_OPTIONS, EdgeRunner, probe_guard, settle_heap
from proxy.service.instrument import MetricsObserver
from proxy.service.shadow import ClientActivity, ShadowJudge
from proxy.settings import Settings
from proxy.state.context_store import RedisContextStore
from proxy.state.feedback import FeedbackStore, MemoryFeedbackStore, RedisFeedbackStore
from proxy.state.outbox import HashWrite, KeyWrite, MarkDone, RedisOutbox, StreamWrite, Write
from proxy.state.redis_client import RedisOptions, discover
from proxy.state.redis_store import RedisBreakerStore
from proxy.state.review_queue import ReviewQueue
from proxy.state.review_stream import ReviewStreams
from proxy.state.store import BreakerStore
from proxy.upstream.breaker import Breakers
from proxy.upstream.http import USER_AGENT, upstream_session
from proxy.upstream.registry import build_providers
from proxy.upstream.router import Router

log = structlog.get_logger("proxy.app")

PROBE_MAX_BODY_BYTES = 1024
"""The probe listener's routes take no body: anything larger is refused unread (413)."""
CONSOLE_MAX_BODY_BYTES = 16 * 1024
"""With the review console: its largest form, a verdict with a 1,000-character note, URL-encoded."""


def load_runtime(
    settings: Settings,
    session: aiohttp.ClientSession,
    metrics: Metrics,
    outbox: RedisOutbox | None,
    queue: ReviewQueue | None = None,
) -> Runtime:
    """Policy, modules, provider clients and review sink (its records also in ``queue``, the review
    console's, when given); raises ``PolicyError`` for a bad policy. A broken module is reported
    with its path and reason and the others still load."""
    policy = load_policy(settings.policy_path)
    for provider in policy.providers.values():
        missing = provider.api_key_env and not os.environ.get(provider.api_key_env)
        if missing and not provider.forward_client_key:
            # Not fatal (a local model may need no key), but the first call would fail with a 401.
            log.warning("proxy.provider_key_missing", provider=provider.name, env=provider.api_key_env)
    registry = ModuleRegistry.load(settings.module_dirs)
    sink = build_sink(
        policy.review,
        session,
        outbox,
        on_failure=lambda kind: metrics.review_sink_failures.labels(kind).inc(),
    )
    if queue is not None and not isinstance(sink, RedisStreamSink):  # the console reads the stream
        sink = QueueingSink(sink, queue.add)
    return Runtime(policy, registry, build_providers(policy, session), sink)


JUDGE_POOL_SIZE = 1
"""Connections the shadow judge's own pool holds at most: it runs one judgement at a time."""


def _provider_session(pool_size: int) -> aiohttp.ClientSession:
    # The session never inflates (passthrough relays the upstream's bytes), so providers are asked
    # for identity; a passthrough request carries the client's own Accept-Encoding instead.
    return upstream_session(
        connector=aiohttp.TCPConnector(limit=pool_size, keepalive_timeout=30),
        auto_decompress=False,
        headers={"Accept-Encoding": "identity", "User-Agent": USER_AGENT},
    )


async def _session_ctx(app: web.Application) -> AsyncIterator[None]:
    """The providers' connection pool, and the shadow judge's own (no connection until it judges)."""
    async with (
        _provider_session(app[SETTINGS].pool_size) as session,
        _provider_session(JUDGE_POOL_SIZE) as judge,
    ):
        app[SESSION] = session
        app[JUDGE_SESSION] = judge
        yield


async def _tracing_ctx(app: web.Application) -> AsyncIterator[None]:
    """OpenTelemetry traces when an OTLP endpoint is set (``--otlp-endpoint`` or the standard
    variables): the SDK is imported only then. On cleanup the queued spans are flushed off the
    event loop (bounded by the exporter's timeout)."""
    settings = app[SETTINGS]
    export = TraceExport(settings.otlp_endpoint, settings.otel_content)
    if not export.enabled(os.environ):
        yield
        return
    from proxy.observability.otlp import start_export  # the SDK, only when traces are exported

    dropped = app[METRICS].trace_spans_dropped
    exporting = start_export(export, lambda reason, count: dropped.labels(reason).inc(count))
    app[TRACING] = exporting.tracing
    log.info("proxy.tracing", endpoint=export.traces_url() or "from OTEL_* variables")
    if not exporting.counts_drops:
        log.warning(
            "proxy.tracing_drops_uncounted", reason="the SDK reports no spans dropped on a full queue"
        )
    try:
        yield
    finally:
        await asyncio.to_thread(exporting.shutdown)


async def _state_ctx(app: web.Application) -> AsyncIterator[None]:
    """Breaker state: in Redis when ``--redis-url`` is set (shared by replicas), else in memory;
    likewise limits, feedback, the Redis outbox and the context store."""
    settings = app[SETTINGS]
    metrics = app[METRICS]
    if settings.redis:
        await discover(settings.redis)  # a cluster's nodes, known before its seed may fail
    store: BreakerStore | None = RedisBreakerStore(settings.redis) if settings.redis else None
    breakers = Breakers(store)
    _route_and_watch(app, breakers)
    limiter = app[limits.LIMITER] = limits.Limiter.build(
        settings.redis,
        settings.replicas_hint * settings.workers,  # with Redis down each worker takes its share
        lambda down: metrics.limits_degraded.set(int(down)),
    )
    outbox: RedisOutbox | None = None
    feedback_store: FeedbackStore = MemoryFeedbackStore()
    context: ContextStore = MemoryContextStore(
        on_evict=lambda reason: metrics.context_evictions.labels(reason).inc()
    )
    if settings.redis:
        outbox = _outbox(app, settings.redis)
        feedback_store = RedisFeedbackStore(settings.redis, outbox, on_capped=metrics.feedback_capped.inc)
        context = RedisContextStore(
            settings.redis,
            outbox,
            on_mark_wait=lambda result, waited: metrics.context_mark_wait.labels(result).observe(waited),
        )
    app[FEEDBACK] = feedback_store
    judge_session = app[JUDGE_SESSION]
    shadow = app[SHADOW] = ShadowJudge(
        metrics, limiter, app[CLIENT_ACTIVITY], lambda policy: build_providers(policy, judge_session)
    )
    app[CONTEXT_STORE] = context
    app[REDACT_NAMES] = NameMatcher(settings.context_redact_names)
    # The console reads the review stream when the policy's sink is it; every replica closes an
    # item there when a verdict on it comes through POST /v1/feedback, console or not.
    streams = ReviewStreams(settings.redis) if settings.redis else None
    if streams is not None:
        app[REVIEW_STREAMS] = streams
    yield
    await shadow.aclose()  # before the stores and the limiter it writes to
    if streams is not None:
        await streams.aclose()
    await context.aclose()
    await feedback_store.aclose()
    if outbox is not None:
        await outbox.aclose()
    await breakers.settled()
    if store is not None:
        await store.aclose()
    await limiter.aclose()


def _route_and_watch(app: web.Application, breakers: Breakers) -> None:
    """The router over ``breakers``, and the gauges read from the current policy at scrape time."""
    holder = app[RUNTIME]
    metrics = app[METRICS]

    def current_policy() -> Policy | None:
        return holder.current.policy if holder.current else None

    app[ROUTER] = Router(breakers, observer=MetricsObserver(metrics, current_policy))

    def breaker_states() -> list[tuple[str, bool]]:
        policy = current_policy()
        seen = breakers.snapshot()
        targets = sorted(policy.known_targets) if policy else sorted(seen)
        return [(target, seen.get(target, False)) for target in targets]

    def tier_thresholds() -> list[tuple[str, float]]:
        policy = current_policy()
        return [(tier, t.min_confidence) for tier, t in policy.tiers.items()] if policy else []

    metrics.watch_breakers(breaker_states)
    metrics.watch_thresholds(tier_thresholds)


def _outbox(app: web.Application, redis: RedisOptions) -> RedisOutbox:
    """The Redis outbox (started), counting what it drops and its first failures."""
    settings, metrics = app[SETTINGS], app[METRICS]

    def dropped(write: Write) -> None:
        if isinstance(write, KeyWrite | MarkDone):  # a mark's removal: a context write's step
            metrics.context_writes_dropped.inc()
        elif isinstance(write, HashWrite):
            metrics.feedback_writes_dropped.inc()
        else:
            metrics.review_dropped.inc()

    def failed(write: Write) -> None:
        if isinstance(write, StreamWrite):
            metrics.review_sink_failures.labels("redis-stream").inc()

    def evicted(count: int) -> None:
        metrics.context_evictions.labels(CLIENT_QUOTA).inc(count)

    outbox = app[OUTBOX] = RedisOutbox(
        redis,
        spool_dir=settings.spool_dir,
        on_drop=dropped,
        on_first_failure=failed,
        on_evict=evicted,
        durable_replicas=settings.redis_durable_replicas,
        on_short=lambda acked: metrics.outbox_replica_shortfalls.inc(),
    )
    outbox.start()
    metrics.watch_redis(lambda: outbox.up)
    metrics.watch_outbox(lambda: len(outbox))
    return outbox


def _load_first(app: web.Application, outbox: RedisOutbox | None) -> None:
    """The start-up runtime, logged and installed. A function of its own: a local of the
    lifecycle generator below would keep this runtime alive for good after a reload retires it."""
    current = load_runtime(app[SETTINGS], app[SESSION], app[METRICS], outbox, app.get(REVIEW_QUEUE))
    for problem in current.registry.problems:
        log.warning("proxy.module_load_failed", path=str(problem.path), reason=problem.reason)
    app[RUNTIME].current = current
    log.info("proxy.loaded", policy=current.policy.source, modules=current.registry.names())


async def _runtime_ctx(app: web.Application) -> AsyncIterator[None]:
    settings = app[SETTINGS]
    outbox = app.get(OUTBOX)
    _load_first(app, outbox)
    reloader = Reloader(
        settings,
        app[RUNTIME],
        lambda: load_runtime(settings, app[SESSION], app[METRICS], outbox, app.get(REVIEW_QUEUE)),
        app[METRICS],
    )
    retired: set[asyncio.Task[None]] = set()

    def retire(old: Runtime) -> None:
        # In-flight requests may still use the old sink: close it after the drain timeout. Only
        # the sink is kept, so the old runtime goes as soon as its last request does.
        review = old.review

        async def later() -> None:
            await asyncio.sleep(settings.drain_timeout_s)
            await review.aclose()
            settle_heap()  # start-up froze the first runtime: let the collector see it again

        task = asyncio.create_task(later())
        retired.add(task)
        task.add_done_callback(retired.discard)

    reloader.on_swap = retire
    app[RELOADER] = reloader
    reloader.install_sighup()
    poller = asyncio.create_task(reloader.poll()) if settings.reload_interval_s > 0 else None
    yield
    if poller is not None:
        poller.cancel()
    for task in list(retired):
        task.cancel()
    final = app[RUNTIME].current
    if final is not None:
        await final.review.aclose()


def build_app(settings: Settings, table: Sequence[Route] = routes.ROUTES) -> web.Application:
    """The proxy as an ``web.Application`` serving ``table`` (``proxy.api.routes``); resources open
    and close with ``cleanup_ctx``."""
    app = web.Application(client_max_size=settings.max_body_bytes, middlewares=[edge_middleware])
    app[BROWSER_GUARD] = guards_browsers(settings)
    app.on_response_prepare.append(on_response_prepare)
    app[SETTINGS] = settings
    app[RUNTIME] = RuntimeHolder()
    app[CLIENT_ACTIVITY] = ClientActivity()
    app[METRICS] = Metrics(multiprocess=settings.shares_port)
    app[METRICS].info.labels(__version__).set(1)
    budget = app[BUDGET] = BodyBudget(settings.max_inflight_body_bytes)
    app[MEDIA_CACHES] = MediaCaches()
    app[TRACING] = None
    app[METRICS].inflight_body_bytes.set_function(lambda: budget.in_use)
    if settings.serves_console:
        app[REVIEW_QUEUE] = ReviewQueue(on_evict=app[METRICS].review_queue_evicted.inc)
    app.cleanup_ctx.extend(
        [_tracing_ctx, _session_ctx, _state_ctx, _runtime_ctx, streaming.streams_ctx, _probe_ctx]
    )
    if settings.shares_port:
        app.cleanup_ctx.append(_share_metrics_ctx)
    routes.register(app, table)
    return app


async def _share_metrics_ctx(app: web.Application) -> AsyncIterator[None]:
    """A worker of ``--workers``: its scrape-time gauges reach the files the others render."""
    sharing = asyncio.create_task(app[METRICS].share_every())
    yield
    sharing.cancel()


def build_probe_app(app: web.Application) -> web.Application:
    """The probe listener's application (``--admin-port``): the main app's health, readiness and
    metrics handlers (``routes.PROBE_ROUTES``) on the same runtime and registry; every other path
    is a 404 in OpenAI's format."""
    console = REVIEW_QUEUE in app
    probe = web.Application(
        middlewares=[error_middleware],
        client_max_size=CONSOLE_MAX_BODY_BYTES if console else PROBE_MAX_BODY_BYTES,
    )
    probe[RUNTIME] = app[RUNTIME]
    probe[METRICS] = app[METRICS]
    probe[SETTINGS] = app[SETTINGS]
    if OUTBOX in app:  # built in _state_ctx, which starts before _probe_ctx
        probe[OUTBOX] = app[OUTBOX]
    if console:  # the review console: verdicts through the same store, overrides to the webhook
        probe[REVIEW_QUEUE] = app[REVIEW_QUEUE]
        if REVIEW_STREAMS in app:
            probe[REVIEW_STREAMS] = app[REVIEW_STREAMS]
        probe[FEEDBACK] = app[FEEDBACK]
        probe[SESSION] = app[SESSION]
        probe[TEMPLATES] = console_pages.environment()
    routes.register_probes(probe, console)
    return probe


async def _probe_ctx(app: web.Application) -> AsyncIterator[None]:
    """``--admin-port``: the probe listener on ``--admin-host`` (the pod IP in Kubernetes)."""
    settings = app[SETTINGS]
    if settings.admin_port is None:
        yield
        return
    runner = EdgeRunner(
        build_probe_app(app), probe_guard(settings, app[METRICS]), access_log=None, **SERVER_OPTIONS
    )
    await runner.setup()
    await web.TCPSite(
        runner, settings.admin_bind_host, settings.admin_port, reuse_port=settings.shares_port
    ).start()
    log.info("proxy.admin_listening", host=settings.admin_bind_host, port=settings.admin_port)
    yield
    await runner.cleanup()
