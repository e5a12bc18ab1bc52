"""Finding 12: slow or idle-opened connections cannot hold the proxy's descriptors.

A request head must arrive within ``--client-read-timeout`` and a body may not stall longer
than that between bytes (408, then close); ``--max-connections`` caps open client connections
(the rest get 503 and are closed), both counted in ``cognitive_connections_refused_total``."""

from __future__ import annotations

import asyncio
import io
import re
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import aiohttp
import orjson
import yaml

from tests.fake_upstream import FakeUpstream
from tests.proxy_server import UPSTREAM_KEY, UPSTREAM_KEY_ENV, ServedProcess, free_port, proxy_process
from tests.security.conftest import security_policy
from tests.security.harness import request_bytes
from tests.support.polling import eventually

DEADLINE_S = 10.0
KEEP_ALIVE_GET = b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"


@asynccontextmanager
async def serve(fake: FakeUpstream, tmp_path: Path, *args: str) -> AsyncIterator[ServedProcess]:
    path = tmp_path / "policy.yaml"
    path.write_text(yaml.safe_dump(security_policy(fake)))
    async with proxy_process("--policy", str(path), *args, env={UPSTREAM_KEY_ENV: UPSTREAM_KEY}) as served:
        yield served


def port_of(served: ServedProcess) -> int:
    return int(served.url.rsplit(":", 1)[1])


async def read_answer(reader: asyncio.StreamReader) -> tuple[int, bytes]:
    """One response (Content-Length framed): status and body."""
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), DEADLINE_S)
    status = int(head.split(b" ", 2)[1])
    length = int(re.search(rb"(?i)content-length: (\d+)", head)[1])  # type: ignore[index]
    return status, await asyncio.wait_for(reader.readexactly(length), DEADLINE_S)


async def closed(reader: asyncio.StreamReader) -> bool:
    try:
        return await asyncio.wait_for(reader.read(1), DEADLINE_S) == b""
    except ConnectionResetError:
        return True


async def metric(url: str, name: str) -> float:
    """A sample from /metrics, retried while the proxy is still freeing a connection slot."""
    async with aiohttp.ClientSession() as session:

        async def page() -> str | None:
            async with session.get(url + "/metrics") as resp:
                return await resp.text() if resp.status == 200 else None

        text = await eventually(
            page,
            f"/metrics answering for {name}",
            ready=lambda t: t is not None,
            timeout=DEADLINE_S,
            step=0.02,
            ignore=(aiohttp.ClientError,),
        )
    match = re.search(rf"^{re.escape(name)} (\S+)$", text or "", re.M)
    return float(match[1]) if match else 0.0


