"""The one relay path to a provider, shared by chat passthrough and the generic ``/v1/*`` passthrough:
the HTTP call with cached timeouts, an answer's first bytes read within the attempt (so a failure
up to there can still be retried), and the copy of the rest with the completeness check.

Bounds: the router bounds an attempt (``per_try_s``) up to the first real chunk of a stream, or up to
the last byte of a plain answer; after the first chunk a stream is bounded by ``stream_idle_s``
between reads (aiohttp's ``sock_read``) and by the optional ``stream_total_s`` overall.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import aiohttp
from yarl import URL

from proxy.upstream.base import ProviderError
from proxy.upstream.body import READ_ERRORS, Body
from proxy.upstream.http import client_timeout, transport_error
from proxy.upstream.sse import BATCH_BYTES, IncompleteReason, StreamCheck

__all__ = ["StreamEnd", "client_timeout", "copy", "first_chunk", "send"]

Write = Callable[[bytes], Awaitable[None]]

# How a failure while copying ends a stream that has started (the ``reason`` label).
_REASONS: dict[str, IncompleteReason] = {
    "timeout": "stalled",
    "connect": "dropped",
    "malformed": "malformed_chunk",
    "server_error": "upstream_error",
    "rate_limited": "upstream_error",
    "client_error": "upstream_error",
}


async def send(
    session: aiohttp.ClientSession,
    method: str,
    url: URL,
    *,
    data: Any,
    headers: Any,
    timeout: aiohttp.ClientTimeout,
) -> aiohttp.ClientResponse:
    """The HTTP call; a failure below HTTP is a ``ProviderError`` (its cause kept in ``__cause__``)."""
    try:
        return await session.request(
            method, url, data=data, headers=headers, timeout=timeout, allow_redirects=False
        )
    except (TimeoutError, aiohttp.ClientError) as exc:
        raise transport_error(exc, url, timeout.sock_read or timeout.sock_connect or 0.0) from exc


async def first_chunk(body: Body, check: StreamCheck | None) -> bytes:
    """Read until the first real event of a judged stream (comments are not one), or the first
    bytes of anything else; what was read comes back, to be forwarded as is.

    A judged stream that ends, breaks, stalls or starts with a malformed event before that raises a
    ``ProviderError``: nothing reached the client, so the router may retry and fail over. A
    truncated stream is the provider's fault (``server_error``: retried like a 5xx, counted by the
    breaker); a malformed first event is ``malformed``."""
    head = b""
    read = body.read
    while True:
        try:
            chunk = await read()
        except READ_ERRORS as exc:
            raise body.failure(exc) from exc
        if not chunk:
            if check is None:
                return head
            raise ProviderError("server_error", "the stream ended before its first event")
        head += chunk
        if check is None:
            return head
        check.feed(chunk)
        if check.first_malformed:
            raise ProviderError("malformed", f"the stream's first event is not JSON: {head[:200]!r}")
        if check.events:
            return head


@dataclass(frozen=True, slots=True)
class StreamEnd:
    """How a copied answer ended: ``reason`` None when it ended complete (or is not judged)."""

    reason: IncompleteReason | None
    message: str = ""
    malformed: int = 0
    """Chunks that were not JSON (forwarded as is)."""


class _ReadBound:
    """The bounds of a copy with one timer re-aimed when it fires, not one per read: a read only
    notes when its wait began (``since``), and the timer, at ``since + idle_s`` or ``until``, stops
    the copying task if the wait is still on (or the answer ran past ``until``) and re-aims
    otherwise. Time spent writing to the client never counts as the upstream's silence."""

    __slots__ = ("_cancelling", "_handle", "_idle", "_loop", "_task", "_until", "clock", "reason", "since")

    def __init__(self, idle_s: float | None, until: float | None) -> None:
        self._loop = asyncio.get_running_loop()
        task = asyncio.current_task()
        assert task is not None
        self._task = task
        self._cancelling = task.cancelling()
        self.clock = self._loop.time
        self._idle = math.inf if idle_s is None else idle_s
        now = self._loop.time()
        # ``until`` is a time.monotonic() instant; the timer runs on the loop's clock.
        self._until = math.inf if until is None else now + (until - time.monotonic())
        self.since: float | None = None
        """When the pending read began (loop time); None while writing to the client."""
        self.reason: IncompleteReason | None = None
        """Set when the bound stopped the copy (and cancelled the task)."""
        self._handle: asyncio.TimerHandle | None = None
        self._arm(now)

    def _arm(self, now: float) -> None:
        due = min((now if self.since is None else self.since) + self._idle, self._until)
        self._handle = None if due == math.inf else self._loop.call_at(due, self._fire)

    def _fire(self) -> None:
        now = self._loop.time()
        if now >= self._until:
            self._stop("too_long")
        elif self.since is not None and now >= self.since + self._idle:
            self._stop("stalled")
        else:
            self._arm(now)

    def _stop(self, reason: IncompleteReason) -> None:
        self.reason = reason
        self._task.cancel()

    def stopped(self) -> bool:
        """After a ``CancelledError``: was it this bound's (then the cancel is taken back)?"""
        return self.reason is not None and self._task.uncancel() <= self._cancelling

    def close(self) -> None:
        if self._handle is not None:
            self._handle.cancel()


