"""``follow``: the chunks a read returns leave in one write, and an interrupted stream's error
chunk names the last checkpoint written (parsed only then, #35): a delta's, whatever a later
snapshot's field names or text say, read from memory or from another replica's Redis copy."""

from __future__ import annotations

import asyncio
from typing import Any

import orjson
import pytest
import redis.asyncio as aioredis

from proxy.api.frames import Framer
from proxy.api.streaming import _Position, follow
from proxy.state.redis_client import RedisOptions
from proxy.state.stream_sessions import SessionHub
from proxy.stream.chunks import delta_chunk, recovery_info, snapshot_chunk
from tests.support.polling import eventually
from tests.support.redis_server import redis_url

REDIS_DB = 12  # tests/state/test_stream_sessions.py's: each test flushes it when done
SNAPSHOTS_NAMING_A_CHECKPOINT = [
    pytest.param({"checkpoint": "the text so far"}, id="a-field-named-checkpoint"),
    pytest.param({"data.rationale": 'the model wrote "checkpoint'}, id="text-ending-in-quoted-checkpoint"),
    pytest.param({'data.x"checkpoint': ""}, id="a-name-ending-in-quoted-checkpoint"),
    pytest.param({"checkpoint": '{"offset":1,"hash":"abcdef"}'}, id="a-checkpoint-spelled-as-text"),
]
"""Snapshot data (streamed field -> its whole text, as the chunk schema allows) whose JSON holds
the bytes ``"checkpoint"``: none of these chunks carries a checkpoint."""


def _recovery(written: list[bytes]) -> dict[str, Any]:
    error: dict[str, Any] = orjson.loads(written[-1].partition(b"data: ")[2])
    recovery: dict[str, Any] = error["error"]["recovery"]
    return recovery


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


@pytest.mark.parametrize("data", SNAPSHOTS_NAMING_A_CHECKPOINT)
async def test_a_snapshot_naming_a_checkpoint_leaves_the_last_delta_checkpoint(data: dict[str, str]) -> None:
    hub = SessionHub(ttl_s=60, max_bytes=1 << 20)
    session = hub.create("client", "m")
    delta = delta_chunk(1, "data.rationale", "a", "a")
    session.append(delta)
    session.append(snapshot_chunk(2, data))
    written: list[bytes] = []

    async def write(data: bytes) -> None:
        written.append(data)

    await follow(session, _Position(0), Framer(), write, heartbeat_s=0.02, max_s=0.1, session_id=session.id)
    assert _recovery(written) == recovery_info(2, delta["chunk"]["checkpoint"])


@pytest.mark.parametrize("data", SNAPSHOTS_NAMING_A_CHECKPOINT)
async def test_a_follower_on_another_replica_names_the_last_delta_checkpoint(data: dict[str, str]) -> None:
    """The chunks as read back from the Redis copy: the copy is lost once both were written to
    the client (as a failed write leaves it), so the follower ends with E2010 and its recovery."""
    url = redis_url(REDIS_DB)
    store = aioredis.Redis.from_url(url)
    producer = SessionHub(ttl_s=60, max_bytes=1 << 20, redis=RedisOptions(url))
    replica = SessionHub(ttl_s=60, max_bytes=1 << 20, redis=RedisOptions(url))
    try:
        session = producer.create("sk-a", "m")
        delta = delta_chunk(1, "data.rationale", "a", "a")
        session.append(delta)
        session.append(snapshot_chunk(2, data))
        events_key = f"cogproxy:stream:{session.id}:events"
        await eventually(lambda: store.llen(events_key), "both mirrored", ready=lambda n: n == 2, timeout=20)
        found = await replica.find(session.id)
        assert found is not None
        written: list[bytes] = []

        async def write(data: bytes) -> None:
            written.append(data)
            if not session.mirror_lost:
                session.mirror_lost = True
                session.append(delta_chunk(3, "data.rationale", "b", "ab"))  # never copied: the copy goes

        framer = Framer()
        await follow(
            found.source, _Position(0), framer, write, heartbeat_s=0.02, max_s=20, session_id=session.id
        )
        assert written[0] == framer.event("chunk", orjson.dumps(delta)) + framer.event(
            "chunk", orjson.dumps(snapshot_chunk(2, data))
        )
        assert b"E2010" in written[-1]
        assert _recovery(written) == recovery_info(2, delta["chunk"]["checkpoint"])
    finally:
        for hub in (producer, replica):
            await hub.aclose()
        await store.flushdb()
        await store.aclose()


