"""A TCP relay on loopback in front of the test Redis, to make Redis unreachable for one proxy
without touching the shared server: ``cut()`` closes every connection and refuses new ones,
``freeze()`` keeps connections open but forwards nothing (a hung Redis), ``mute()`` forwards
commands but holds Redis's replies (a write applied whose answer never came), ``restore()`` heals.
``delay_s`` holds every reply that long (a slow Redis: one delay per round trip).

It also counts round trips as the wire shows them (``turns``): on one connection, the commands a
client sends before Redis's next reply are one round trip, however many a pipeline holds.
``allow_turns(n)`` forwards the next ``n`` round trips (pings and the like not counted) and holds
every later one until ``restore()``: an answer that comes all the same waited on ``n`` at most.
``hold_replies(match)`` forwards every command but holds the reply to each round trip whose bytes
``match`` (e.g. one script's sha) until ``restore()``, on that connection only: a request answered
meanwhile did not wait on them. ``hold_requests(match)`` holds such round trips before Redis sees
them (a write in flight: applied only at ``restore()``)."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Literal

import pytest

from tests.support.redis_server import redis_port

Mode = Literal["pass", "cut", "freeze", "mute"]
UNCOUNTED = frozenset({"PING", "INFO", "CLIENT", "HELLO", "SELECT"})
"""Connection upkeep, not a request's work (the outbox pings an idle Redis every second)."""


def command_names(data: bytes) -> tuple[list[str], bytes]:
    """The names of the complete RESP commands at the start of ``data`` (upper case), and what is
    left (an incomplete command, kept until the rest arrives)."""
    names: list[str] = []
    while data.startswith(b"*"):
        head, sep, rest = data.partition(b"\r\n")
        if not sep:
            break
        parts: list[bytes] = []
        for _ in range(int(head[1:])):
            size, sep, rest = rest.partition(b"\r\n")
            if not sep or len(rest) < int(size[1:]) + 2:
                return names, data
            parts.append(rest[: int(size[1:])])
            rest = rest[int(size[1:]) + 2 :]
        names.append(parts[0].decode().upper() if parts else "")
        data = rest
    return names, data


class _Connection:
    """One client connection's round trips: a new one starts with the first command after a reply."""

    def __init__(self) -> None:
        self.pending = b""
        self.replied = True
        self.turn: list[str] | None = None
        self.held = False
        """The reply to this connection's round trip is held (``RedisRelay.hold_replies``)."""


