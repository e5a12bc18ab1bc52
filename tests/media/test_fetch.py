"""The media fetcher's decisions (``proxy.media.fetch``), in-process against a real aiohttp origin
on loopback (trusted by ``media.trusted_hosts``, the switch that lets a fetch reach a private
address): what a URL must be, which hosts and addresses pass, how redirects, status codes,
encodings, sizes, deadlines and the cache are answered, and the E-code and reason of each refusal.
The served end to end through ``cogproxy serve`` is ``tests/security/test_media_fetch.py``."""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

import pytest
from aiohttp import web
from yarl import URL

from proxy.media.cache import ClientCache, Fetched, MediaCache
from proxy.media.fetch import (
    MAX_URL_CHARS,
    PinnedResolver,
    fetch,
    host_allowed,
    is_trusted,
    trusted_entry,
    vet,
)
from proxy.media.types import MediaError
from proxy.policy.model import MediaPolicy

BODY = b"\x89PNG-not-really" * 64  # 1024 bytes


@dataclass
class Origin:
    """The loopback origin: its base URL, the settings that trust it and what it was asked."""

    base: str
    port: int
    seen: list[dict[str, str]] = field(default_factory=list)

    def settings(self, **overrides: Any) -> MediaPolicy:
        return MediaPolicy(**{"allow_http": True, "trusted_hosts": (f"localhost:{self.port}",), **overrides})


def _routes(seen: list[dict[str, str]], stall: asyncio.Event) -> web.Application:
    async def image(request: web.Request) -> web.Response:
        seen.append(dict(request.headers))
        return web.Response(body=BODY, content_type="image/png", headers={"ETag": '"v1"'})

    async def hop(request: web.Request) -> web.Response:
        seen.append(dict(request.headers))
        n = int(request.match_info["n"])
        status = int(request.query.get("status", "302"))
        where = "/image.png" if n == 0 else f"/hop/{n - 1}?status={status}"
        return web.Response(status=status, headers={"Location": where, "Set-Cookie": "session=1"})

    async def fixed(request: web.Request) -> web.Response:
        name = request.match_info["name"]
        answers: dict[str, web.Response] = {
            "relative": web.Response(status=301, headers={"Location": "../image.png"}),
            "no-location": web.Response(status=302),
            "bad-location": web.Response(status=302, headers={"Location": "http://[::1"}),
            "not-modified": web.Response(status=304),
            "created": web.Response(status=201, body=BODY),
            "missing": web.Response(status=404),
            "gzip": web.Response(body=BODY, headers={"Content-Encoding": "gzip"}),
            "identity": web.Response(body=BODY, headers={"Content-Encoding": "IDENTITY"}),
            "untyped": web.Response(body=BODY),
            "elsewhere": web.Response(
                status=302, headers={"Location": f"http://127.0.0.1:{request.url.port}/image.png"}
            ),
        }
        return answers[name]

    async def chunked(request: web.Request) -> web.StreamResponse:
        size = int(request.match_info["size"])
        resp = web.StreamResponse(headers={"Content-Type": "application/pdf"})
        resp.enable_chunked_encoding()
        await resp.prepare(request)
        for start in range(0, size, 1000):
            await resp.write(b"x" * min(1000, size - start))
        await resp.write_eof()
        return resp

    async def stalled(request: web.Request) -> web.Response:
        await stall.wait()  # set at teardown: no answer until the fetch has given up
        return web.Response()

    app = web.Application()
    app.router.add_get("/image.png", image)
    app.router.add_get("/hop/{n}", hop)
    app.router.add_get("/fixed/{name}", fixed)
    app.router.add_get("/chunked/{size}", chunked)
    app.router.add_get("/stalled", stalled)
    return app