class _Sink:
    """What ``follow`` writes: to ``write``, and the frames that end the stream to ``last``."""

    def __init__(self) -> None:
        self.written: list[bytes] = []
        self.ended: list[bytes] = []

    async def write(self, data: bytes) -> None:
        self.written.append(data)

    async def last(self, data: bytes) -> None:
        self.ended.append(data)


async def test_the_frames_that_end_the_stream_go_to_last_with_nothing_after() -> None:
    """``respond`` hands ``write_eof`` as ``last``: the final chunk and the response's end leave in
    one write; every earlier batch goes to ``write``."""
    hub = SessionHub(ttl_s=60, max_bytes=1 << 20)
    session = hub.create("client", "m")
    delta = delta_chunk(1, "data.rationale", "a", "a")
    session.append(delta)
    sink = _Sink()
    framer = Framer()
    follower = asyncio.create_task(
        follow(
            session,
            _Position(0),
            framer,
            sink.write,
            heartbeat_s=5,
            max_s=10,
            session_id=session.id,
            last=sink.last,
        )
    )
    while not sink.written:  # the delta read and written before the final chunk exists
        await asyncio.sleep(0)
    final = {"ok": True, "final": True, "seq": 2, "data": {}}
    session.append(final)
    await asyncio.wait_for(follower, 10)
    assert sink.written == [framer.event("chunk", orjson.dumps(delta))]
    assert sink.ended == [framer.event("final", orjson.dumps(final))]


async def test_an_interrupted_stream_ends_through_last_too() -> None:
    hub = SessionHub(ttl_s=60, max_bytes=1 << 20)
    session = hub.create("client", "m")
    sink = _Sink()
    await follow(
        session,
        _Position(0),
        Framer(),
        sink.write,
        heartbeat_s=0.02,
        max_s=0.05,
        session_id=session.id,
        last=sink.last,
    )
    assert all(data == Framer().heartbeat() for data in sink.written)
    assert len(sink.ended) == 1 and b"event: error" in sink.ended[0] and b'"code":"E2011"' in sink.ended[0]


async def test_a_stream_that_keeps_sending_outlives_max_s_which_bounds_its_silence() -> None:
    """``max_s`` (the session TTL) is how long a follower waits for the next chunk, not for the whole
    stream: a live answer longer than the TTL is not cut while its chunks keep coming."""
    now = [0.0]
    hub = SessionHub(ttl_s=60, max_bytes=1 << 20)
    session = hub.create("client", "m")
    written: list[bytes] = []

    async def write(data: bytes) -> None:
        written.append(data)
        now[0] += 6.0  # each chunk comes 6 s after the one before: 5 of them outlast max_s = 10 s
        seq = len(written) + 1
        session.append(
            delta_chunk(seq, "data.rationale", "x", "x" * seq)
            if seq <= 5
            else {"ok": True, "final": True, "seq": seq, "data": {}}
        )

    session.append(delta_chunk(1, "data.rationale", "x", "x"))
    framer = Framer()
    await asyncio.wait_for(
        follow(
            session,
            _Position(0),
            framer,
            write,
            heartbeat_s=5,
            max_s=10,
            session_id=session.id,
            clock=lambda: now[0],
        ),
        10,
    )
    assert b"event: error" not in b"".join(written)
    assert written[-1].startswith(b"event: final")
