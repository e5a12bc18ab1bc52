"""Fetching a media URL without becoming an SSRF gadget (spec v2.5 §11.1, OWASP API7).

Per hop: the scheme is https (http only with ``media.allow_http``); the host passes
``media.allowed_hosts`` when set; ``getaddrinfo`` is asked once and every address it answers must
be an ordinary global address (``addresses.refusal``) unless ``media.trusted_hosts`` names the
exact host and port (``host:port``; a bare host stands for ports 80 and 443 only); the
connection then goes to the vetted address only — the session's resolver answers from the
vetted list and never looks up again (DNS rebinding), while TLS still verifies the original host
name. A cached answer is vetted the same way, every URL of its redirect chain, before it is used.
Redirects are followed by hand, each one vetted the same way, at most ``media.max_redirects``.
The body is read in chunks and refused (E1011) as soon as it passes the cap; the whole fetch
runs under ``min(media.fetch_timeout_s, the call's deadline)``. Every refusal or failure is E1012
with the reason, before any byte is sent to the refused host.
"""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp
from aiohttp.abc import AbstractResolver, ResolveResult
from yarl import URL

from proxy.media.addresses import parse, refusal
from proxy.media.cache import ClientCache, Fetched
from proxy.media.types import MediaError
from proxy.policy.model import MediaPolicy

CHUNK_BYTES = 256 * 1024
MAX_URL_CHARS = 8192
"""A URL longer than this is refused before it is parsed (a JSON input can carry megabytes)."""
_REDIRECTS = frozenset({301, 302, 303, 307, 308})


def _failed(url: str, reason: str, **details: Any) -> MediaError:
    return MediaError(
        "E1012", f"Cannot fetch {url[:200]}: {reason}", {"url": url[:500], "reason": reason, **details}
    )


class PinnedResolver(AbstractResolver):
    """Answers only with addresses vetted for a host; never asks DNS."""

    def __init__(self) -> None:
        self.vetted: dict[str, list[tuple[int, str]]] = {}

    async def resolve(
        self, host: str, port: int = 0, family: socket.AddressFamily = socket.AF_INET
    ) -> list[ResolveResult]:
        found = self.vetted.get(host)
        if not found:
            raise OSError(f"{host} was not vetted for this fetch")
        return [
            ResolveResult(hostname=host, host=ip, port=port, family=fam, proto=0, flags=socket.AI_NUMERICHOST)
            for fam, ip in found
        ]

    async def close(self) -> None:
        return None


def _host_name(text: str) -> str:
    """A host name as names are compared: no IPv6 brackets, no root dot, lower case."""
    return text.strip("[]").rstrip(".").lower()


def host_allowed(host: str, allowed: tuple[str, ...]) -> bool:
    """Exact names, or ``*.example.com`` for any subdomain of example.com."""
    host = _host_name(host)
    for entry in allowed:
        entry = entry.lower()
        if host == entry or (entry.startswith("*.") and host.endswith(entry[1:])):
            return True
    return False


DEFAULT_PORTS = (80, 443)
"""The ports a bare ``trusted_hosts`` entry (no ``:port``) stands for."""


def trusted_entry(entry: str) -> tuple[str, tuple[int, ...]]:
    """``host:port`` -> (host, (port,)); a bare host -> (host, DEFAULT_PORTS). IPv6 in brackets."""
    entry = entry.strip()
    host, sep, port = entry.rpartition(":")
    if not sep or (entry.startswith("[") and not host.endswith("]")) or not port.isdigit():
        return _host_name(entry), DEFAULT_PORTS
    return _host_name(host), (int(port),)


def is_trusted(host: str, port: int, entries: tuple[str, ...]) -> bool:
    """Whether ``media.trusted_hosts`` names this exact host on this port."""
    host = _host_name(host)
    return any(h == host and port in ports for h, ports in map(trusted_entry, entries))


async def vet(url: URL, settings: MediaPolicy) -> tuple[str, list[tuple[int, str]]]:
    """The host of ``url`` and the addresses a connection to it may use; E1012 otherwise."""
    text = str(url)
    schemes = ("https", "http") if settings.allow_http else ("https",)
    if url.scheme not in schemes:
        raise _failed(
            text, f"scheme {url.scheme or '(none)'!r} is not allowed (allowed: {', '.join(schemes)})"
        )
    host = url.raw_host
    if not host:
        raise _failed(text, "no host")
    if url.raw_user is not None or url.raw_password is not None:
        raise _failed(text, "credentials in the URL are not sent")
    if settings.allowed_hosts and not host_allowed(host, settings.allowed_hosts):
        raise _failed(text, f"host {host!r} is not in media.allowed_hosts")
    # The port the connection uses: yarl answers the scheme's default (443, 80) when none is
    # written and an explicit :0 as 0 (the scheme is http or https here); ``or 0`` only narrows
    # the type.
    port = url.port or 0
    try:
        infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except (OSError, UnicodeError) as exc:
        raise _failed(text, f"cannot resolve {host!r}: {exc}") from None
    addresses = [(int(family), str(sockaddr[0])) for family, _, _, _, sockaddr in infos]
    if not is_trusted(host, port, settings.trusted_hosts):
        for _, address in addresses:
            why = refusal(parse(address))
            if why is not None:
                raise _failed(text, f"{host!r} resolves to {address}, refused: {why}", address=address)
    if not addresses:  # getaddrinfo raises rather than answer nothing: defence in depth
        raise _failed(text, f"{host!r} has no address")  # pragma: no mutate
    return host, addresses


