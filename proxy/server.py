"""The listening edge: aiohttp's server with client read deadlines and a connection cap.

aiohttp has no request-head timeout (an idle or half-sent connection is held for the keep-alive
timeout) and no limit on open connections, so slow clients can exhaust file descriptors. Each
connection gets a deadline while the proxy waits for request bytes:

* the request head must be complete within ``--client-read-timeout`` of its first byte (of the
  connection opening, for the first request); else 408 and close;
* a body may not stall longer than that between two reads; else the handler's read fails, the
  answer is 408 and the connection closes. Time while the proxy itself stopped reading
  (backpressure: the handler has not consumed what arrived) does not count.

Idle keep-alive time between requests is governed by ``--idle-timeout`` as before. Beyond
``--max-connections`` open connections a new one gets 503 and is closed. Refusals are counted
in ``cognitive_connections_refused_total{reason}``.

This subclasses aiohttp's ``RequestHandler`` and reads a few of its attributes (the parsed
message queue, the current request, the paused flag): the tests in
``tests/security/test_slow_clients.py`` pin that behaviour to the installed aiohttp.
"""

from __future__ import annotations

import asyncio
import ctypes
import gc
import resource
from collections.abc import Awaitable, Callable, Mapping
from contextlib import suppress
from functools import partial
from http import HTTPStatus
from types import MappingProxyType
from typing import Any, Final, Protocol, cast

import orjson
import structlog
from aiohttp import web
from aiohttp.http_exceptions import BadHttpMethod, HttpProcessingError
from aiohttp.streams import StreamReader
from aiohttp.web_protocol import RequestHandler, _RequestFactory
from aiohttp.web_request import BaseRequest

from proxy.api.app_keys import METRICS
from proxy.api.edge_request import EdgeRequest, on_response_prepare
from proxy.api.errors import ApiError, ClientReadTimeout, request_timeout
from proxy.api.middleware import edge_dispatch
from proxy.observability.logging import log_lines
from proxy.observability.metrics import Metrics
from proxy.settings import Settings

log = structlog.get_logger("proxy.server")

FD_HEADROOM = 64
"""Descriptors kept free besides client connections and the upstream pool: listening sockets,
Redis, log and policy files, DNS."""
DEFAULT_MAX_CONNECTIONS = 10_000
"""Used when the open-file limit is unlimited or larger than this needs."""
PROBE_MAX_CONNECTIONS = 64
"""The probe listener's own cap (``--admin-port``): probes and Prometheus need a handful, and a
flood of the API port must not starve the probes (nor the other way round)."""
_REASONS = {408: "Request Timeout", 503: "Service Unavailable"}


def max_connections(settings: Settings) -> int:
    """``--max-connections``, or when 0: what the open-file limit leaves after the upstream pool."""
    if settings.max_connections:
        return settings.max_connections
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return DEFAULT_MAX_CONNECTIONS
    spare = soft - settings.pool_size - FD_HEADROOM - PROBE_MAX_CONNECTIONS
    return max(1, min(DEFAULT_MAX_CONNECTIONS, spare))


def raw_answer(error: ApiError) -> bytes:
    """``error`` as a complete HTTP/1.1 response that closes the connection, for answers
    written before (or instead of) a request reaching the application."""
    body = orjson.dumps(error.body())
    head = (
        f"HTTP/1.1 {error.status} {_REASONS.get(error.status, 'Error')}\r\n"
        "Content-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n"
        + "".join(f"{name}: {value}\r\n" for name, value in error.headers.items() if name != "Connection")
        + "Connection: close\r\n\r\n"
    )
    return head.encode("latin-1") + body


def too_many_connections() -> ApiError:
    return ApiError(
        503,
        "The proxy holds as many client connections as it allows (--max-connections); retry shortly",
        "server_error",
        "too_many_connections",
        headers={"Retry-After": "1"},
    )


