"""The shared pieces of HTTP provider clients: key injection, error typing, timeouts."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from functools import lru_cache
from typing import Any

import aiohttp
import orjson
from yarl import URL

from proxy import __version__
from proxy.media.model import Media
from proxy.media.parts import body as request_body
from proxy.observability.tracing import with_traceparent
from proxy.policy.model import ProviderConfig
from proxy.policy.provider_kinds import PROVIDER_KINDS
from proxy.upstream.base import CallInfo, FailureKind, ProviderError, parse_retry_after

USER_AGENT = f"cognitive-proxy/{__version__}"
"""What every upstream request names as its software: never the client's, nor aiohttp's (set on the
session, it also spares aiohttp building a skip list per request)."""
_ERROR_BODY_LIMIT = 64 * 1024
_FIRST_NON_SUCCESS = 300
"""Statuses from here on are failures: redirects are never followed (see ``post``)."""


def upstream_session(**options: Any) -> aiohttp.ClientSession:
    """A client session for providers and sinks. It has no cookie jar: a cookie an upstream sets
    must never be replayed upstream on another client's request."""
    return aiohttp.ClientSession(cookie_jar=aiohttp.DummyCookieJar(), **options)


def api_key(config: ProviderConfig, ctx: CallInfo) -> str | None:
    """The key sent upstream: the client's own only when the provider opts in, else the
    provider's ``api_key_env`` (read per call, so a rotated secret needs no restart)."""
    if config.forward_client_key:
        return ctx.client_key
    return os.environ.get(config.api_key_env) if config.api_key_env else None


def auth_headers(config: ProviderConfig, ctx: CallInfo) -> dict[str, str]:
    """The header carrying the provider key, by its kind (``PROVIDER_KINDS``) or the policy's
    ``options.auth_header`` (e.g. Azure's ``api-key``): ``Authorization: Bearer <key>``, or the
    raw key in any other header; none without a key, nor for a kind that sends none."""
    key = api_key(config, ctx)
    kind = PROVIDER_KINDS.get(config.kind)
    if not key or kind is None or kind.auth_header is None:
        return {}
    name = str(config.options.get("auth_header", kind.auth_header))
    return {"Authorization": f"Bearer {key}"} if name.lower() == "authorization" else {name: key}


def status_error(status: int, body: bytes, headers: dict[str, str]) -> ProviderError:
    """A non-2xx answer as a typed error."""
    retry_after = parse_retry_after(headers.get("Retry-After") or headers.get("retry-after"))
    kind: FailureKind
    if status == 429:
        kind = "rate_limited"
    elif status >= 500 or status < 400:  # a redirect is the provider's fault, not the client's
        kind = "server_error"
    else:
        kind = "client_error"
    text = body[:500].decode("utf-8", "replace")
    return ProviderError(
        kind,
        f"upstream answered {status}: {text}",
        status=status,
        retry_after=retry_after,
        body=body,
        headers=headers,
    )


@lru_cache(maxsize=128)
def client_timeout(
    connect_s: float, read_s: float | None, total_s: float | None = None
) -> aiohttp.ClientTimeout:
    """``ClientTimeout`` is frozen: one per distinct bound instead of one per request."""
    return aiohttp.ClientTimeout(total=total_s, sock_connect=connect_s, sock_read=read_s)


def _timeout(seconds: float) -> aiohttp.ClientTimeout:
    return client_timeout(seconds, seconds)


def _connect_timeout(seconds: float) -> aiohttp.ClientTimeout:
    return client_timeout(seconds, None)


