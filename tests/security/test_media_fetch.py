"""Media URL fetching is no SSRF gadget (spec v2.5 §11.1, OWASP API7), proven on a real
``cogproxy serve``: every hostile URL form, pointed at a loopback canary, is refused with E1012
and the canary sees no connection; redirects are vetted hop by hop; size and time are capped."""

from __future__ import annotations

import asyncio
import signal
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml
from aiohttp import web

from tests.fake_upstream import FakeUpstream
from tests.media import samples
from tests.proxy_server import UPSTREAM_KEY, UPSTREAM_KEY_ENV, ServedProcess, proxy_process
from tests.security.conftest import security_policy
from tests.security.harness import Canary
from tests.support.polling import eventually, has

ANSWER = (
    '{"ok": true, "meta": {"confidence": 0.9, "risk": "low", "explain": "e"}, '
    '"data": {"rationale": "r", "description": "d"}}'
)


@asynccontextmanager
async def serve(fake: FakeUpstream, tmp_path: Path, media: dict[str, Any]) -> AsyncIterator[ServedProcess]:
    path = tmp_path / "policy.yaml"
    path.write_text(yaml.safe_dump(security_policy(fake, media=media)))
    async with proxy_process("--policy", str(path), env={UPSTREAM_KEY_ENV: UPSTREAM_KEY}) as proc:
        yield proc


async def describe(proc: ServedProcess, url: str) -> tuple[int, dict[str, Any]]:
    body = {"input": {"images": [{"type": "url", "url": url}]}}
    async with (
        aiohttp.ClientSession() as session,
        session.post(f"{proc.url}/v1/modules/image-describer/execute", json=body) as resp,
    ):
        return resp.status, await resp.json()


def hostile_urls(port: int) -> list[str]:
    """The canary's address in every notation a URL can carry it, and names that resolve to it."""
    hosts = [
        "127.0.0.1",
        "127.1",  # short form
        "127.0.1",
        "0x7f.1",  # hex
        "0x7f000001",
        "0x7f.0x0.0x0.0x1",
        "2130706433",  # decimal
        "0177.0.0.1",  # octal
        "0177.1",
        "017700000001",
        "127.0.0.1.",  # trailing dot
        "0",  # 0.0.0.0 reaches local listeners on Linux
        "0.0.0.0",
        "[::ffff:127.0.0.1]",  # IPv4-mapped IPv6
        "[::ffff:7f00:1]",
        "[0:0:0:0:0:ffff:127.0.0.1]",
        "[::1]",
        "[::]",
        "[64:ff9b::7f00:1]",  # NAT64
        "localhost",  # names that resolve to loopback
        "LOCALHOST",
        "localhost.",
    ]
    return [f"http://{host}:{port}/image.png" for host in hosts]


METADATA_AND_PRIVATE = [
    "http://169.254.169.254/latest/meta-data/",
    "http://[fd00:ec2::254]/latest/meta-data/",
    "http://100.100.100.200/latest/meta-data/",
    "http://10.0.0.1/a.png",
    "http://192.168.0.1/a.png",
    "http://172.16.0.1/a.png",
    "http://[fd12:3456::1]/a.png",  # IPv6 ULA
    "http://[fe80::1]/a.png",  # IPv6 link-local
    "http://224.0.0.1/a.png",  # multicast
    "http://240.0.0.1/a.png",  # reserved
]


async def test_every_loopback_notation_is_refused_without_a_connection(
    fake_upstream: FakeUpstream, tmp_path: Path, canary: Canary
) -> None:
    async with serve(fake_upstream, tmp_path, {"allow_http": True}) as proc:
        for url in hostile_urls(canary.port):
            status, env = await describe(proc, url)
            assert (status, env["error"]["code"]) == (422, "E1012"), (url, env)
            reason = env["error"]["details"]["reason"]
            # refused by its address class, or not an address at all for getaddrinfo (which is
            # what a connection would use too: "127.0.0.1." does not resolve)
            assert any(w in reason for w in ("special-purpose", "cannot resolve")), (url, reason)
    assert fake_upstream.requests == []
    canary.assert_untouched()