class ConnectionGuard:
    """One listener's open connections against its cap, and the read deadline they use."""

    def __init__(self, listener: str, limit: int, read_timeout_s: float, metrics: Metrics) -> None:
        self.limit = limit
        self.read_timeout_s = read_timeout_s
        self.metrics = metrics
        self.open = 0
        metrics.open_connections.labels(listener).set_function(lambda: self.open)

    def admit(self) -> bool:
        if self.open >= self.limit:
            self.refused("max_connections")
            return False
        self.open += 1
        return True

    def leave(self) -> None:
        self.open -= 1

    def refused(self, reason: str) -> None:
        self.metrics.connections_refused.labels(reason).inc()


class Scheduler(Protocol):
    """What ``ReadDeadline`` needs of an event loop (a test passes a fake clock)."""

    def time(self) -> float: ...

    def call_at(self, when: float, callback: Callable[[], object]) -> asyncio.TimerHandle: ...


class ReadDeadline:
    """A deadline moved on every request and reached rarely: one timer, re-aimed when it fires
    before the current due time, so arming and disarming only move ``due`` (no timer created and
    cancelled per request)."""

    def __init__(self, loop: Scheduler, on_expiry: Callable[[], None]) -> None:
        self._loop = loop
        self._on_expiry = on_expiry
        self.due: float | None = None
        """When it runs out (``loop.time()``); None while disarmed."""
        self._timer: asyncio.TimerHandle | None = None

    def arm(self, seconds: float, *, restart: bool) -> None:
        """Run out ``seconds`` from now; ``restart=False`` keeps a running deadline as it is."""
        if self.due is not None and not restart:
            return
        self.due = due = self._loop.time() + seconds
        if self._timer is None:
            self._timer = self._loop.call_at(due, self._fire)

    def disarm(self) -> None:
        self.due = None

    def close(self) -> None:
        """Disarm and drop the timer (a closed connection is not held until it fires)."""
        self.due = None
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _fire(self) -> None:
        self._timer = None
        due = self.due
        if due is None:
            return
        if self._loop.time() < due:  # armed again since the timer was set: wait for the rest
            self._timer = self._loop.call_at(due, self._fire)
            return
        self.due = None
        self._on_expiry()


def _log_refusal(exc: BaseException | None, *, first: bool) -> None:
    """aiohttp's "Error handling request" record, replaced by one line: a request the parser
    refused is named by its kind and status only (the exception's text quotes the client's bytes);
    any other failure is logged with its traceback, redacted like every line. Non-HTTP bytes first
    on a connection (scanners, TLS on the plain port) stay at debug, as aiohttp has them."""
    if isinstance(exc, HttpProcessingError):
        quiet = first and isinstance(exc, BadHttpMethod)
        write = log.debug if quiet else log.warning
        write("proxy.malformed_request", kind=type(exc).__name__, status=exc.code)
    else:
        log.error("proxy.connection_error", exc_info=exc if exc is not None else True)


