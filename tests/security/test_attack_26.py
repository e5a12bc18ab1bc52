"""Issue #26 adversarial pass by an outside attacker: neighbouring inputs of each finding.

Each test here failed on e966788 (the merged fixes) and passes with its fix.
"""

from __future__ import annotations

import zlib
from pathlib import Path

import aiohttp
import orjson
import pytest
import yaml
from yarl import URL

from proxy.media.cache import ClientCache, Fetched, MediaCache
from proxy.media.fetch import vet
from proxy.media.types import MediaError
from proxy.policy.model import MediaPolicy
from proxy.state.feedback import AnswerRecord, MemoryFeedbackStore
from proxy.state.stream_sessions import SESSION_OVERHEAD_BYTES, SessionHub
from proxy.stream.chunks import delta_chunk
from tests.fake_upstream import FakeUpstream
from tests.media import samples
from tests.proxy_server import UPSTREAM_KEY, UPSTREAM_KEY_ENV, proxy_process, running_proxy, upstream_policy
from tests.security.conftest import security_policy
from tests.security.harness import raw_http


def _record(client: str, trace_id: str) -> AnswerRecord:
    return AnswerRecord(
        trace_id,
        "m",
        "decision",
        "fast",
        "up",
        "cheap",
        0.9,
        0.6,
        "low",
        "accept",
        0.7,
        1000.0,
        1060.0,
        client,
    )


class _Clock:
    def __call__(self) -> float:
        return 1000.0


async def test_one_client_cannot_evict_another_clients_feedback_records() -> None:
    """Same class as #26.8: the feedback LRU (feedback.max_entries) is shared by every client, so
    Bob's calls evicted Alice's record before she could give her verdict. Past the bound, the
    client holding the most records loses its oldest (the caller, on a tie)."""
    store = MemoryFeedbackStore(_Clock())
    store.remember(_record("alice", "a-1"), 10)
    for i in range(100):
        store.remember(_record("bob", f"b-{i}"), 10)
    assert len(store) == 10
    assert await store.get("alice", "a-1") is not None
    assert [await store.get("bob", f"b-{i}") is not None for i in (91, 99)] == [True, True]
    assert await store.get("bob", "b-90") is None  # Bob kept his newest 9
    # Alice, below her share, still evicts the largest client's oldest, never her own.
    for i in range(2, 6):
        store.remember(_record("alice", f"a-{i}"), 10)
    assert len(store) == 10
    assert all([await store.get("alice", f"a-{i}") is not None for i in (1, 2, 3, 4, 5)])
    # At her share (5 each), one more of Alice's evicts her own oldest.
    store.remember(_record("alice", "a-6"), 10)
    assert await store.get("alice", "a-1") is None
    assert await store.get("bob", "b-95") is not None


ODD_EXPECT = "zqexpect-canary"


def _with_expect(path: str, expect: str) -> bytes:
    return (
        f"POST {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\nExpect: {expect}\r\n"
        "Content-Type: application/json\r\nContent-Length: 2\r\n\r\n{}"
    ).encode()


async def test_an_unknown_expectation_is_refused_in_the_routes_shape(
    fake_upstream: FakeUpstream, tmp_path: Path
) -> None:
    """aiohttp answered an ``Expect`` other than 100-continue itself, before any middleware:
    ``417 text/plain "Unknown Expect: <the client's value>"`` on every route, the module route
    included (no envelope), and before the host guard and client auth. Now the edge refuses it
    after them, as an OpenAI error or, on a module route, as the envelope; the value is never
    echoed. ``100-continue`` still continues."""
    path = tmp_path / "policy.yaml"
    path.write_text(yaml.safe_dump(security_policy(fake_upstream)))
    async with proxy_process("--policy", str(path), env={UPSTREAM_KEY_ENV: UPSTREAM_KEY}) as served:
        port = int(served.url.rsplit(":", 1)[1])
        chat = await raw_http("127.0.0.1", port, _with_expect("/v1/chat/completions", ODD_EXPECT))
        execute = await raw_http(
            "127.0.0.1", port, _with_expect("/v1/modules/code-reviewer/execute", ODD_EXPECT)
        )
        wrong_host = await raw_http(
            "127.0.0.1",
            port,
            _with_expect("/v1/chat/completions", ODD_EXPECT).replace(
                b"Host: localhost", b"Host: evil.example"
            ),
        )
        continued = await raw_http(
            "127.0.0.1", port, _with_expect("/v1/modules/code-reviewer/execute", "100-continue")
        )
    assert chat.status == 417, chat
    assert orjson.loads(chat.body)["error"]["code"] == "expectation_failed"
    assert execute.status == 417, execute
    envelope = orjson.loads(execute.body)
    assert envelope["ok"] is False and envelope["error"]["code"] == "E1004", envelope
    assert wrong_host.status == 403, wrong_host  # the host guard first
    for answer in (chat, execute, wrong_host):
        assert ODD_EXPECT.encode() not in answer.body
    assert continued.status == 100  # the interim answer, then the module's own (a 400 envelope)
    assert b'"ok":false' in continued.body and b"E1" in continued.body


