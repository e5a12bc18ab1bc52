"""Request targets a client may send, and the upstream URL built from them.

A client's request target never becomes part of the upstream's scheme, host or port: the upstream
URL is the configured ``base_url`` with a path made of validated segments and the client's query
appended by yarl. What is refused, with 400:

* anything but origin-form (``/v1/...``): absolute-form ``GET http://x/v1/files`` and
  authority-form ``CONNECT host:443`` name a host, which is the policy's choice alone;
* characters outside RFC 3986 ``pchar`` (raw backslash, space, controls, non-ASCII) and malformed
  percent-encodings (``%zz``, ``%4``);
* encoded separators and controls left after decoding the unreserved characters: ``%2F``,
  ``%5C``, ``%00``..``%1F``, ``%7F``, so that no upstream can read one as a separator;
* percent-encodings that are not UTF-8 (``%C0%AE``, an overlong ``.``);
* empty segments (``//``) and dot segments (``.``/``..``, ``%2e%2e`` and ``..;x`` included: some
  servers drop ``;`` parameters before resolving). Resolving them
  instead would let ``/v1/x/../chat/completions`` reach the provider's chat endpoint past the
  proxy's own handler and its model checks; no OpenAI client sends them.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from urllib.parse import unquote_to_bytes

from aiohttp import web
from yarl import URL

from proxy.api.errors import ApiError

API_ROOT = "v1"
"""The first path segment of every passthrough path; the base URL's own trailing ``/v1`` is not
repeated."""

_UNRESERVED = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-._~")
# RFC 3986 pchar without pct-encoded (checked separately): unreserved, sub-delims, ":" and "@".
_PCHAR = re.compile(r"[A-Za-z0-9\-._~!$&'()*+,;=:@]*")
# A query may also hold "/" and "?" (RFC 3986 §3.4).
_QUERY = re.compile(r"(?:[A-Za-z0-9\-._~!$&'()*+,;=:@/?]|%[0-9A-Fa-f]{2})*")
_PERCENT = re.compile(r"%(?P<hex>[0-9A-Fa-f]{2})|%")
# Encoded characters that would be read as a separator or a control by some upstream.
_FORBIDDEN_ENCODED = frozenset({0x2F, 0x5C, 0x7F, *range(0x20)})
_DOT_SEGMENTS = frozenset({".", ".."})
_NOT_ORIGIN_FORM = "only origin-form targets (/v1/...) are accepted, never a scheme or host"


@dataclass(frozen=True, slots=True)
class ClientTarget:
    """A validated origin-form target: ``path`` normalised (unreserved characters decoded,
    percent-encodings upper-case), ``query`` exactly as the client sent it."""

    path: str
    query: str


def _refuse(reason: str) -> ApiError:
    return ApiError(400, f"Request target refused: {reason}", code="invalid_request_target")


def _segment(raw: str) -> str:
    """One path segment, percent-decoded where the character is unreserved (RFC 3986 §6.2.2)."""
    out: list[str] = []
    pos = 0
    for match in _PERCENT.finditer(raw):
        plain = raw[pos : match.start()]
        if not _PCHAR.fullmatch(plain):
            raise _refuse("the path holds a character outside RFC 3986 pchar")
        out.append(plain)
        pos = match.end()
        hex_ = match.group("hex")
        if hex_ is None:
            raise _refuse("malformed percent-encoding in the path")
        code = int(hex_, 16)
        if code in _FORBIDDEN_ENCODED:
            raise _refuse("an encoded separator or control character in the path")
        out.append(chr(code) if chr(code) in _UNRESERVED else f"%{hex_.upper()}")
    tail = raw[pos:]
    if not _PCHAR.fullmatch(tail):
        raise _refuse("the path holds a character outside RFC 3986 pchar")
    out.append(tail)
    segment = "".join(out)
    try:
        unquote_to_bytes(segment).decode("utf-8")
    except UnicodeDecodeError:
        raise _refuse("a percent-encoding in the path that is not UTF-8") from None
    return segment


def parse_target(raw_target: str) -> ClientTarget:
    """The client's request target, validated and normalised; ``ApiError`` 400 otherwise."""
    if not origin_form(raw_target):
        raise _refuse(_NOT_ORIGIN_FORM)
    path, sep, query = raw_target.partition("?")
    if sep and not _QUERY.fullmatch(query):
        raise _refuse("the query holds a character outside RFC 3986 or a malformed percent-encoding")
    segments = [_segment(s) for s in path.split("/")[1:]]
    if not segments or segments[0] != API_ROOT or len(segments) < 2:
        raise _refuse(f"the path must stay under /{API_ROOT}/")
    # A single trailing slash is harmless; any other empty segment is refused.
    inner = segments[:-1] if segments[-1] == "" else segments
    if any(s == "" for s in inner):
        raise _refuse("empty path segments (//)")
    if any(s.split(";", 1)[0] in _DOT_SEGMENTS for s in segments):
        raise _refuse("dot segments (. or ..) in the path")
    path = "/" + "/".join(segments)
    own = own_route_named(path)
    if own is not None:
        raise _refuse(f"{path} names the proxy's own route {own}: send exactly {own}")
    return ClientTarget(path, query)