async def test_metadata_private_ula_link_local_multicast_reserved_are_refused(
    fake_upstream: FakeUpstream, tmp_path: Path
) -> None:
    async with serve(fake_upstream, tmp_path, {"allow_http": True}) as proc:
        for url in METADATA_AND_PRIVATE:
            status, env = await describe(proc, url)
            assert (status, env["error"]["code"]) == (422, "E1012"), (url, env)
            assert "resolves to" in env["error"]["details"]["reason"], url
        _, env = await describe(proc, METADATA_AND_PRIVATE[0])
        assert "cloud metadata" in env["error"]["details"]["reason"]
    assert fake_upstream.requests == []


async def test_only_https_by_default_and_no_other_scheme(
    fake_upstream: FakeUpstream, tmp_path: Path, canary: Canary
) -> None:
    async with serve(fake_upstream, tmp_path, {}) as proc:
        for url in (
            f"http://127.0.0.1:{canary.port}/a.png",
            "http://example.com/a.png",
            "file:///etc/passwd",
            "ftp://example.com/a.png",
            f"gopher://127.0.0.1:{canary.port}/_GET",
            "data:image/png;base64,iVBORw0KGgo=",
            "//example.com/a.png",
        ):
            status, env = await describe(proc, url)
            assert (status, env["error"]["code"]) == (422, "E1012"), url
            assert "scheme" in env["error"]["details"]["reason"], url
        # https to the canary: still refused by its address, before any TLS handshake
        status, env = await describe(proc, f"https://127.1:{canary.port}/a.png")
        assert env["error"]["code"] == "E1012" and "Loopback" in env["error"]["details"]["reason"]
    assert fake_upstream.requests == []


async def test_host_allowlist(fake_upstream: FakeUpstream, tmp_path: Path, canary: Canary) -> None:
    async with serve(fake_upstream, tmp_path, {"allowed_hosts": ["*.cdn.example"]}) as proc:
        for url in ("https://evil.example/a.png", f"https://127.0.0.1:{canary.port}/a.png"):
            status, env = await describe(proc, url)
            assert (status, env["error"]["code"]) == (422, "E1012")
            assert "allowed_hosts" in env["error"]["details"]["reason"]


class Origin:
    """An image server on loopback, reachable only as the trusted host name ``localhost``."""

    def __init__(self) -> None:
        self.hits: list[str] = []
        self.redirect_to = ""
        self.runner: web.AppRunner | None = None
        self.port = 0

    async def start(self) -> Origin:
        app = web.Application()
        app.router.add_get("/image.png", self._image)
        app.router.add_get("/redirect", self._redirect)
        app.router.add_get("/loop", self._loop)
        app.router.add_get("/big", self._big)
        app.router.add_get("/big-declared", self._big_declared)
        app.router.add_get("/stall", self._stall)
        app.router.add_get("/mislabelled", self._mislabelled)
        self.runner = web.AppRunner(app, access_log=None, shutdown_timeout=0.1)
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        await site.start()
        self.port = self.runner.addresses[0][1]
        return self

    async def stop(self) -> None:
        assert self.runner is not None
        await self.runner.cleanup()

    def url(self, path: str) -> str:
        return f"http://localhost:{self.port}{path}"

    async def _image(self, request: web.Request) -> web.Response:
        self.hits.append(request.path)
        return web.Response(body=samples.PNG, content_type="image/png", headers={"ETag": '"v1"'})

    async def _mislabelled(self, request: web.Request) -> web.Response:
        self.hits.append(request.path)
        return web.Response(body=samples.JPEG, content_type="image/png")

    async def _redirect(self, request: web.Request) -> web.Response:
        self.hits.append(request.path)
        raise web.HTTPFound(request.query["to"])

    async def _loop(self, request: web.Request) -> web.Response:
        self.hits.append(request.path)
        raise web.HTTPFound("/loop")

    async def _big(self, request: web.Request) -> web.StreamResponse:
        """21 MB of PNG without Content-Length: the cap must stop the read midway."""
        self.hits.append(request.path)
        resp = web.StreamResponse(headers={"Content-Type": "image/png"})
        await resp.prepare(request)
        try:
            await resp.write(samples.PNG)
            for _ in range(21 * 16):
                await resp.write(b"\x00" * 65536)
        except (ConnectionResetError, aiohttp.ClientConnectionResetError):
            self.hits.append("reset")
        return resp

    async def _big_declared(self, request: web.Request) -> web.Response:
        self.hits.append(request.path)
        return web.Response(
            body=b"\x00" * 1024, headers={"Content-Length": str(30 * 1024 * 1024)}, content_type="image/png"
        )

    async def _stall(self, request: web.Request) -> web.StreamResponse:
        self.hits.append(request.path)
        resp = web.StreamResponse(headers={"Content-Type": "image/png"})
        await resp.prepare(request)
        await resp.write(samples.PNG[:8])
        await asyncio.Event().wait()  # stalls until the proxy gives up and the server cancels it
        return resp