@pytest.fixture
async def origin() -> AsyncIterator[Origin]:
    seen: list[dict[str, str]] = []
    stall = asyncio.Event()
    runner = web.AppRunner(_routes(seen, stall), access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    port = runner.addresses[0][1]
    try:
        yield Origin(f"http://localhost:{port}", port, seen)  # a name: the pinned resolver answers it
    finally:
        stall.set()
        await runner.cleanup()


@dataclass
class Budget:
    """``cap_for`` and ``on_bytes`` of one fetch, recording what they were asked."""

    cap: int = 1 << 20
    types: list[str | None] = field(default_factory=list)
    chunks: list[int] = field(default_factory=list)

    def cap_for(self, content_type: str | None) -> int:
        self.types.append(content_type)
        return self.cap

    async def on_bytes(self, n: int) -> None:
        self.chunks.append(n)


async def get(url: str, settings: MediaPolicy, budget: Budget | None = None, *, deadline_s: float = 30.0,
              cache: ClientCache | None = None) -> Fetched:  # fmt: skip
    budget = budget or Budget()
    return await fetch(url, settings, time.monotonic() + deadline_s, budget.cap_for, budget.on_bytes, cache)


async def refused(call: Callable[[], Any], code: str = "E1012") -> MediaError:
    with pytest.raises(MediaError) as caught:
        await call()
    assert caught.value.code == code
    return caught.value


# --- vet: what a URL and its host must be ---------------------------------------------------------


@pytest.mark.parametrize(
    ("url", "allow_http", "reason"),
    [
        ("http://example.com/a.png", False, "scheme 'http' is not allowed (allowed: https)"),
        ("ftp://example.com/a.png", True, "scheme 'ftp' is not allowed (allowed: https, http)"),
        ("//example.com/a.png", False, "scheme '(none)' is not allowed (allowed: https)"),
        ("file:///etc/passwd", True, "scheme 'file' is not allowed (allowed: https, http)"),
        ("https:///a.png", False, "no host"),
        ("https://token@example.com/", False, "credentials in the URL are not sent"),  # a user part only
        ("https://:secret@example.com/", False, "credentials in the URL are not sent"),
        ("https://user:secret@example.com/", False, "credentials in the URL are not sent"),
    ],
)
async def test_a_url_is_refused_before_any_lookup(url: str, allow_http: bool, reason: str) -> None:
    error = await refused(lambda: vet(URL(url), MediaPolicy(allow_http=allow_http)))
    assert error.details == {"url": url, "reason": reason}
    assert error.message == f"Cannot fetch {url}: {reason}"


@pytest.mark.parametrize(
    ("host", "allowed", "passes"),
    [
        ("a.cdn.example", ("*.cdn.example",), True),
        ("deep.a.cdn.example", ("*.cdn.example",), True),
        ("A.CDN.Example.", ("*.cdn.example",), True),
        ("a.cdn.example", ("*.CDN.example",), True),
        ("evilcdn.example", ("*.cdn.example",), False),  # a look-alike, not a subdomain
        ("cdn.example", ("*.cdn.example",), False),  # the wildcard is for subdomains only
        ("cdn.example.evil", ("*.cdn.example",), False),
        ("cdn.example", ("cdn.example",), True),
        ("CDN.example.", ("Cdn.Example",), True),
        ("x.cdn.example", ("cdn.example",), False),  # an exact name is not a wildcard
        ("img.example", ("other.example", "img.example"), True),
        ("img.example", ("other.example", "*.other.example"), False),
        ("img.example", (), False),
    ],
)
def test_allowed_hosts_are_exact_names_or_subdomain_wildcards(
    host: str, allowed: tuple[str, ...], passes: bool
) -> None:
    assert host_allowed(host, allowed) is passes


async def test_a_host_off_the_allow_list_is_refused_before_its_lookup() -> None:
    settings = MediaPolicy(allowed_hosts=("*.cdn.example",))
    error = await refused(lambda: vet(URL("https://evilcdn.example/a.png"), settings))
    assert error.details["reason"] == "host 'evilcdn.example' is not in media.allowed_hosts"


@pytest.mark.parametrize(
    ("entry", "parsed"),
    [
        ("assets.internal:8081", ("assets.internal", (8081,))),
        (" Assets.Internal.:8081 ", ("assets.internal", (8081,))),
        ("assets.internal", ("assets.internal", (80, 443))),
        ("assets.internal:http", ("assets.internal:http", (80, 443))),  # not a port: one name
        ("[::1]:8081", ("::1", (8081,))),
        ("[::1]", ("::1", (80, 443))),  # the last colon is inside the brackets
        ("[fd00::1]", ("fd00::1", (80, 443))),
        ("Assets.Internal.", ("assets.internal", (80, 443))),
        ("[fd00::8080", ("fd00::8080", (80, 443))),  # an unclosed bracket: no port is read
        ("2130706433", ("2130706433", (80, 443))),  # digits alone are a name, not a port
        ("XBOX:8080", ("xbox", (8080,))),
        ("MAILBOX", ("mailbox", (80, 443))),
    ],
)
def test_a_trusted_entry_is_a_host_and_its_ports(entry: str, parsed: tuple[str, tuple[int, ...]]) -> None:
    assert trusted_entry(entry) == parsed


def test_is_trusted_strips_brackets_and_the_root_dot() -> None:
    assert is_trusted("[::1]", 8081, ("[::1]:8081",)) is True
    assert is_trusted("XBOX", 443, ("xbox",)) is True and is_trusted("MAILBOX.", 80, ("mailbox",)) is True
    assert host_allowed("XBOX.EXAMPLE.", ("xbox.example",)) and host_allowed("MAILBOX", ("mailbox",))
    assert is_trusted("Assets.Internal.", 443, ("assets.internal",)) is True
    assert is_trusted("assets.internal", 8443, ("assets.internal",)) is False


@pytest.mark.parametrize(
    ("url", "trusted", "passes"),
    [
        ("http://localhost/a.png", "localhost", True),  # port 80 by default
        ("https://localhost/a.png", "localhost", True),  # port 443 by default
        ("http://localhost:8080/a.png", "localhost", False),
        ("https://localhost/a.png", "localhost:80", False),  # https is 443, not 80
        ("http://localhost/a.png", "localhost:443", False),
        ("http://localhost:0/a.png", "localhost:0", True),  # an explicit :0 is 0, not the default
        ("http://localhost:0/a.png", "localhost", False),
    ],
)
async def test_the_port_a_trusted_entry_is_held_to(url: str, trusted: str, passes: bool) -> None:
    settings = MediaPolicy(allow_http=True, trusted_hosts=(trusted,))
    if passes:
        host, addresses = await vet(URL(url), settings)
        assert host == "localhost" and (socket.AF_INET, "127.0.0.1") in addresses
    else:
        error = await refused(lambda: vet(URL(url), settings))
        assert "refused: special-purpose address: Loopback" in error.details["reason"]


async def test_a_private_answer_is_refused_naming_the_address() -> None:
    error = await refused(lambda: vet(URL("https://127.0.0.1/a.png"), MediaPolicy()))
    reason = "'127.0.0.1' resolves to 127.0.0.1, refused: special-purpose address: Loopback (127.0.0.0/8)"
    assert error.details == {"url": "https://127.0.0.1/a.png", "reason": reason, "address": "127.0.0.1"}


async def test_a_name_that_cannot_be_resolved_is_refused() -> None:
    host = "a" * 64 + ".example"  # a label over 63 characters: the IDNA codec refuses it, no DNS asked
    error = await refused(lambda: vet(URL(f"https://{host}/a.png"), MediaPolicy()))
    assert error.details["reason"].startswith(f"cannot resolve {host!r}: ")


async def test_a_trusted_host_passes_with_its_addresses(origin: Origin) -> None:
    host, addresses = await vet(URL(f"{origin.base}/a.png"), origin.settings())
    assert host == "localhost" and (socket.AF_INET, "127.0.0.1") in addresses
    assert {family for family, _ in addresses} <= {socket.AF_INET, socket.AF_INET6}
    assert len(set(addresses)) == len(addresses)  # one stream address each, not one per socket type


# --- fetch: the URL text, the deadline and the cache ----------------------------------------------


async def test_a_url_over_the_length_limit_is_refused_unparsed(origin: Origin) -> None:
    path = "/image.png?pad="
    at_limit = origin.base + path + "x" * (MAX_URL_CHARS - len(origin.base) - len(path))
    assert len(at_limit) == MAX_URL_CHARS == 8192
    assert (await get(at_limit, origin.settings())).data == BODY
    error = await refused(lambda: get(at_limit + "x", origin.settings()))
    assert error.details["reason"] == "URL longer than 8192 characters"
    assert error.details["url"] == (at_limit + "x")[:500]
    assert error.message == f"Cannot fetch {at_limit[:200]}: URL longer than 8192 characters"


async def test_text_that_is_not_a_url_is_refused() -> None:
    error = await refused(lambda: get("http://[::1", MediaPolicy(allow_http=True)))
    assert error.details["reason"].startswith("not a URL: ")


@pytest.mark.parametrize(("timeout_s", "deadline_s"), [(10.0, -1.0), (0.0, 10.0), (10.0, 0.0)])
async def test_a_spent_deadline_is_refused_before_connecting(
    origin: Origin, timeout_s: float, deadline_s: float
) -> None:
    settings = origin.settings(fetch_timeout_s=timeout_s)
    error = await refused(lambda: get(f"{origin.base}/image.png", settings, deadline_s=deadline_s))
    assert error.details["reason"] == "the call's deadline is spent"
    assert origin.seen == []


@pytest.mark.parametrize(("timeout_s", "deadline_s", "said"), [(0.2, 30.0, "0.2s"), (30.0, 0.3, "0.")])
async def test_the_fetch_gives_up_at_the_sooner_of_its_timeout_and_the_deadline(
    origin: Origin, timeout_s: float, deadline_s: float, said: str
) -> None:
    settings = origin.settings(fetch_timeout_s=timeout_s)
    error = await refused(lambda: get(f"{origin.base}/stalled", settings, deadline_s=deadline_s))
    assert error.details["reason"].startswith(f"no complete answer within {said}")


async def test_a_connection_failure_is_e1012_naming_the_error() -> None:
    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    settings = MediaPolicy(allow_http=True, trusted_hosts=(f"127.0.0.1:{port}",))
    error = await refused(lambda: get(f"http://127.0.0.1:{port}/a.png", settings))
    assert error.details["reason"].startswith("ClientConnectorError: ")


async def test_a_fetch_is_kept_in_the_cache_and_a_hit_is_counted_against_the_budget(origin: Origin) -> None:
    cache = ClientCache(MediaCache(1 << 20, 300), "alice")
    url = f"{origin.base}/hop/1"
    first = await get(url, origin.settings(), cache=cache)
    assert cache.get(url) == first
    budget = Budget()
    assert await get(url, origin.settings(), budget, cache=cache) is first
    assert budget.chunks == [len(BODY)] and budget.types == []
    assert len(origin.seen) == 3  # the hit asked nobody


async def test_a_hit_whose_redirect_hop_is_no_longer_allowed_is_dropped(origin: Origin) -> None:
    cache = ClientCache(MediaCache(1 << 20, 300), "alice")
    url = f"{origin.base}/hop/1"
    await get(url, origin.settings(), cache=cache)
    other = f"http://127.0.0.1:{origin.port}/image.png"
    cache.put(url, Fetched(other, BODY, "image/png", None, (url, other)))
    error = await refused(lambda: get(url, origin.settings(), cache=cache))
    assert error.details["url"] == other and "Loopback" in error.details["reason"]
    assert cache.get(url) is None


async def test_the_connection_goes_to_the_vetted_addresses_only() -> None:
    """The DNS-rebinding pin: the session's resolver answers from the vet's list, never from DNS."""
    resolver = PinnedResolver()
    with pytest.raises(OSError, match=r"^localhost was not vetted for this fetch$"):
        await resolver.resolve("localhost", 80)
    resolver.vetted["localhost"] = [(socket.AF_INET6, "::1"), (socket.AF_INET, "127.0.0.1")]
    assert await resolver.resolve("localhost", 8080, socket.AF_UNSPEC) == [
        {"hostname": "localhost", "host": "::1", "port": 8080, "family": socket.AF_INET6, "proto": 0,
         "flags": socket.AI_NUMERICHOST},
        {"hostname": "localhost", "host": "127.0.0.1", "port": 8080, "family": socket.AF_INET, "proto": 0,
         "flags": socket.AI_NUMERICHOST},
    ]  # fmt: skip
    resolver.vetted["empty"] = []
    with pytest.raises(OSError, match="not vetted"):
        await resolver.resolve("empty", 80)
    await resolver.close()


async def test_the_environment_proxy_is_not_used(origin: Origin, monkeypatch: pytest.MonkeyPatch) -> None:
    with socket.socket() as probe:  # a proxy address nothing listens on
        probe.bind(("127.0.0.1", 0))
        dead = probe.getsockname()[1]
    for name in ("NO_PROXY", "no_proxy"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HTTP_PROXY", f"http://127.0.0.1:{dead}")
    monkeypatch.setenv("http_proxy", f"http://127.0.0.1:{dead}")
    assert (await get(f"{origin.base}/image.png", origin.settings())).data == BODY


# --- following redirects ----------------------------------------------------------------------------


@pytest.mark.parametrize("status", [301, 302, 303, 307, 308])
async def test_redirects_are_followed_up_to_max_redirects(origin: Origin, status: int) -> None:
    url = f"{origin.base}/hop/1?status={status}"  # two redirects: /hop/1, /hop/0, then the image
    got = await get(url, origin.settings(max_redirects=2))
    assert (got.url, got.data, got.content_type, got.etag) == (
        f"{origin.base}/image.png",
        BODY,
        "image/png",
        '"v1"',
    )
    assert got.chain == (url, f"{origin.base}/hop/0?status={status}", f"{origin.base}/image.png")
    error = await refused(
        lambda: get(f"{origin.base}/hop/2?status={status}", origin.settings(max_redirects=2))
    )
    assert error.details["reason"] == "more than 2 redirects"
    assert error.details["url"] == f"{origin.base}/image.png"


async def test_no_redirect_is_followed_at_max_redirects_zero(origin: Origin) -> None:
    assert (await get(f"{origin.base}/image.png", origin.settings(max_redirects=0))).data == BODY
    error = await refused(lambda: get(f"{origin.base}/hop/0", origin.settings(max_redirects=0)))
    assert error.details["reason"] == "more than 0 redirects"


async def test_a_relative_location_is_joined_to_the_url(origin: Origin) -> None:
    got = await get(f"{origin.base}/fixed/relative", origin.settings())
    assert (got.url, got.data) == (f"{origin.base}/image.png", BODY)
    assert got.chain == (f"{origin.base}/fixed/relative", f"{origin.base}/image.png")


async def test_every_hop_is_vetted_and_sent_no_cookie(origin: Origin) -> None:
    got = await get(f"{origin.base}/hop/2", origin.settings())
    assert got.data == BODY
    for headers in origin.seen:
        assert "Cookie" not in headers  # the Set-Cookie of the hops is not kept
        assert headers["Accept-Encoding"] == "identity"
        assert headers["User-Agent"] == "cognitive-proxy-media"


@pytest.mark.parametrize(
    ("name", "reason", "details"),
    [
        ("no-location", "answered 302 without Location", {}),
        ("not-modified", "answered HTTP 304", {"status": 304}),
        ("created", "answered HTTP 201", {"status": 201}),
        ("missing", "answered HTTP 404", {"status": 404}),
        ("gzip", "answered with a Content-Encoding; media must be sent as is", {}),
    ],
)
async def test_an_answer_other_than_a_plain_200_is_refused(
    origin: Origin, name: str, reason: str, details: dict[str, Any]
) -> None:
    url = f"{origin.base}/fixed/{name}"
    error = await refused(lambda: get(url, origin.settings()))
    assert error.details == {"url": url, "reason": reason, **details}


async def test_a_location_that_is_not_a_url_is_refused(origin: Origin) -> None:
    url = f"{origin.base}/fixed/bad-location"
    error = await refused(lambda: get(url, origin.settings()))
    assert error.details["reason"].startswith("bad redirect Location: ") and error.details["url"] == url


async def test_an_identity_encoding_in_any_case_is_read(origin: Origin) -> None:
    got = await get(f"{origin.base}/fixed/identity", origin.settings())
    assert got.data == BODY


async def test_an_untyped_body_is_capped_with_no_content_type(origin: Origin) -> None:
    budget = Budget()
    got = await get(f"{origin.base}/fixed/untyped", origin.settings(), budget)
    assert (got.content_type, got.etag, got.chain) == (
        "application/octet-stream",
        None,
        (f"{origin.base}/fixed/untyped",),
    )
    assert budget.types == ["application/octet-stream"]


async def test_a_redirect_to_an_untrusted_host_is_refused_before_it_is_asked(origin: Origin) -> None:
    error = await refused(lambda: get(f"{origin.base}/fixed/elsewhere", origin.settings()))
    assert error.details["url"] == f"http://127.0.0.1:{origin.port}/image.png"
    assert "Loopback" in error.details["reason"]
    assert origin.seen == []  # the image handler was never asked


# --- the size cap ---------------------------------------------------------------------------------


async def test_a_declared_length_over_the_cap_is_refused_before_reading(origin: Origin) -> None:
    budget = Budget(cap=len(BODY) - 1)
    url = f"{origin.base}/image.png?pad={'p' * 300}"  # the message quotes its first 200 characters
    error = await refused(lambda: get(url, origin.settings(), budget), "E1011")
    assert error.details == {"size_bytes": len(BODY), "max_bytes": len(BODY) - 1}
    assert error.message == f"{url[:200]} is {len(BODY)} bytes (Content-Length); the limit is {len(BODY) - 1}"
    assert budget.chunks == [] and budget.types == ["image/png"]
    assert (await get(url, origin.settings(), Budget(cap=len(BODY)))).data == BODY  # at the cap: read


@pytest.mark.parametrize("size", [10_000, 600_000])
async def test_a_streamed_body_is_stopped_as_it_passes_the_cap(origin: Origin, size: int) -> None:
    url = f"{origin.base}/chunked/{size}?pad={'p' * 300}"
    budget = Budget(cap=size)
    got = await get(url, origin.settings(), budget)
    assert got.data == b"x" * size and sum(budget.chunks) == size
    assert max(budget.chunks) <= 256 * 1024 and budget.types == ["application/pdf"]
    over = Budget(cap=size - 1)
    error = await refused(lambda: get(url, origin.settings(), over), "E1011")
    assert error.details == {"max_bytes": size - 1}
    assert error.message == f"{url[:200]} is larger than the limit of {size - 1} bytes (stopped reading)"
    assert sum(over.chunks) < size
