"""Tools for attacking a real ``cogproxy serve`` from outside.

* ``Canary``: a TCP listener on loopback that records every connection. A test that must not
  make the proxy reach some host points the hostile input at the canary and asserts it stayed
  untouched (the ``canary`` fixture asserts that by itself on teardown).
* ``raw_http``: sends exact bytes on a socket and reads the answer, so request targets such as
  ``GET http://x/v1/files`` or ``/v1/../admin`` reach the proxy as written (HTTP clients
  normalise them).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from multidict import CIMultiDict

READ_LIMIT = 16 * 1024 * 1024


@dataclass
class Canary:
    """A loopback listener that fails the test if anything connects to it (on ``port``, or a free
    port when 0)."""

    host: str = "127.0.0.1"
    port: int = 0
    received: list[bytes] = field(default_factory=list)
    connections: int = 0
    _server: asyncio.AbstractServer | None = None

    async def start(self) -> Canary:
        async def touched(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            self.connections += 1
            try:
                self.received.append(await asyncio.wait_for(reader.read(65536), 2))
            except TimeoutError:
                self.received.append(b"")
            writer.close()
            await writer.wait_closed()

        self._server = await asyncio.start_server(touched, self.host, self.port)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def assert_untouched(self) -> None:
        assert self.connections == 0, f"the canary was contacted: {self.received!r}"

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()


@dataclass(frozen=True)
class RawResponse:
    status: int
    headers: CIMultiDict[str]
    body: bytes


async def raw_http(host: str, port: int, request: bytes, *, timeout: float = 10.0) -> RawResponse:
    """Send ``request`` byte for byte (it should say ``Connection: close``) and parse the answer."""
    reader, writer = await asyncio.open_connection(host, port)
    try:
        writer.write(request)
        await writer.drain()
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), timeout)
        lines = head.decode("latin-1").split("\r\n")
        status = int(lines[0].split(" ", 2)[1])
        headers: CIMultiDict[str] = CIMultiDict()
        for line in lines[1:]:
            if line:
                name, _, value = line.partition(":")
                headers.add(name.strip(), value.strip())
        if "Content-Length" in headers:
            body = await asyncio.wait_for(reader.readexactly(int(headers["Content-Length"])), timeout)
        elif headers.get("Transfer-Encoding", "").lower() == "chunked":
            body = await asyncio.wait_for(_read_chunked(reader), timeout)
        else:
            body = await asyncio.wait_for(reader.read(READ_LIMIT), timeout)
        return RawResponse(status, headers, body)
    finally:
        writer.close()
        await writer.wait_closed()


async def _read_chunked(reader: asyncio.StreamReader) -> bytes:
    out = bytearray()
    while True:
        size = int((await reader.readline()).split(b";")[0].strip(), 16)
        if size == 0:
            await reader.readline()
            return bytes(out)
        out += await reader.readexactly(size)
        await reader.readexactly(2)


def request_bytes(
    method: str,
    target: str,
    *,
    host: str = "127.0.0.1",
    headers: dict[str, str] | None = None,
    body: bytes = b"",
) -> bytes:
    """An HTTP/1.1 request with ``target`` exactly as given (no normalisation)."""
    lines = [f"{method} {target} HTTP/1.1", f"Host: {host}", "Connection: close"]
    for name, value in (headers or {}).items():
        lines.append(f"{name}: {value}")
    if body or method in ("POST", "PUT", "PATCH"):
        lines.append(f"Content-Length: {len(body)}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body