OWN_ROUTES = (
    ("chat", "completions"),
    ("responses",),
    ("modules",),
    ("modules", "*"),
    ("modules", "*", "execute"),
    ("capabilities",),
    ("feedback",),
    ("usage",),
)
"""The routes the proxy serves itself under ``/v1/`` (``*``: one segment), which the
passthrough must never reach on a provider in another spelling: every ``/v1/`` row of
``proxy.api.routes.ROUTES`` but the passthrough and the model listing (a test holds the two in step)."""


def own_route_named(path: str) -> str | None:
    """The proxy's own route that ``path`` names without being it, as a server ignoring a
    trailing slash, ``;`` parameters or case would read it (``/v1/chat/completions/``,
    ``/v1/Chat/completions;x``); None when it names none, or is written exactly (its other
    methods, e.g. ``GET /v1/chat/completions``, are the provider's)."""
    segments = [s.split(";", 1)[0].lower() for s in path.split("/")[2:]]
    if segments and segments[-1] == "":
        segments.pop()
    for route in OWN_ROUTES:
        if len(route) == len(segments) and all(r in ("*", s) for r, s in zip(route, segments, strict=True)):
            canonical = "/".join(["", API_ROOT, *segments])
            return None if canonical == path else canonical
    return None


def upstream_url(base_url: str, target: ClientTarget) -> URL:
    """``base_url`` (its trailing ``/v1`` dropped) with ``target``'s path and query.

    Scheme, host and port come from ``base_url`` only: the path is made of validated segments and
    the query of validated characters, so neither can start an authority."""
    base = URL(base_url)
    prefix = base.raw_path.rstrip("/").removesuffix(f"/{API_ROOT}")
    url = URL.build(
        scheme=base.scheme,
        authority=base.raw_authority,
        path=prefix + target.path,
        query_string=target.query,
        encoded=True,
    )
    if (url.scheme, url.host, url.port) != (base.scheme, base.host, base.port):
        raise _refuse("the target would change the upstream host")  # defence in depth
    return url


def origin_form(raw_target: str) -> bool:
    """Whether a request target is origin-form (``/path?query``)."""
    return raw_target.startswith("/") and not raw_target.startswith("//")


def check_target_form(request: web.Request) -> None:
    """Absolute-form (``GET http://host/v1/x``) and authority-form (``CONNECT host:443``) targets
    are for forward proxies; this is a reverse proxy, so they are refused everywhere with 400."""
    if not origin_form(request.raw_path):
        raise _refuse(_NOT_ORIGIN_FORM)