async def copy(
    head: bytes,
    body: Body,
    write: Write,
    check: StreamCheck | None,
    *,
    idle_s: float | None,
    until: float | None,
) -> StreamEnd:
    """Write ``head`` and the rest of ``body``: at most ``idle_s`` waiting on each read, until
    ``until`` (``time.monotonic``) at the latest. Never retries: bytes reached the client. A client
    that goes away raises through (a write's ``ClientConnectionResetError`` is no upstream drop,
    though an ``aiohttp.ClientError`` as a broken read's are); a cancel of the caller cancels the copy.

    The rest is copied in a task of its own: each read that waits resumes, when its bytes come,
    the chain of coroutines that awaits it, and the request handler's is a dozen deep (dispatch,
    middleware, route, ``serve``); the task's is the copy and the read."""
    await write(head)
    return await asyncio.get_running_loop().create_task(_copy(body, write, check, idle_s=idle_s, until=until))


async def _copy(
    body: Body,
    write: Write,
    check: StreamCheck | None,
    *,
    idle_s: float | None,
    until: float | None,
) -> StreamEnd:
    """``copy``'s loop, in its own task (the task its ``_ReadBound`` cancels)."""
    bound = _ReadBound(idle_s, until)
    clock = bound.clock
    read = body.read
    # The check's reads, collected here as ``StreamCheck.feed`` would: no call per chunk.
    reads = None if check is None else check.reads
    size = 0
    try:
        while True:
            bound.since = clock()
            try:
                chunk = await read()
            except READ_ERRORS as exc:  # the read's only: the same errors of a write are the client's
                error = body.failure(exc)
                return StreamEnd(_REASONS.get(error.kind, "dropped"), error.message, _malformed(check))
            bound.since = None
            if not chunk:
                break
            if reads is not None:
                reads.append(chunk)
                size += len(chunk)
                if size >= BATCH_BYTES:
                    size = 0
                    assert check is not None
                    check.flush()
            await write(chunk)
    except ProviderError as exc:
        return StreamEnd(_REASONS.get(exc.kind, "dropped"), exc.message, _malformed(check))
    except asyncio.CancelledError:
        if not bound.stopped():
            raise
        if bound.reason == "too_long":
            return StreamEnd("too_long", "the answer ran past its bound", _malformed(check))
        return StreamEnd("stalled", f"no bytes for {idle_s:g}s", _malformed(check))
    finally:
        bound.close()
    if check is not None and not check.ended_complete():
        return StreamEnd("truncated", "the upstream ended the stream before its end", check.malformed)
    return StreamEnd(None, malformed=_malformed(check))


def _malformed(check: StreamCheck | None) -> int:
    return 0 if check is None else check.malformed