async def test_a_half_sent_head_gets_408_and_the_connection_closes(
    fake_upstream: FakeUpstream, tmp_path: Path
) -> None:
    async with serve(fake_upstream, tmp_path, "--client-read-timeout", "0.5") as served:
        # A keep-alive client that is idle meanwhile is not affected.
        idle_reader, idle_writer = await asyncio.open_connection("127.0.0.1", port_of(served))
        reader, writer = await asyncio.open_connection("127.0.0.1", port_of(served))
        try:
            idle_writer.write(KEEP_ALIVE_GET)
            assert (await read_answer(idle_reader))[0] == 200
            writer.write(b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Ty")
            status, body = await read_answer(reader)
            assert status == 408
            assert orjson.loads(body)["error"]["code"] == "request_timeout"
            assert await closed(reader)
            idle_writer.write(KEEP_ALIVE_GET)
            assert (await read_answer(idle_reader))[0] == 200
        finally:
            for w in (writer, idle_writer):
                w.close()
                await w.wait_closed()
        refused = 'cognitive_connections_refused_total{reason="read_timeout"}'
        assert await metric(served.url, refused) == 1
    assert fake_upstream.count() == 0


async def test_a_connection_that_sends_nothing_is_closed(fake_upstream: FakeUpstream, tmp_path: Path) -> None:
    async with serve(fake_upstream, tmp_path, "--client-read-timeout", "0.5") as served:
        reader, writer = await asyncio.open_connection("127.0.0.1", port_of(served))
        try:
            status, _ = await read_answer(reader)
            assert status == 408
            assert await closed(reader)
        finally:
            writer.close()
            await writer.wait_closed()


async def test_a_stalled_body_gets_408(fake_upstream: FakeUpstream, tmp_path: Path) -> None:
    async with serve(fake_upstream, tmp_path, "--client-read-timeout", "0.5") as served:
        reader, writer = await asyncio.open_connection("127.0.0.1", port_of(served))
        try:
            head = request_bytes("POST", "/v1/chat/completions", headers={"Content-Type": "application/json"})
            writer.write(head.replace(b"Content-Length: 0", b"Content-Length: 1000") + b'{"model": ')
            status, body = await read_answer(reader)
            assert status == 408
            assert orjson.loads(body)["error"]["code"] == "request_timeout"
            assert await closed(reader)
        finally:
            writer.close()
            await writer.wait_closed()
    assert fake_upstream.count() == 0


async def test_connections_beyond_the_cap_are_refused_and_counted(
    fake_upstream: FakeUpstream, tmp_path: Path
) -> None:
    cap = 3
    async with serve(fake_upstream, tmp_path, "--max-connections", str(cap)) as served:
        held = [await asyncio.open_connection("127.0.0.1", port_of(served)) for _ in range(cap)]
        try:
            for reader, writer in held:
                writer.write(KEEP_ALIVE_GET)
                assert (await read_answer(reader))[0] == 200
            reader, writer = await asyncio.open_connection("127.0.0.1", port_of(served))
            try:
                status, body = await read_answer(reader)
                assert status == 503
                assert orjson.loads(body)["error"]["code"] == "too_many_connections"
                assert await closed(reader)
            finally:
                writer.close()
                await writer.wait_closed()
            for reader, writer in held:  # the admitted keep-alive clients are still served
                writer.write(KEEP_ALIVE_GET)
                assert (await read_answer(reader))[0] == 200
        finally:
            reader, writer = held.pop()
            writer.close()
            await writer.wait_closed()
        refused = 'cognitive_connections_refused_total{reason="max_connections"}'
        assert await metric(served.url, refused) >= 1
        assert await metric(served.url, 'cognitive_open_connections{listener="api"}') <= cap
        for _, writer in held:
            writer.close()
            await writer.wait_closed()


async def test_a_head_trickled_byte_by_byte_still_gets_408(
    fake_upstream: FakeUpstream, tmp_path: Path
) -> None:
    """The head deadline runs from its first byte: more bytes do not extend it (slowloris)."""
    head = b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n" + b"X-Pad: " + b"a" * 200
    async with serve(fake_upstream, tmp_path, "--client-read-timeout", "0.5") as served:
        reader, writer = await asyncio.open_connection("127.0.0.1", port_of(served))
        answer = asyncio.ensure_future(read_answer(reader))
        try:
            sent = 0
            while not answer.done() and sent < len(head):
                writer.write(head[sent : sent + 1])
                sent += 1
                await asyncio.wait({answer}, timeout=0.05)  # the attacker's pace
            status, _ = await answer
            assert status == 408
            assert sent < len(head)  # answered before the trickle ended
        finally:
            answer.cancel()
            writer.close()
            await writer.wait_closed()


async def test_a_large_upload_under_backpressure_is_not_cut_by_the_read_timeout(
    fake_upstream: FakeUpstream, tmp_path: Path
) -> None:
    """While the proxy pauses reading (its upstream takes the upload slower than the client
    sends it), the client is not stalling: the deadline does not run."""
    upload = 16 * 1024 * 1024
    received: list[int] = []
    read_timeout_s = 0.2
    upstream_pause_s = 5 * read_timeout_s
    """The stimulus, not a wait: the upstream stops reading this long, so the proxy stops reading
    the client (backpressure) for longer than the client read timeout."""

    async def slow_upstream(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        chunked = b"chunked" in head.lower()
        first = await reader.readexactly(1024 * 1024)
        await asyncio.sleep(upstream_pause_s)
        if chunked:
            rest = await reader.readuntil(b"\r\n0\r\n\r\n")
        else:
            length = int(re.search(rb"(?i)content-length: (\d+)", head)[1])  # type: ignore[index]
            rest = await reader.readexactly(length - len(first))
        received.append(len(first) + len(rest))
        body = b'{"id": "file-1", "object": "file"}'
        writer.write(
            b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n"
            b"Connection: close\r\n\r\n%s" % (len(body), body)
        )
        await writer.drain()
        writer.close()
        await writer.wait_closed()

    upstream = await asyncio.start_server(slow_upstream, "127.0.0.1", 0)
    port = upstream.sockets[0].getsockname()[1]
    policy = security_policy(fake_upstream)
    policy["providers"]["up"]["base_url"] = f"http://127.0.0.1:{port}/v1"
    path = tmp_path / "policy.yaml"
    path.write_text(yaml.safe_dump(policy))
    try:
        async with (
            proxy_process(
                "--policy",
                str(path),
                "--client-read-timeout",
                str(read_timeout_s),
                env={UPSTREAM_KEY_ENV: UPSTREAM_KEY},
            ) as served,
            aiohttp.ClientSession() as session,
        ):
            headers = {"Content-Type": "application/octet-stream", "Content-Length": str(upload)}
            async with session.post(
                served.url + "/v1/files", data=io.BytesIO(b"0" * upload), headers=headers
            ) as resp:
                assert resp.status == 200, await resp.text()
    finally:
        upstream.close()
        await upstream.wait_closed()
    assert received and received[0] >= upload


async def test_the_admin_listener_has_the_read_deadline_too(
    fake_upstream: FakeUpstream, tmp_path: Path
) -> None:
    admin = free_port()
    async with serve(
        fake_upstream, tmp_path, "--client-read-timeout", "0.5", "--admin-port", str(admin)
    ) as served:
        reader, writer = await asyncio.open_connection("127.0.0.1", admin)
        try:
            writer.write(b"GET /healthz HTTP/1.1\r\nHost: 10.0.0.5")
            status, _ = await read_answer(reader)
            assert status == 408
            assert await closed(reader)
        finally:
            writer.close()
            await writer.wait_closed()
        assert await metric(served.url, 'cognitive_open_connections{listener="admin"}') == 0