class RedisRelay:
    def __init__(self, host: str, port: int) -> None:
        self._upstream = (host, port)
        self.mode: Mode = "pass"
        self._writers: set[asyncio.StreamWriter] = set()
        self._tasks: set[asyncio.Task[None]] = set()
        self._resume = asyncio.Event()
        self._resume.set()
        self._replies = asyncio.Event()
        self._replies.set()
        self.delay_s = 0.0
        self.port = 0
        self.turns: list[list[str]] = []
        """Each round trip's commands, in the order they began (``counted`` leaves out upkeep)."""
        self._allowed: int | None = None
        self._unheld = asyncio.Event()
        self._unheld.set()
        self._hold: Callable[[bytes], bool] | None = None
        self._hold_sent: Callable[[bytes], bool] | None = None
        self.held = 0
        """Round trips whose reply ``hold_replies`` held so far."""

    def counted(self) -> list[list[str]]:
        """The round trips of requests' work: those with a command other than upkeep."""
        return [turn for turn in self.turns if set(turn) - UNCOUNTED]

    def allow_turns(self, count: int) -> None:
        """Forward ``count`` more counted round trips; hold every later one until ``restore()``."""
        self._allowed = count
        self._unheld.clear()

    def hold_replies(self, match: Callable[[bytes], bool]) -> None:
        """Hold the reply to every later round trip whose bytes ``match``, until ``restore()``."""
        self._hold = match
        self._unheld.clear()

    def hold_requests(self, match: Callable[[bytes], bool]) -> None:
        """Hold every later round trip whose bytes ``match`` before Redis sees it, until
        ``restore()`` (that connection's later round trips wait behind it)."""
        self._hold_sent = match
        self._unheld.clear()

    def url(self, db: int) -> str:
        return f"redis://127.0.0.1:{self.port}/{db}"

    def cut(self) -> None:
        self.mode = "cut"
        self._resume.set()
        self._replies.set()
        for writer in list(self._writers):
            writer.close()

    def freeze(self) -> None:
        self.mode = "freeze"
        self._resume.clear()

    def mute(self) -> None:
        self.mode = "mute"
        self._replies.clear()

    def restore(self) -> None:
        self.mode = "pass"
        self._resume.set()
        self._replies.set()
        self._allowed = None
        self._hold = None
        self._hold_sent = None
        self._unheld.set()

    async def _requests(self, data: bytes, conn: _Connection) -> None:
        """Count ``data`` (a client's bytes) into round trips; hold a round trip past the allowed."""
        names, conn.pending = command_names(conn.pending + data)
        if not names:
            return
        if conn.replied or conn.turn is None:
            conn.turn = []
            conn.replied = False
            self.turns.append(conn.turn)
            conn.turn.extend(names)
            if self._hold is not None and self._hold(data):
                conn.held = True
                self.held += 1
            if self._hold_sent is not None and self._hold_sent(data):
                self.held += 1
                await self._unheld.wait()
            if self._allowed is not None and set(names) - UNCOUNTED:
                if self._allowed > 0:
                    self._allowed -= 1
                else:
                    await self._unheld.wait()
        else:
            conn.turn.extend(names)

    async def _pipe(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        conn: _Connection,
        *,
        replies: bool = False,
    ) -> None:
        with contextlib.suppress(ConnectionError, OSError):
            while data := await reader.read(65536):
                await self._resume.wait()
                if replies:
                    await self._replies.wait()
                    if conn.held:
                        await self._unheld.wait()
                        conn.held = False
                    if self.delay_s:
                        await asyncio.sleep(self.delay_s)
                    conn.replied = True
                else:
                    await self._requests(data, conn)
                if self.mode == "cut":
                    break
                writer.write(data)
                await writer.drain()
        writer.close()

    async def _client(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self.mode == "cut":
            writer.close()
            await writer.wait_closed()
            return
        up_reader, up_writer = await asyncio.open_connection(*self._upstream)
        self._writers |= {writer, up_writer}
        try:
            conn = _Connection()
            await asyncio.gather(
                self._pipe(reader, up_writer, conn), self._pipe(up_reader, writer, conn, replies=True)
            )
        finally:
            self._writers -= {writer, up_writer}
            for w in (writer, up_writer):
                w.close()
                with contextlib.suppress(ConnectionError, OSError):
                    await w.wait_closed()

    def _spawn(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.create_task(self._client(reader, writer))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    @classmethod
    @asynccontextmanager
    async def start(cls, host: str = "127.0.0.1", port: int | None = None) -> AsyncIterator[RedisRelay]:
        relay = cls(host, redis_port() if port is None else port)
        server = await asyncio.start_server(relay._spawn, "127.0.0.1", 0)
        relay.port = server.sockets[0].getsockname()[1]
        try:
            yield relay
        finally:
            server.close()
            relay.cut()
            for task in list(relay._tasks):
                task.cancel()
            await asyncio.gather(*relay._tasks, return_exceptions=True)
            await server.wait_closed()


@pytest.fixture
async def relay() -> AsyncIterator[RedisRelay]:
    """A relay in front of the suite's private Redis, for this test only."""
    async with RedisRelay.start() as running:
        yield running


async def _serve(redis_port: int, delay_s: float) -> None:
    async with RedisRelay.start(port=redis_port) as running:
        running.delay_s = delay_s
        print(running.port, flush=True)  # the caller reads the relay's port from the first line
        await asyncio.Event().wait()


def main() -> None:
    """``python -m tests.redis_relay --redis-port P --delay-ms D``: a relay in its own process (the
    benchmark's: its event loop shares nothing with the client measuring), until killed."""
    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("--redis-port", type=int, required=True)
    parser.add_argument("--delay-ms", type=float, default=0.0, help="held on every reply (per round trip)")
    args = parser.parse_args()
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(_serve(args.redis_port, args.delay_ms / 1000))


if __name__ == "__main__":
    main()
