"""Reading request bodies, bounded by ``--max-body-bytes`` and the in-flight body budget."""

from __future__ import annotations

import zlib
from typing import Any

import orjson
from aiohttp import web

from proxy.api.app_keys import SETTINGS
from proxy.api.budget import PARSED_COPIES, READ_COPIES, Reservation, values_cost
from proxy.api.errors import ApiError, ClientReadTimeout, request_timeout
from proxy.api.middleware import RECORD_KEY, RequestRecord
from proxy.jsonshape import MAX_FORWARDED_DEPTH, encodable

# zlib window bits: gzip only, or zlib with its header (HTTP "deflate", RFC 9110 §8.4.1.2).
_WBITS = {"gzip": 16 + zlib.MAX_WBITS, "x-gzip": 16 + zlib.MAX_WBITS, "deflate": zlib.MAX_WBITS}
_IDENTITY = frozenset({"", "identity"})


def inflate(request: web.Request, raw: bytes) -> bytes:
    """``raw`` decoded as its ``Content-Encoding`` says, never past the body limit: a small gzip
    that inflates beyond ``--max-body-bytes`` is refused with 413 without being inflated further.
    aiohttp does not inflate request bodies itself (``app.SERVER_OPTIONS``)."""
    encoding = request.headers.get("Content-Encoding", "").strip().lower()
    if encoding in _IDENTITY:
        return raw
    wbits = _WBITS.get(encoding)
    if wbits is None:
        raise ApiError(
            415,
            f"Unsupported Content-Encoding {encoding!r}: use gzip or deflate",
            code="unsupported_encoding",
        )
    limit = request.app[SETTINGS].max_body_bytes
    decoder = zlib.decompressobj(wbits)
    try:
        out = decoder.decompress(raw, limit + 1)
    except zlib.error as exc:
        raise ApiError(
            400, f"The request body is not valid {encoding}: {exc}", code="invalid_encoding"
        ) from exc
    if len(out) > limit:
        raise ApiError(
            413,
            f"Request body too large: it inflates past the limit of {limit} bytes",
            code="request_too_large",
        )
    if not decoder.eof:
        raise ApiError(400, f"The request body is truncated {encoding}", code="invalid_encoding")
    if decoder.unused_data:  # a second gzip member, or junk: never silently dropped
        raise ApiError(
            400,
            f"The request body holds bytes after its {encoding} stream (send one stream)",
            code="invalid_encoding",
        )
    return out


def ensure_encodable(body: Any) -> None:
    """Refuse (400 ``too_deeply_nested``) a decoded body the proxy could not encode again:
    orjson writes at most ~254 levels, and a body re-encoded for a provider (or answered by the
    offline one) nested deeper would otherwise be a 500."""
    if not encodable(body):
        raise ApiError(
            400,
            f"The request body nests more than about {MAX_FORWARDED_DEPTH} levels and cannot be forwarded",
            code="too_deeply_nested",
        )


def reservation_of(request: web.Request, record: RequestRecord | None = None) -> Reservation:
    """The body-budget reservation the edge took for ``request`` (before its handler runs);
    ``record``: the request's, when the caller holds it."""
    reservation = (request[RECORD_KEY] if record is None else record).reservation
    assert reservation is not None, "the edge reserves before any handler reads a body"
    return reservation


def _too_large(limit: int) -> ApiError:
    return ApiError(
        413, f"Request body too large: this proxy reads at most {limit} bytes", code="request_too_large"
    )


async def read_body(
    request: web.Request, copies: int = READ_COPIES, record: RequestRecord | None = None
) -> bytes:
    """The whole request body, reserved in the body budget before it is buffered (``copies``
    times the declared length up front, then whatever arrives beyond it); 413 past
    ``--max-body-bytes``. ``record``: the request's, when the caller holds it."""
    if record is None:
        record = request[RECORD_KEY]
    limit = record.app[SETTINGS].max_body_bytes
    declared = request.content_length
    if declared is not None and declared > limit:
        raise _too_large(limit)
    reservation = reservation_of(request, record)
    reserved = declared or 0
    if not reservation.grow_now(copies * reserved):  # room now (the usual case): no await
        await reservation.grow(copies * reserved)
    content = request.content
    if content.is_eof():  # the whole body came with the head (most do): take it without a read loop
        whole = content.read_nowait()
        if len(whole) > limit:
            raise _too_large(limit)
        if len(whole) > reserved:
            await reservation.grow(copies * (len(whole) - reserved))
        return whole
    chunks: list[bytes] = []
    size = 0
    try:
        async for chunk in content.iter_any():
            size += len(chunk)
            if size > limit:  # a chunked body, or one that inflates (Content-Encoding)
                raise _too_large(limit)
            if size > reserved:
                await reservation.grow(copies * (size - reserved))
                reserved = size
            chunks.append(chunk)
    except ClientReadTimeout as exc:
        raise request_timeout() from exc
    return b"".join(chunks)


async def read_json(request: web.Request, record: RequestRecord | None = None) -> tuple[bytes, Any]:
    """The body as the client sent it (forwarded as is on passthrough) and its parsed value
    (inflated per ``Content-Encoding`` under the body limit), both reserved in the body budget
    first; 400 in OpenAI's format when the body is not JSON. ``record``: the request's, when
    the caller holds it."""
    copies = READ_COPIES + PARSED_COPIES
    if record is None:
        record = request[RECORD_KEY]
    reservation = reservation_of(request, record)
    raw = await read_body(request, copies, record)
    body = inflate(request, raw)
    if len(body) > len(raw):  # the inflated copy is held and parsed too
        await reservation.grow(copies * (len(body) - len(raw)))
    parsed = values_cost(body)
    if not reservation.grow_now(parsed):
        await reservation.grow(parsed)
    try:
        return raw, orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise ApiError(400, f"The request body is not valid JSON: {exc}", code="invalid_json") from exc


async def read_object(request: web.Request, record: RequestRecord | None = None) -> dict[str, Any]:
    """The request's JSON object; 400 in OpenAI's format when it is not one. ``record``: the
    request's, when the caller holds it."""
    _, value = await read_json(request, record)
    if not isinstance(value, dict):
        raise ApiError(400, "The request body must be a JSON object", code="invalid_json")
    return value
