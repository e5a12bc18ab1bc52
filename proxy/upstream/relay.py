"""The one relay path to a provider, shared by chat passthrough and the generic ``/v1/*`` passthrough:
the HTTP call with cached timeouts, an answer's first bytes read within the attempt (so a failure
up to there can still be retried), and the copy of the rest with the completeness check.

Bounds: the router bounds an attempt (``per_try_s``) up to the first real chunk of a stream, or up to
the last byte of a plain answer; after the first chunk a stream is bounded by ``stream_idle_s``
between reads (aiohttp's ``sock_read``) and by the optional ``stream_total_s`` overall.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import aiohttp
from yarl import URL

from proxy.upstream.base import ProviderError
from proxy.upstream.http import client_timeout, transport_error
from proxy.upstream.sse import IncompleteReason, StreamCheck

__all__ = ["StreamEnd", "body_chunks", "client_timeout", "copy", "first_chunk", "send"]

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


async def body_chunks(resp: aiohttp.ClientResponse) -> AsyncGenerator[bytes, None]:
    """A response's body as it arrives; a broken or stalled read is a ``ProviderError``."""
    try:
        async for chunk in resp.content.iter_any():
            yield chunk
    except (TimeoutError, aiohttp.ClientError) as exc:
        raise transport_error(exc, resp.url, 0.0) from exc


async def first_chunk(chunks: AsyncIterator[bytes], check: StreamCheck | None) -> bytes:
    """Read until the first real event of a judged stream (comments and empty reads are not one), or
    the first bytes of anything else; what was read comes back, to be forwarded as is.

    A judged stream that ends, breaks, stalls or starts with a malformed event before that raises a
    ``ProviderError``: nothing reached the client, so the router may retry and fail over. A
    truncated stream is the provider's fault (``server_error``: retried like a 5xx, counted by the
    breaker); a malformed first event is ``malformed``."""
    head = b""
    while True:
        try:
            chunk = await anext(chunks)
        except StopAsyncIteration:
            if check is None:
                return head
            raise ProviderError("server_error", "the stream ended before its first event") from None
        head += chunk
        if check is None:
            if chunk:
                return head
            continue
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


async def copy(
    head: bytes,
    chunks: AsyncIterator[bytes],
    write: Write,
    check: StreamCheck | None,
    *,
    idle_s: float | None,
    until: float | None,
) -> StreamEnd:
    """Write ``head`` and the rest of ``chunks``: at most ``idle_s`` between two reads, until
    ``until`` (``time.monotonic``) at the latest. Never retries: bytes reached the client. A client
    that goes away raises through."""
    await write(head)
    while True:
        wait = idle_s
        if until is not None:
            left = max(until - time.monotonic(), 0.0)
            wait = left if wait is None else min(wait, left)
        try:
            async with asyncio.timeout(wait):
                chunk = await anext(chunks)
        except StopAsyncIteration:
            break
        except ProviderError as exc:
            return StreamEnd(_REASONS.get(exc.kind, "dropped"), exc.message, _malformed(check))
        except TimeoutError:
            if until is not None and time.monotonic() >= until:
                return StreamEnd("too_long", "the answer ran past its bound", _malformed(check))
            return StreamEnd("stalled", f"no bytes for {idle_s:g}s", _malformed(check))
        if check is not None:
            check.feed(chunk)
        await write(chunk)
    if check is not None and not check.ended_complete():
        return StreamEnd("truncated", "the upstream ended the stream before its end", check.malformed)
    return StreamEnd(None, malformed=_malformed(check))


def _malformed(check: StreamCheck | None) -> int:
    return 0 if check is None else check.malformed
