"""Finding 5: request bodies in flight share one memory budget (``--max-inflight-body-bytes``).

A request that does not fit waits briefly, then gets 503 with Retry-After; a body that alone
exceeds the budget gets 413 at once; the budget is given back when a request ends."""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path

import aiohttp
import orjson
import yaml

from tests.fake_upstream import FakeUpstream
from tests.proxy_server import UPSTREAM_KEY, UPSTREAM_KEY_ENV, ServedProcess, proxy_process
from tests.security.conftest import security_policy
from tests.security.harness import raw_http, request_bytes
from tests.support.polling import eventually

BUDGET = 4_000_000
HELD = 600_000
"""Declared by a slow client: reserves 4x (two copies while read, two once parsed) = 2.4 MB."""
SECOND = 500_000
"""Reserves 2 MB: does not fit beside ``HELD``, fits alone."""
COPIES = 4
DEADLINE_S = 10.0


def chat_body(size: int) -> bytes:
    """A valid chat request of about ``size`` bytes (one long message: costs ~4x its bytes)."""
    return orjson.dumps({"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "x" * size}]})


async def in_use(url: str) -> float:
    async with aiohttp.ClientSession() as session, session.get(url + "/metrics") as resp:
        text = await resp.text()
    match = re.search(r"^cognitive_inflight_body_bytes (\S+)$", text, re.M)
    assert match, "the budget gauge is exported"
    return float(match[1])


async def wait_for_in_use(url: str, ready: Callable[[float], bool]) -> float:
    return await eventually(
        lambda: in_use(url), "the body budget in use", ready=ready, timeout=DEADLINE_S, step=0.02
    )


@asynccontextmanager
async def budgeted(fake: FakeUpstream, tmp_path: Path) -> AsyncIterator[ServedProcess]:
    path = tmp_path / "policy.yaml"
    path.write_text(yaml.safe_dump(security_policy(fake)))
    async with proxy_process(
        "--policy", str(path), "--max-inflight-body-bytes", str(BUDGET), env={UPSTREAM_KEY_ENV: UPSTREAM_KEY}
    ) as served:
        yield served


def chat_request(body: bytes) -> bytes:
    return request_bytes(
        "POST", "/v1/chat/completions", headers={"Content-Type": "application/json"}, body=body
    )


async def test_a_body_beyond_the_budget_waits_then_gets_503_and_the_budget_is_released(
    fake_upstream: FakeUpstream, tmp_path: Path
) -> None:
    async with budgeted(fake_upstream, tmp_path) as served:
        port = int(served.url.rsplit(":", 1)[1])
        # A client that declares a large body and sends it slowly holds its share meanwhile.
        head = chat_request(b"")
        head = head.replace(b"Content-Length: 0", f"Content-Length: {HELD}".encode())
        _, writer = await asyncio.open_connection("127.0.0.1", port)
        try:
            writer.write(head + b'{"model"')
            await writer.drain()
            await wait_for_in_use(served.url, lambda v: v >= COPIES * HELD)

            refused = await raw_http("127.0.0.1", port, chat_request(chat_body(SECOND)))
            assert refused.status == 503
            assert refused.headers["Retry-After"] == "1"
            assert orjson.loads(refused.body)["error"]["code"] == "body_budget_exhausted"
        finally:
            writer.close()
            await writer.wait_closed()
        await wait_for_in_use(served.url, lambda v: v == 0)
        served_later = await raw_http("127.0.0.1", port, chat_request(chat_body(SECOND)))
        assert served_later.status == 200
        assert await in_use(served.url) == 0
    assert fake_upstream.count("/v1/chat/completions") == 1


async def test_a_body_costlier_than_the_whole_budget_is_413_without_waiting(
    fake_upstream: FakeUpstream, tmp_path: Path
) -> None:
    async with budgeted(fake_upstream, tmp_path) as served:
        port = int(served.url.rsplit(":", 1)[1])
        declared = await raw_http("127.0.0.1", port, chat_request(chat_body(BUDGET // COPIES + 10)))
        assert declared.status == 413
        assert orjson.loads(declared.body)["error"]["code"] == "request_too_large"
        # 40k small keys: 400 kB of text (1.6 MB as copies) but ~10 MB of values once parsed.
        keys = orjson.dumps({"model": "gpt-4o-mini", "messages": [], **{f"k{i}": 1 for i in range(40_000)}})
        assert len(keys) < BUDGET
        parsed = await raw_http("127.0.0.1", port, chat_request(keys))
        assert parsed.status == 413
        assert await in_use(served.url) == 0
    assert fake_upstream.count("/v1/chat/completions") == 0


async def test_a_chunked_body_is_accounted_as_it_arrives(fake_upstream: FakeUpstream, tmp_path: Path) -> None:
    async with budgeted(fake_upstream, tmp_path) as served:
        port = int(served.url.rsplit(":", 1)[1])
        body = chat_body(BUDGET // COPIES + 10)
        chunked = (
            b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n"
            b"Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"
            + b"".join(
                f"{len(part):x}\r\n".encode() + part + b"\r\n"
                for part in (body[i : i + 65536] for i in range(0, len(body), 65536))
            )
            + b"0\r\n\r\n"
        )
        answer = await raw_http("127.0.0.1", port, chunked)
        assert answer.status == 413
        assert await in_use(served.url) == 0
