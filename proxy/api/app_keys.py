"""What the application holds: settings, the HTTP session and the current runtime snapshot
(``proxy.service.runtime.Runtime``)."""

from __future__ import annotations

import aiohttp
from aiohttp import web

from proxy.api.errors import ApiError
from proxy.context.sanitise import NameMatcher
from proxy.context.store import ContextStore
from proxy.observability.metrics import Metrics
from proxy.observability.tracing import Tracing
from proxy.service.runtime import Runtime as Runtime
from proxy.service.shadow import ClientActivity, ShadowJudge
from proxy.settings import Settings
from proxy.state.feedback import FeedbackStore
from proxy.state.outbox import RedisOutbox
from proxy.state.review_queue import ReviewQueue
from proxy.state.review_stream import ReviewStreams
from proxy.upstream.router import Router


class RuntimeHolder:
    """The one mutable cell: the current ``Runtime`` (None until loaded)."""

    def __init__(self) -> None:
        self.current: Runtime | None = None


SETTINGS = web.AppKey("settings", Settings)
SESSION = web.AppKey("session", aiohttp.ClientSession)
RUNTIME = web.AppKey("runtime", RuntimeHolder)
ROUTER = web.AppKey("router", Router)
METRICS = web.AppKey("metrics", Metrics)
FEEDBACK = web.AppKey("feedback", FeedbackStore)
"""Module answers remembered for ``POST /v1/feedback`` (memory, or Redis with ``--redis-url``)."""
SHADOW = web.AppKey("shadow", ShadowJudge)
"""The background judge of ``feedback.shadow`` (idle while the policy does not enable it)."""
CLIENT_ACTIVITY = web.AppKey("client_activity", ClientActivity)
"""Client requests in flight, counted by the edge middleware while the shadow judge watches."""
JUDGE_SESSION = web.AppKey("judge_session", aiohttp.ClientSession)
"""The shadow judge's own connection pool (``JUDGE_POOL_SIZE``): never a client's slot."""
OUTBOX = web.AppKey("outbox", RedisOutbox)
"""Set only with ``--redis-url``."""
CONTEXT_STORE = web.AppKey("context_store", ContextStore)
"""Module context and the result cache: Redis with ``--redis-url``, else in-process memory."""
REDACT_NAMES = web.AppKey("redact_names", NameMatcher)
REVIEW_QUEUE = web.AppKey("review_queue", ReviewQueue)
"""Answers sent to review, pending in the review console: set only when the console is served
(``--admin-port`` and ``--admin-keys``)."""
REVIEW_STREAMS = web.AppKey("review_streams", ReviewStreams)
"""With the console and ``--redis-url``: it reads the policy's review stream when that is the sink."""
TRACING = web.AppKey[Tracing | None]("tracing")
"""The app's tracer when traces are exported (``proxy.observability.otlp``); None: tracing is off."""


def runtime_of(request: web.Request) -> Runtime:
    """The runtime this request runs on (readiness guarantees it is loaded)."""
    return runtime_in(request.app)


def runtime_in(app: web.Application) -> Runtime:
    """``runtime_of`` a request of ``app``."""
    current = app[RUNTIME].current
    if current is None:
        raise ApiError(
            503,
            "The proxy is starting: policy and modules are not loaded yet",
            "server_error",
            "not_ready",
            headers={"Retry-After": "1"},
        )
    return current
