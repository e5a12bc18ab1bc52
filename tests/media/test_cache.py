"""The fetched-media cache in-process (issue #26 finding 4): keyed by client, every hit vetted
against the media policy of the call that uses it, and emptied when the media policy changes."""

from __future__ import annotations

import gc
import time
import tracemalloc
from collections.abc import AsyncIterator

import pytest
from aiohttp import web

from proxy.api.media import MediaCaches
from proxy.media.cache import ClientCache, Fetched, MediaCache
from proxy.media.fetch import fetch
from proxy.media.types import MediaError
from proxy.policy.model import MediaPolicy
from tests.media import samples


@pytest.fixture
async def origin() -> AsyncIterator[tuple[str, list[str]]]:
    hits: list[str] = []

    async def image(request: web.Request) -> web.Response:
        hits.append(request.path)
        return web.Response(body=samples.PNG, content_type="image/png")

    app = web.Application()
    app.router.add_get("/image.png", image)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    try:
        yield f"http://localhost:{runner.addresses[0][1]}/image.png", hits
    finally:
        await runner.cleanup()


async def get(url: str, settings: MediaPolicy, cache: ClientCache) -> Fetched:
    async def nothing(_: int) -> None:
        return None

    return await fetch(url, settings, time.monotonic() + 10, lambda _: 1 << 20, nothing, cache)


async def test_a_hit_is_vetted_again_and_refused_once_the_host_is_no_longer_trusted(
    origin: tuple[str, list[str]],
) -> None:
    url, hits = origin
    port = url.split(":")[2].split("/")[0]
    trusting = MediaPolicy(allow_http=True, trusted_hosts=(f"localhost:{port}",))
    cache = ClientCache(MediaCache(1 << 20, 300), "alice")
    assert (await get(url, trusting, cache)).data == samples.PNG
    assert (await get(url, trusting, cache)).data == samples.PNG
    with pytest.raises(MediaError) as caught:
        await get(url, MediaPolicy(allow_http=True), cache)
    assert caught.value.code == "E1012" and "Loopback" in caught.value.details["reason"]
    assert hits == ["/image.png"]
    assert cache.get(url) is None  # the refused entry is gone


async def test_one_client_never_gets_another_clients_fetch(origin: tuple[str, list[str]]) -> None:
    url, hits = origin
    port = url.split(":")[2].split("/")[0]
    settings = MediaPolicy(allow_http=True, trusted_hosts=(f"localhost:{port}",))
    shared = MediaCache(1 << 20, 300)
    await get(url, settings, ClientCache(shared, "alice"))
    assert ClientCache(shared, "bob").get(url) is None
    await get(url, settings, ClientCache(shared, "bob"))
    assert hits == ["/image.png", "/image.png"]


def test_a_changed_media_policy_starts_an_empty_cache() -> None:
    caches = MediaCaches()
    before = MediaPolicy(trusted_hosts=("localhost:8081",))
    cache = caches.for_policy(before)
    assert cache is not None and caches.for_policy(MediaPolicy(trusted_hosts=("localhost:8081",))) is cache
    cache.put(("alice", "u"), Fetched("u", b"x", None))
    after = caches.for_policy(MediaPolicy())
    assert after is not cache and after is not None and len(after) == 0
    assert caches.for_policy(MediaPolicy(cache_max_bytes=0)) is None


def test_the_cache_bound_counts_what_its_entries_really_hold() -> None:
    """Issue #29 finding 5, the media cache's turn: only the media bytes were counted, so many
    small fetches (a 1-pixel image each) held their URLs, redirect chains and bookkeeping beyond
    the bound, and a fetched body kept its read buffer's slack. What tracemalloc sees the cache
    hold is within what its bound counts."""
    cache = MediaCache(max_bytes=1 << 40, ttl_s=60)
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for n in range(3000):
            url = f"https://media.example/{n:064x}.png"
            data = bytearray()
            for _ in range(3):
                data += b"\x89PNG" * 8  # read chunk by chunk, as fetch does
            cache.put((f"client-{n % 3}", url), Fetched(url, data, "image/png", None, (url,)))
        gc.collect()
        held = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert held <= cache.size, f"{held} bytes held, {cache.size} counted"