class EdgeHandler(RequestHandler):
    """aiohttp's connection protocol with the guard's cap and read deadline.

    aiohttp has no hook for "a request head was parsed": ``data_received`` reads its private
    ``_request_count`` and ``_messages`` (and ``_timed_out`` its ``_reading_paused`` and
    ``_current_request``), pinned by ``tests/test_server_aiohttp_internals.py``."""

    def __init__(self, manager: web.Server, *, guard: ConnectionGuard, **kwargs: Any) -> None:
        super().__init__(manager, **kwargs)
        self._guard = guard
        self._admitted = False
        self._deadline = ReadDeadline(self._loop, self._timed_out)
        self._payload: StreamReader | None = None
        """The body of the newest parsed request."""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        if not self._guard.admit():
            stream = cast(asyncio.Transport, transport)  # uvloop's is not an asyncio.Transport subclass
            stream.write(raw_answer(too_many_connections()))
            stream.close()
            return
        self._admitted = True
        super().connection_made(transport)
        self._arm(restart=True)  # the first request head is due within the timeout

    def connection_lost(self, exc: BaseException | None) -> None:
        self._deadline.close()
        if self._admitted:
            self._admitted = False
            self._guard.leave()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        body_arriving = self._payload is not None and not self._payload.is_eof()
        heads = self._request_count
        super().data_received(data)
        if self._request_count > heads and self._messages:
            payload = self._messages[-1][1]
            self._payload = payload if isinstance(payload, StreamReader) else None
            body_arriving = True
        # The deadline's own calls, not ``_arm``/``_disarm``: a Python frame less per packet.
        if not body_arriving:
            self._deadline.arm(self._guard.read_timeout_s, restart=False)  # a head: from its first byte
        elif self._payload is not None and not self._payload.is_eof():
            self._deadline.arm(self._guard.read_timeout_s, restart=True)  # a body: between reads
        else:
            self._deadline.due = None  # the request is complete; the handler has it (``disarm``)

    def handle_error(
        self,
        request: BaseRequest,
        status: int = 500,
        exc: BaseException | None = None,
        message: str | None = None,
    ) -> web.StreamResponse:
        """aiohttp's answer to a request its parser refused (400: smuggling shapes, duplicate
        ``Host``, oversized lines, ``*``) or to a failure outside the application, in the proxy's
        error format. aiohttp's own page and log record quote the offending bytes (keys included);
        this names only the kind, in the answer and in one log line."""
        _log_refusal(exc, first=self._request_count == 1)
        if request.writer.output_size > 0:  # as aiohttp: the connection is broken, no answer fits
            raise ConnectionError("Response is sent already: no error answer can follow it")
        if status == HTTPStatus.INTERNAL_SERVER_ERROR:
            error = ApiError(
                status,
                "Internal error in the proxy; see its log",
                "server_error",
                "internal_error",
                headers={"Connection": "close"},
            )
        else:
            kind = type(exc).__name__ if exc is not None else HTTPStatus(status).phrase
            error = ApiError(
                status,
                f"The request is not valid HTTP/1.1 ({kind}): check the request line, headers and "
                "framing (one Host, never Transfer-Encoding with Content-Length, lines under 8 KiB)",
                code="malformed_request",
                headers={"Connection": "close"},  # the parser's state is lost: nothing after it is read
            )
        response = error.response()
        response.force_close()
        return response

    def _arm(self, *, restart: bool) -> None:
        self._deadline.arm(self._guard.read_timeout_s, restart=restart)

    def _disarm(self) -> None:
        self._deadline.disarm()

    def _timed_out(self) -> None:
        if self.transport is None:
            return
        if self._reading_paused:  # the proxy stopped reading, not the client
            self._arm(restart=True)
            return
        self._guard.refused("read_timeout")
        payload = self._payload
        if payload is not None and not payload.is_eof():
            payload.set_exception(ClientReadTimeout())  # the handler answers 408
            self.close()
        elif self._current_request is None:
            self.transport.write(raw_answer(request_timeout()))
            self.force_close()
        else:
            self.close()  # a head stalled behind a request in progress: no keep-alive after it


class EdgeServer(web.Server):
    """aiohttp's server making ``EdgeHandler`` connections (serving ``handler``, else ``inner``'s)."""

    def __init__(
        self,
        inner: web.Server,
        guard: ConnectionGuard,
        handler: Callable[[web.Request], Awaitable[web.StreamResponse]] | None = None,
        request_factory: _RequestFactory | None = None,
    ) -> None:
        super().__init__(
            inner.request_handler if handler is None else handler,  # type: ignore[arg-type]
            request_factory=inner.request_factory if request_factory is None else request_factory,
            handler_cancellation=inner.handler_cancellation,
            loop=asyncio.get_running_loop(),
            **inner._kwargs,
        )
        self._guard = guard

    def __call__(self) -> RequestHandler:
        return EdgeHandler(self, guard=self._guard, loop=self._loop, **self._kwargs)


class EdgeRunner(web.AppRunner):
    """``AppRunner`` serving through ``EdgeServer``, the API's requests dispatched by
    ``edge_dispatch``."""

    def __init__(self, app: web.Application, guard: ConnectionGuard, **kwargs: Any) -> None:
        super().__init__(app, **kwargs)
        self._guard = guard

    async def _make_server(self) -> web.Server:
        inner = await super()._make_server()  # the app frozen: its signal's callbacks are final
        dispatch = edge_dispatch(self.app)
        factory = None
        if dispatch is not None and list(self.app.on_response_prepare) == [on_response_prepare]:
            factory = cast(_RequestFactory, partial(self.app._make_request, _cls=EdgeRequest))
        return EdgeServer(inner, self._guard, dispatch, factory)