async def fetch(
    url_text: str,
    settings: MediaPolicy,
    deadline: float,
    cap_for: Callable[[str | None], int],
    on_bytes: Callable[[int], Awaitable[None]],
    cache: ClientCache | None = None,
) -> Fetched:
    """The bytes at ``url_text``, or ``MediaError`` (E1012 refused/failed, E1011 over the cap).

    ``cap_for(content_type)`` bounds the body; ``on_bytes(n)`` is awaited before each chunk is
    kept (the in-flight memory budget).
    """
    if len(url_text) > MAX_URL_CHARS:
        raise _failed(url_text, f"URL longer than {MAX_URL_CHARS} characters")
    try:
        url = URL(url_text)
    except (ValueError, TypeError) as exc:
        raise _failed(url_text, f"not a URL: {exc}") from None
    if cache is not None and (hit := cache.get(url_text)) is not None:
        try:
            for hop in hit.chain:  # a hit passes today's vet, as a fetch would (policy, DNS)
                await vet(URL(hop), settings)
        except MediaError:
            cache.drop(url_text)
            raise
        await on_bytes(len(hit.data))
        return hit
    budget = min(settings.fetch_timeout_s, deadline - time.monotonic())
    if budget <= 0:
        raise _failed(url_text, "the call's deadline is spent")
    resolver = PinnedResolver()
    connector = aiohttp.TCPConnector(resolver=resolver, use_dns_cache=False, limit=1)
    session = aiohttp.ClientSession(
        connector=connector, cookie_jar=aiohttp.DummyCookieJar(), trust_env=False, auto_decompress=False
    )
    try:
        async with asyncio.timeout(budget):
            fetched = await _follow(session, resolver, url, settings, cap_for, on_bytes)
    except TimeoutError:
        raise _failed(url_text, f"no complete answer within {budget:.3g}s") from None
    except aiohttp.ClientError as exc:
        raise _failed(url_text, f"{type(exc).__name__}: {exc}") from None
    finally:
        await session.close()
    if cache is not None:
        cache.put(url_text, fetched)
    return fetched


async def _follow(
    session: aiohttp.ClientSession,
    resolver: PinnedResolver,
    url: URL,
    settings: MediaPolicy,
    cap_for: Callable[[str | None], int],
    on_bytes: Callable[[int], Awaitable[None]],
) -> Fetched:
    chain: list[str] = []
    for _ in range(settings.max_redirects + 1):
        chain.append(str(url))
        host, addresses = await vet(url, settings)
        resolver.vetted[host] = addresses
        async with session.get(
            url,
            allow_redirects=False,
            headers={"Accept-Encoding": "identity", "User-Agent": "cognitive-proxy-media"},
        ) as resp:
            if resp.status in _REDIRECTS:
                location = resp.headers.get("Location")
                if not location:
                    raise _failed(str(url), f"answered {resp.status} without Location")
                try:
                    url = url.join(URL(location))
                except ValueError as exc:
                    raise _failed(str(url), f"bad redirect Location: {exc}") from None
                continue
            if resp.status != 200:
                raise _failed(str(url), f"answered HTTP {resp.status}", status=resp.status)
            content_type = resp.headers.get("Content-Type")
            if resp.headers.get("Content-Encoding", "identity").lower() != "identity":
                raise _failed(str(url), "answered with a Content-Encoding; media must be sent as is")
            cap = cap_for(content_type)
            data = await _read_capped(resp, cap, str(url), on_bytes)
            return Fetched(str(url), data, content_type, resp.headers.get("ETag"), tuple(chain))
    raise _failed(str(url), f"more than {settings.max_redirects} redirects")


async def _read_capped(
    resp: aiohttp.ClientResponse, cap: int, url: str, on_bytes: Callable[[int], Awaitable[None]]
) -> bytearray:
    declared = resp.content_length
    if declared is not None and declared > cap:
        raise MediaError(
            "E1011",
            f"{url[:200]} is {declared} bytes (Content-Length); the limit is {cap}",
            {"size_bytes": declared, "max_bytes": cap},
        )
    data = bytearray()
    async for chunk in resp.content.iter_chunked(CHUNK_BYTES):
        if len(data) + len(chunk) > cap:
            raise MediaError(
                "E1011",
                f"{url[:200]} is larger than the limit of {cap} bytes (stopped reading)",
                {"max_bytes": cap},
            )
        await on_bytes(len(chunk))
        data += chunk
    return data
