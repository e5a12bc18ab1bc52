"""``follow``: the chunks a read returns leave in one write, and an interrupted stream's error
chunk names the last checkpoint written (parsed only then, #35)."""

from __future__ import annotations

from typing import Any

import orjson

from proxy.api.frames import Framer
from proxy.api.streaming import _Position, follow
from proxy.state.stream_sessions import SessionHub
from proxy.stream.chunks import delta_chunk, recovery_info


async def test_an_interrupted_follow_names_the_last_checkpoint_written() -> None:
    hub = SessionHub(ttl_s=60, max_bytes=1 << 20)
    session = hub.create("client", "m")
    first, second = delta_chunk(1, "data.rationale", "a", "a"), delta_chunk(2, "data.rationale", "b", "ab")
    session.append(first)
    session.append(second)
    written: list[bytes] = []

    async def write(data: bytes) -> None:
        written.append(data)

    framer = Framer()
    # the session never finishes: after the two deltas, heartbeats until the session's time is up
    await follow(session, _Position(0), framer, write, heartbeat_s=0.02, max_s=0.1, session_id=session.id)
    both = framer.event("chunk", orjson.dumps(first)) + framer.event("chunk", orjson.dumps(second))
    assert written[0] == both  # read at once, written at once, framed as before
    assert all(data == framer.heartbeat() for data in written[1:-1])
    error: dict[str, Any] = orjson.loads(written[-1].partition(b"data: ")[2])
    assert error["error"]["recovery"] == recovery_info(2, second["chunk"]["checkpoint"])


async def test_a_resumed_follow_keeps_the_given_checkpoint_until_a_chunk_has_one() -> None:
    hub = SessionHub(ttl_s=60, max_bytes=1 << 20)
    session = hub.create("client", "m")
    given = {"offset": 1, "hash": "abcdef"}
    written: list[bytes] = []

    async def write(data: bytes) -> None:
        written.append(data)

    await follow(session, _Position(3, given), Framer(), write, heartbeat_s=0.02, max_s=0.05, session_id="s")
    error: dict[str, Any] = orjson.loads(written[-1].partition(b"data: ")[2])
    assert error["error"]["recovery"] == recovery_info(3, given)