@pytest.fixture
async def origin() -> AsyncIterator[Origin]:
    server = await Origin().start()
    try:
        yield server
    finally:
        await server.stop()


def trusted(origin: Origin) -> dict[str, Any]:
    """The media policy that trusts the origin: its host name and its port only."""
    return {"allow_http": True, "trusted_hosts": [f"localhost:{origin.port}"], "fetch_timeout_s": 2}


async def test_a_trusted_host_serves_the_image_once_then_from_the_cache(
    fake_upstream: FakeUpstream, tmp_path: Path, origin: Origin
) -> None:
    fake_upstream.set_default_reply("cheap", ANSWER)
    async with serve(fake_upstream, tmp_path, trusted(origin)) as proc:
        for _ in range(2):
            status, env = await describe(proc, origin.url("/image.png"))
            assert status == 200 and env["ok"] is True, env
        status, env = await describe(proc, origin.url("/mislabelled"))
        assert env["error"]["code"] == "E1014" and env["error"]["details"]["detected_type"] == "image/jpeg"
        assert "magic_bytes" not in env["error"]["details"]  # fetched bytes are never echoed
    assert origin.hits == ["/image.png", "/mislabelled"]
    sent = fake_upstream.requests[0].json["messages"][1]["content"][1]
    assert sent["image_url"]["url"] == "data:image/png;base64," + samples.b64(samples.PNG)
    assert len(fake_upstream.requests) == 2


async def test_a_redirect_to_the_canary_is_refused_in_every_notation(
    fake_upstream: FakeUpstream, tmp_path: Path, origin: Origin, canary: Canary
) -> None:
    async with serve(fake_upstream, tmp_path, trusted(origin)) as proc:
        targets = [
            *hostile_urls(canary.port)[:-3],
            f"https://127.1:{canary.port}/",
            *METADATA_AND_PRIVATE[:2],
        ]
        for target in targets:
            status, env = await describe(proc, origin.url(f"/redirect?to={target}"))
            assert (status, env["error"]["code"]) == (422, "E1012"), (target, env)
    assert origin.hits == ["/redirect"] * len(targets)
    assert fake_upstream.requests == []
    canary.assert_untouched()


async def test_redirects_are_capped(fake_upstream: FakeUpstream, tmp_path: Path, origin: Origin) -> None:
    async with serve(fake_upstream, tmp_path, {**trusted(origin), "max_redirects": 2}) as proc:
        status, env = await describe(proc, origin.url("/loop"))
    assert (status, env["error"]["code"]) == (422, "E1012")
    assert "more than 2 redirects" in env["error"]["details"]["reason"]
    assert origin.hits == ["/loop"] * 3


async def test_size_cap_while_streaming_and_from_content_length(
    fake_upstream: FakeUpstream, tmp_path: Path, origin: Origin
) -> None:
    async with serve(fake_upstream, tmp_path, trusted(origin)) as proc:
        status, env = await describe(proc, origin.url("/big"))
        assert (status, env["error"]["code"]) == (413, "E1011"), env
        assert env["error"]["details"]["max_bytes"] == 20 * 1024 * 1024
        status, env = await describe(proc, origin.url("/big-declared"))
        assert (status, env["error"]["code"]) == (413, "E1011")
        assert env["error"]["details"]["size_bytes"] == 30 * 1024 * 1024
    assert fake_upstream.requests == []


async def test_a_stalled_fetch_times_out(fake_upstream: FakeUpstream, tmp_path: Path, origin: Origin) -> None:
    async with serve(fake_upstream, tmp_path, {**trusted(origin), "fetch_timeout_s": 0.5}) as proc:
        status, env = await describe(proc, origin.url("/stall"))
    assert (status, env["error"]["code"]) == (422, "E1012")
    assert "no complete answer within 0.5s" in env["error"]["details"]["reason"]
    assert fake_upstream.requests == []


