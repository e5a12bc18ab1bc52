"""``cogproxy serve`` with timestamps taken along a streamed module call, for ``bench.py --stream``.

Usage: ``python tests/perf/ttfd_probe.py MARKS_FILE serve ...``. Before the app is built, the
functions a streamed ``/execute`` call passes through are wrapped (as ``ablated_proxy.py`` does)
to note ``time.perf_counter_ns()`` at each step, in a dict the request's task and its producer
task share (a context variable: a task copies the context it was created in). At exit (SIGTERM
drains, then returns) every streamed call's marks are written to MARKS_FILE as JSON lines. A
measuring tool only: the marks cost a few hundred nanoseconds each, nothing in the proxy's code.
"""

from __future__ import annotations

import atexit
import contextvars
import functools
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from aiohttp import web

from proxy.api import execute, streaming
from proxy.service.stream_emitter import ChunkEmitter
from proxy.upstream import streamed

STEPS: tuple[tuple[str, str], ...] = (
    ("arrive", "request parsed by aiohttp, the app called"),
    ("body_read", "edge middleware, route, body read"),
    ("input_checked", "negotiation, input check"),
    ("admitted", "admission (limits, breaker-free)"),
    ("stream_started", "session created, producer task spawned"),
    ("meta_written", "response prepared, meta chunk written"),
    ("produce_start", "the producer task runs"),
    ("prompt_rendered", "context step, ladder set up, prompt rendered"),
    ("upstream_call", "router: target chosen, provider stream opened"),
    ("client_request", "provider: request body and headers built, aiohttp called"),
    ("client_send", "aiohttp: URL, headers, connection taken, request object built"),
    ("client_sent", "aiohttp: request line and headers buffered, body task made"),
    ("response_head", "upstream's status and headers back (the upstream's own time included)"),
    ("upstream_first_byte", "first bytes read, handed to the SSE parser"),
    ("first_text", "first SSE frame parsed, content piece"),
    ("delta_appended", "field differ, delta chunk appended to the session"),
    ("delta_read", "the follower woken with the delta"),
    ("delta_written", "delta framed and written to the socket"),
)
"""Each step's mark, in the order a call passes them, and what happens between it and the one
before."""

MARKS: contextvars.ContextVar[dict[str, int] | None] = contextvars.ContextVar("ttfd_marks", default=None)
DONE: list[dict[str, int]] = []


def mark(name: str) -> None:
    marks = MARKS.get()
    if marks is not None and name not in marks:
        marks[name] = time.perf_counter_ns()
        marks["cpu_" + name] = time.thread_time_ns()


def _after(owner: Any, attribute: str, name: str) -> None:
    """``owner.attribute`` (a coroutine function) marks ``name`` when it returns."""
    original = getattr(owner, attribute)

    @functools.wraps(original)
    async def wrapped(*args: Any, **kwargs: Any) -> Any:
        result = await original(*args, **kwargs)
        mark(name)
        return result

    setattr(owner, attribute, wrapped)


def _before(owner: Any, attribute: str, name: str, *, sync: bool = False) -> None:
    """``owner.attribute`` marks ``name`` when it is called."""
    original: Callable[..., Any] = getattr(owner, attribute)
    if sync:

        @functools.wraps(original)
        def called(*args: Any, **kwargs: Any) -> Any:
            mark(name)
            return original(*args, **kwargs)

        setattr(owner, attribute, called)
        return

    @functools.wraps(original)
    async def awaited(*args: Any, **kwargs: Any) -> Any:
        mark(name)
        return await original(*args, **kwargs)

    setattr(owner, attribute, awaited)


def _sync_after(owner: Any, attribute: str, name: str) -> None:
    original: Callable[..., Any] = getattr(owner, attribute)

    @functools.wraps(original)
    def wrapped(*args: Any, **kwargs: Any) -> Any:
        result = original(*args, **kwargs)
        mark(name)
        return result

    setattr(owner, attribute, wrapped)


def install() -> None:
    from proxy import pipeline

    handle = web.Application._handle

    async def _handle(self: web.Application, request: web.Request) -> web.StreamResponse:
        if not request.path.endswith("/execute"):
            return await handle(self, request)
        marks = {"arrive": time.perf_counter_ns(), "cpu_arrive": time.thread_time_ns()}
        MARKS.set(marks)
        try:
            return await handle(self, request)
        finally:
            MARKS.set(None)
            DONE.append(marks)

    web.Application._handle = _handle  # type: ignore[method-assign]

    from proxy import server
    from proxy.api.middleware import edge_dispatch as dispatch_of

    def edge_dispatch(app: web.Application) -> Any:
        """``cogproxy serve``'s own dispatch (``EdgeRunner``), marked as ``_handle`` is above."""
        dispatch = dispatch_of(app)
        if dispatch is None:
            return None

        async def marked(request: web.Request) -> web.StreamResponse:
            if not request.path.endswith("/execute"):
                return await dispatch(request)
            marks = {"arrive": time.perf_counter_ns(), "cpu_arrive": time.thread_time_ns()}
            MARKS.set(marks)
            try:
                return await dispatch(request)
            finally:
                MARKS.set(None)
                DONE.append(marks)

        return marked

    server.edge_dispatch = edge_dispatch  # type: ignore[attr-defined]  # what EdgeRunner calls
    _after(execute, "read_object", "body_read")
    _sync_after(streaming, "input_refused", "input_checked")
    _after(streaming, "admit_call", "admitted")
    _sync_after(streaming, "start_stream", "stream_started")
    _before(streaming, "answer_module", "produce_start")
    _sync_after(pipeline, "build_messages", "prompt_rendered")
    _before(pipeline, "stream_completion", "upstream_call")
    _before(streamed, "parse_sse", "upstream_first_byte", sync=True)
    import aiohttp
    from aiohttp import client_reqrep

    _before(aiohttp.ClientSession, "_request", "client_request")
    _before(client_reqrep.ClientRequest, "send", "client_send")
    _after(client_reqrep.ClientRequest, "send", "client_sent")
    _after(aiohttp.ClientSession, "_request", "response_head")
    _before(streamed, "first_token", "first_text", sync=True)

    text = ChunkEmitter.text

    def emitter_text(self: ChunkEmitter, piece: str) -> bool:
        appended = text(self, piece)
        if appended:
            mark("delta_appended")
        return appended

    ChunkEmitter.text = emitter_text  # type: ignore[method-assign]

    follow = streaming.follow

    async def follow_marked(source: Any, position: Any, framer: Any, write: Any, **kwargs: Any) -> None:
        async def write_marked(data: bytes) -> None:
            delta = b"event: chunk" in data
            if delta:
                mark("delta_read")
            await write(data)
            if delta:
                mark("delta_written")

        await follow(source, position, framer, write_marked, **kwargs)

    streaming.follow = follow_marked

    # the meta chunk is the first thing ``respond`` writes
    write = web.StreamResponse.write

    async def write_marked(self: web.StreamResponse, data: Any) -> None:
        await write(self, data)
        if data[:20].startswith(b"event: meta"):
            mark("meta_written")

    web.StreamResponse.write = write_marked  # type: ignore[method-assign]


def main() -> None:
    out = Path(sys.argv[1])
    install()

    def dump() -> None:
        out.write_text("".join(json.dumps(marks) + "\n" for marks in DONE))

    atexit.register(dump)
    from proxy.cli import main as cli_main

    raise SystemExit(cli_main(sys.argv[2:]))


if __name__ == "__main__":
    main()