@asynccontextmanager
async def post(
    session: aiohttp.ClientSession,
    url: URL,
    payload: dict[str, Any],
    headers: dict[str, str],
    timeout: float,
    media: Sequence[Media] = (),
    *,
    bound_reads: bool = True,
) -> AsyncIterator[aiohttp.ClientResponse]:
    """POST ``payload`` and yield a 2xx response; every failure becomes a ``ProviderError``.

    A redirect is a failure, never followed: aiohttp would resend the body and every header but
    ``Authorization`` to the new origin, and the key may be in ``x-api-key``, ``api-key`` or a
    policy header.

    ``timeout`` bounds connecting and each read (for a stream: ``stream_idle_s``, so a stream that
    stalls fails too); the router bounds the whole attempt. ``bound_reads=False`` leaves the reads
    to a caller that bounds the silence between them itself (the passthrough's ``relay.copy``):
    aiohttp's ``sock_read`` re-arms a timer on every read.

    ``media`` bytes are base64-encoded into the body slice by slice as it is sent
    (``media.parts.body``).
    """
    client_timeout = _timeout(timeout) if bound_reads else _connect_timeout(timeout)
    try:
        async with session.post(
            url,
            data=request_body(payload, media),
            headers=with_traceparent(headers),
            timeout=client_timeout,
            allow_redirects=False,
        ) as resp:
            if resp.status >= _FIRST_NON_SUCCESS:
                body = await resp.content.read(_ERROR_BODY_LIMIT)
                raise status_error(resp.status, body, dict(resp.headers))
            yield resp
    except (TimeoutError, aiohttp.ClientError) as exc:
        raise transport_error(exc, url, timeout) from exc


async def open_stream(
    session: aiohttp.ClientSession,
    url: URL,
    payload: dict[str, Any],
    headers: dict[str, str],
    timeout: float,
    media: Sequence[Media] = (),
) -> aiohttp.ClientResponse:
    """``post`` for a stream whose reads the caller takes and bounds itself (the passthrough's
    ``relay.copy``), without the context manager or a generator around the reads: a 2xx response,
    to be read from ``resp.content`` and released by the caller (``Body.of_response``).
    ``timeout`` bounds connecting only."""
    try:
        resp = await session.post(
            url,
            data=request_body(payload, media),
            headers=with_traceparent(headers),
            timeout=_connect_timeout(timeout),
            allow_redirects=False,
        )
        if resp.status >= _FIRST_NON_SUCCESS:
            try:
                body = await resp.content.read(_ERROR_BODY_LIMIT)
            finally:
                resp.release()
            raise status_error(resp.status, body, dict(resp.headers))
    except (TimeoutError, aiohttp.ClientError) as exc:
        raise transport_error(exc, url, timeout) from exc
    return resp


async def post_for_bytes(
    session: aiohttp.ClientSession, url: URL, payload: dict[str, Any], headers: dict[str, str], timeout: float
) -> bytes:
    """``post`` for a whole answer, without the context-manager machinery (the passthrough's hot path).
    ``timeout`` bounds the whole call, the answer's body included: a body dripping a byte at a
    time fails it (one timer, no per-read rescheduling)."""
    try:
        async with session.post(
            url,
            data=orjson.dumps(payload),
            headers=with_traceparent(headers),
            timeout=client_timeout(timeout, None, timeout),
            allow_redirects=False,
        ) as resp:
            if resp.status >= _FIRST_NON_SUCCESS:
                body = await resp.content.read(_ERROR_BODY_LIMIT)
                raise status_error(resp.status, body, dict(resp.headers))
            return await resp.read()
    except (TimeoutError, aiohttp.ClientError) as exc:
        raise transport_error(exc, url, timeout) from exc


def shown(url: URL) -> URL:
    """``url`` as the proxy's own texts may quote it: no userinfo, no query (a provider may take
    its key as ``?key=``)."""
    return url.with_user(None).with_query(None).with_fragment(None)


def transport_error(exc: BaseException, url: URL, timeout: float) -> ProviderError:
    """A failure below HTTP (no answer in time, connection refused or broken) as a typed error."""
    url = shown(url)
    if isinstance(exc, (TimeoutError, aiohttp.ServerTimeoutError)):
        return ProviderError("timeout", f"no answer from {url} within {timeout:g}s")
    if isinstance(exc, aiohttp.ClientPayloadError):
        return ProviderError("connect", f"connection to {url} broke mid-answer: {exc}")
    return ProviderError("connect", f"cannot reach {url}: {exc}")


async def read_json(resp: aiohttp.ClientResponse) -> dict[str, Any]:
    """The JSON object of a 2xx answer; ``malformed`` when it is not one."""
    return check_json_object(await resp.read())


def check_json_object(raw: bytes) -> dict[str, Any]:
    """``raw`` parsed; ``ProviderError(malformed)`` unless it is a JSON object."""
    try:
        value = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise ProviderError("malformed", f"upstream answered non-JSON: {raw[:200]!r}") from exc
    if not isinstance(value, dict):
        raise ProviderError("malformed", "upstream answered JSON that is not an object")
    return value