async def test_a_trusted_host_is_trusted_on_its_port_only(
    fake_upstream: FakeUpstream, tmp_path: Path, origin: Origin, canary: Canary
) -> None:
    """Finding 6: ``localhost:<origin>`` trusts that port; another port of localhost, asked for
    directly or by a redirect from the trusted origin, is vetted like any host (loopback: refused)
    and the canary listening there sees no connection. A bare ``localhost`` trusts 80/443 only."""
    other = f"http://localhost:{canary.port}/image.png"
    async with serve(fake_upstream, tmp_path, trusted(origin)) as proc:
        for url in (other, origin.url(f"/redirect?to={other}")):
            status, env = await describe(proc, url)
            assert (status, env["error"]["code"]) == (422, "E1012"), (url, env)
            assert "Loopback" in env["error"]["details"]["reason"], env
    async with serve(fake_upstream, tmp_path, {**trusted(origin), "trusted_hosts": ["localhost"]}) as proc:
        status, env = await describe(proc, origin.url("/image.png"))
        assert (status, env["error"]["code"]) == (422, "E1012"), env
    assert origin.hits == ["/redirect"]
    assert fake_upstream.requests == []
    canary.assert_untouched()


ALICE, BOB = "sk-alice-media-0001", "sk-bob-media-0002"


async def describe_as(proc: ServedProcess, key: str, url: str) -> tuple[int, dict[str, Any]]:
    body = {"input": {"images": [{"type": "url", "url": url}]}}
    headers = {"Authorization": f"Bearer {key}"}
    async with (
        aiohttp.ClientSession() as session,
        session.post(f"{proc.url}/v1/modules/image-describer/execute", json=body, headers=headers) as resp,
    ):
        return resp.status, await resp.json()


async def aliases(proc: ServedProcess) -> list[str]:
    headers = {"Authorization": f"Bearer {ALICE}"}
    async with (
        aiohttp.ClientSession() as session,
        session.get(f"{proc.url}/v1/models", headers=headers) as resp,
    ):
        return [m["id"] for m in (await resp.json())["data"]]


async def test_the_media_cache_is_per_client_and_vetted_on_every_use(
    fake_upstream: FakeUpstream, tmp_path: Path, origin: Origin
) -> None:
    """Finding 4: Bob does not get the bytes Alice's call fetched (the origin is asked again), and
    after a reload from ``trusted_hosts: [localhost:<port>]`` to ``[]`` the cached URL is refused
    (E1012) without a fetch, for the client that cached it too."""
    fake_upstream.set_default_reply("cheap", ANSWER)
    policy = security_policy(fake_upstream, media=trusted(origin))
    path = tmp_path / "policy.yaml"
    path.write_text(yaml.safe_dump(policy))
    keys = tmp_path / "keys"
    keys.write_text(f"{ALICE} name=alice\n{BOB} name=bob\n")
    args = ("--policy", str(path), "--api-keys-file", str(keys), "--reload-interval", "0")
    url = origin.url("/image.png")
    async with proxy_process(*args, env={UPSTREAM_KEY_ENV: UPSTREAM_KEY}) as proc:
        for key in (ALICE, ALICE, BOB):
            status, env = await describe_as(proc, key, url)
            assert status == 200 and env["ok"] is True, env
        assert origin.hits == ["/image.png", "/image.png"]  # Alice's retry from the cache; Bob fetched
        policy["media"] = {**policy["media"], "trusted_hosts": []}
        policy["aliases"]["after-reload"] = "fast"
        path.write_text(yaml.safe_dump(policy))
        proc.proc.send_signal(signal.SIGHUP)
        await eventually(lambda: aliases(proc), "the policy reloaded", ready=has("after-reload"), timeout=10)
        for key in (ALICE, BOB):
            status, env = await describe_as(proc, key, url)
            assert (status, env["error"]["code"]) == (422, "E1012"), env
            assert "Loopback" in env["error"]["details"]["reason"]
    assert origin.hits == ["/image.png", "/image.png"]