def _corrupt_png() -> bytes:
    """A PNG whose header (IHDR) is whole and whose pixel data (IDAT) is not zlib."""
    good = samples.image("PNG", (40, 30))
    at = good.index(b"IDAT")
    size = int.from_bytes(good[at - 4 : at], "big")
    bad = b"\x00" * size
    crc = zlib.crc32(b"IDAT" + bad).to_bytes(4, "big")
    return good[: at + 4] + bad + crc + good[at + 4 + size + 4 :]


def _truncated_jpeg() -> bytes:
    jpeg = samples.image("JPEG", (40, 30))
    return jpeg[: jpeg.index(b"\xff\xda") + 40]  # the scan cut short, no end marker


@pytest.mark.parametrize(
    ("media_type", "data"), [("image/png", _corrupt_png()), ("image/jpeg", _truncated_jpeg())]
)
async def test_an_image_whose_pixels_cannot_be_decoded_is_refused_when_metadata_is_stripped(
    fake_upstream: FakeUpstream, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, media_type: str, data: bytes
) -> None:
    """``media.strip_metadata`` decodes the pixels, the only step that does; the header check had
    passed, so a body whose pixels are not what the header says raised out of ``strip_metadata``
    and the call answered 500 (E3xxx). It is the client's input that is bad: E1013, no upstream call."""
    monkeypatch.setenv(UPSTREAM_KEY_ENV, UPSTREAM_KEY)
    policy = upstream_policy(fake_upstream, media={"strip_metadata": True})
    body = {
        "input": {
            "prompt": "What is this?",
            "images": [{"type": "base64", "media_type": media_type, "data": samples.b64(data)}],
        }
    }
    async with (
        running_proxy(tmp_path, policy) as proxy,
        aiohttp.ClientSession() as session,
        session.post(f"{proxy.url}/v1/modules/image-describer/execute", json=body) as resp,
    ):
        status, envelope = resp.status, await resp.json()
    assert (status, envelope["error"]["code"]) == (400, "E1013"), envelope
    assert fake_upstream.requests == []


def test_one_client_cannot_evict_another_clients_cached_media() -> None:
    """The fetched-media cache was keyed by client but bounded by one shared LRU of bytes: Bob's
    fetches pushed Alice's entries out (her retry fetched again). Past ``cache_max_bytes`` the
    client holding the most bytes loses its own oldest entry."""
    cache = MediaCache(max_bytes=10_000, ttl_s=60.0, clock=lambda: 0.0)
    alice, bob = ClientCache(cache, "alice"), ClientCache(cache, "bob")
    alice.put("https://a.example/1", Fetched("https://a.example/1", b"a" * 2_000, "image/png"))
    for i in range(20):
        bob.put(f"https://b.example/{i}", Fetched(f"https://b.example/{i}", b"b" * 1_000, "image/png"))
    assert cache.size <= 10_000
    assert alice.get("https://a.example/1") is not None
    assert bob.get("https://b.example/19") is not None and bob.get("https://b.example/11") is None
    # Alice, holding less, evicts Bob's oldest, never her own.
    alice.put("https://a.example/2", Fetched("https://a.example/2", b"a" * 2_000, "image/png"))
    assert alice.get("https://a.example/1") is not None and alice.get("https://a.example/2") is not None
    assert cache.size <= 10_000


async def test_one_client_cannot_evict_another_clients_stream_sessions() -> None:
    """Stream-recovery sessions share one memory bound (``max_bytes``); finished sessions were
    evicted oldest first whoever owned them, so Bob's streams cost Alice her recovery. Past the
    bound the finished sessions of the client holding the most bytes go first."""
    bound = 4 * (SESSION_OVERHEAD_BYTES + 1200)  # about four of these sessions
    hub = SessionHub(ttl_s=60, max_bytes=bound)
    alice = hub.create("alice", "m")
    alice.append(delta_chunk(1, "data.rationale", "a" * 900, "a" * 900))
    alice.finish()
    bobs = []
    for _ in range(10):
        session = hub.create("bob", "m")
        session.append(delta_chunk(1, "data.rationale", "b" * 900, "b" * 900))
        session.finish()
        bobs.append(session)
    assert hub.used_bytes <= bound
    assert await hub.find(alice.id) is not None
    assert await hub.find(bobs[-1].id) is not None and await hub.find(bobs[0].id) is None


async def test_port_zero_is_vetted_as_port_zero_not_as_the_default_port() -> None:
    """``url.port or default``: an explicit ``:0`` was vetted as port 80, so a bare trusted host
    (ports 80 and 443 only) was trusted for a URL whose connection names port 0. The vet now
    judges the port the connection would use."""
    policy = MediaPolicy(allow_http=True, trusted_hosts=("localhost",))
    await vet(URL("http://localhost/"), policy)  # trusted on its default port
    with pytest.raises(MediaError) as refused:
        await vet(URL("http://localhost:0/"), policy)
    assert refused.value.code == "E1012" and "Loopback" in refused.value.message
