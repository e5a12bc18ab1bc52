"""Which headers cross the proxy on a relayed call: the client's request headers that go
upstream (``forwarded``) and the upstream's response headers that come back (``returned_headers``).
"""

from __future__ import annotations

from collections.abc import Mapping

from multidict import CIMultiDict

# Request headers sent upstream; everything else a client sends stays here (cookies, its own key
# in Authorization/X-Api-Key/api-key, X-Forwarded-For, Origin, ...). The provider's key and the
# policy's ``providers.<name>.headers`` are added after, and X-Request-Id is the trace id.
FORWARDED_HEADERS = frozenset(
    {
        "accept",
        "accept-encoding",
        "accept-language",
        "content-type",
        "content-length",
        "content-encoding",
        "idempotency-key",
        "traceparent",
        "tracestate",
    }
)
FORWARDED_PREFIX = "openai-"
"""OpenAI-Organization, OpenAI-Project, OpenAI-Beta and the API's future OpenAI-* headers."""
# Response headers never returned to the client: an upstream's cookies would be set on the
# proxy's origin for every client of it.
DROPPED_RESPONSE_HEADERS = frozenset({"set-cookie", "set-cookie2", "content-length"})
# RFC 9110 §7.6.1 hop-by-hop headers, plus what the proxy sets itself.
HOP_BY_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "proxy-connection",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
        "host",
    }
)


def forwarded(name: str) -> bool:
    """Whether a client's request header goes upstream on passthrough."""
    lower = name.lower()
    return lower in FORWARDED_HEADERS or lower.startswith(FORWARDED_PREFIX)


def connection_tokens(headers: Mapping[str, str]) -> set[str]:
    """The header names listed in ``Connection`` (in every such header): for this hop only."""
    values = [v for k, v in headers.items() if k.lower() == "connection"]
    return {t.strip().lower() for v in values for t in v.split(",") if t.strip()}


def returned_headers(upstream: Mapping[str, str]) -> CIMultiDict[str]:
    """The upstream's response headers the client gets: all but hop-by-hop ones and cookies."""
    out: CIMultiDict[str] = CIMultiDict()
    dropped = HOP_BY_HOP | DROPPED_RESPONSE_HEADERS | connection_tokens(upstream)
    for name, value in upstream.items():
        if name.lower() not in dropped:
            out.add(name, value)
    return out