SERVER_OPTIONS: Final[Mapping[str, Any]] = MappingProxyType({"auto_decompress": False})
"""Options of the proxy's HTTP server (``web.run_app``/``AppRunner``). Request bodies are never
inflated by aiohttp: passthrough forwards the client's bytes with their ``Content-Encoding``, and
the routes the proxy parses inflate them under the body limit (``api.body``)."""


def api_guard(settings: Settings, metrics: Metrics) -> ConnectionGuard:
    return ConnectionGuard("api", max_connections(settings), settings.client_read_timeout_s, metrics)


def probe_guard(settings: Settings, metrics: Metrics) -> ConnectionGuard:
    # "admin": the listener's label in metrics and logs, named after its flag (--admin-port).
    return ConnectionGuard("admin", PROBE_MAX_CONNECTIONS, settings.client_read_timeout_s, metrics)


GC_THRESHOLDS: Final = (10_000, 50, 100)
"""Python's defaults (700, 10, 10) run a young-generation collection every few requests, each
request allocating hundreds of containers; measured in ``make bench``, about a fifth of the
passthrough's CPU went to the collector. Garbage cycles still go, a little later."""


def settle_heap() -> None:
    """After start-up: move everything allocated so far (modules, schemas, compiled validators,
    the policy) out of the collector's sight with ``gc.freeze`` and collect less often, so that
    a full collection scans only what requests left behind; then hand the memory start-up only
    borrowed back to the system. Called again once a reload has retired a runtime: what an
    earlier call froze is looked at again first (frozen garbage is never collected)."""
    gc.unfreeze()
    gc.collect()
    gc.freeze()
    gc.set_threshold(*GC_THRESHOLDS)
    trim_malloc()


def trim_malloc() -> None:
    """glibc keeps freed heap memory for reuse; compiling the modules' schemas at start-up peaks
    about 18 MB above what stays in use (measured: RSS 81 -> 68 MB after this). A no-op where
    the C library has no ``malloc_trim`` (musl, macOS)."""
    with suppress(OSError, AttributeError):
        ctypes.CDLL(None).malloc_trim(0)  # the process's own symbols: libc's, without a lookup


def run(
    app: web.Application,
    settings: Settings,
    *,
    loop: asyncio.AbstractEventLoop | None = None,
    on_started: Callable[[], None] = lambda: None,
) -> None:
    """Serve ``app`` until SIGTERM/SIGINT, then drain for ``--drain-timeout`` (as
    ``web.run_app`` does, with the edge server)."""
    loop = loop or asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    main = loop.create_task(_serve(app, settings, on_started))
    try:
        loop.run_until_complete(main)
    except (web.GracefulExit, KeyboardInterrupt):
        pass
    finally:
        if not main.done():
            main.cancel()
            with suppress(asyncio.CancelledError):
                loop.run_until_complete(main)
        rest = asyncio.all_tasks(loop)
        for task in rest:
            task.cancel()
        loop.run_until_complete(asyncio.gather(*rest, return_exceptions=True))
        loop.run_until_complete(loop.shutdown_asyncgens())
        loop.close()


async def _serve(app: web.Application, settings: Settings, on_started: Callable[[], None]) -> None:
    runner = EdgeRunner(
        app,
        api_guard(settings, app[METRICS]),
        handle_signals=True,
        shutdown_timeout=settings.drain_timeout_s,
        keepalive_timeout=settings.idle_timeout_s,
        handler_cancellation=True,  # a client that hangs up cancels its upstream call
        access_log=None,
        **SERVER_OPTIONS,
    )
    await runner.setup()
    lines = log_lines()
    flusher = None
    if lines is not None and settings.log_flush_interval_s > 0:
        flusher = asyncio.create_task(lines.flush_every(settings.log_flush_interval_s))
    try:
        await web.TCPSite(runner, settings.host, settings.port, reuse_port=settings.shares_port).start()
        settle_heap()
        on_started()
        while True:
            await asyncio.sleep(3600)
    finally:
        await runner.cleanup()
        if flusher is not None:
            flusher.cancel()
            with suppress(asyncio.CancelledError):
                await flusher
