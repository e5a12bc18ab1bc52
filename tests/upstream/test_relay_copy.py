"""``copy``: the rest of a started stream, bounded between reads from the upstream, never by the
client's pace of reading."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

import pytest

from proxy.upstream.body import Body
from proxy.upstream.relay import copy
from proxy.upstream.sse import BATCH_BYTES, StreamCheck

IDLE_S = 0.02
FRAMES = [b'data: {"choices": [{"index": 0, "delta": {"content": "hi"}}]}\n\n'] * 3 + [b"data: [DONE]\n\n"]


async def frames(*, stall: bool = False) -> AsyncIterator[bytes]:
    for frame in FRAMES[:-1]:
        yield frame
    if stall:
        await asyncio.Event().wait()  # an upstream that never sends again
    yield FRAMES[-1]


async def test_a_client_slower_than_the_idle_bound_is_not_an_upstream_stall() -> None:
    """Each write takes five idle bounds (a client reading slowly: backpressure): the bound runs
    only while waiting on the upstream, so the stream ends complete."""
    written: list[bytes] = []

    async def slow_client(data: bytes) -> None:
        done = asyncio.Event()
        asyncio.get_running_loop().call_later(IDLE_S * 5, done.set)
        await done.wait()
        written.append(data)

    end = await copy(
        b"", Body.of_chunks(frames()), slow_client, StreamCheck("chat"), idle_s=IDLE_S, until=None
    )
    assert end.reason is None
    assert written == [b"", *FRAMES]


async def test_an_upstream_silent_past_the_idle_bound_ends_the_stream_as_stalled() -> None:
    written: list[bytes] = []

    async def client(data: bytes) -> None:
        written.append(data)

    end = await copy(
        b"", Body.of_chunks(frames(stall=True)), client, StreamCheck("chat"), idle_s=IDLE_S, until=None
    )
    assert end.reason == "stalled"
    assert written == [b"", *FRAMES[:-1]]  # what came before the stall was forwarded


async def test_the_total_bound_ends_a_stream_even_while_the_client_is_slow() -> None:
    """``until`` bounds the answer from the request to its last byte: a write that outlasts it
    ends the stream as too long (the idle bound alone would not: it runs only while reading)."""
    loop = asyncio.get_running_loop()

    async def slow_client(data: bytes) -> None:
        done = asyncio.Event()
        loop.call_later(IDLE_S * 5, done.set)
        await done.wait()

    until = time.monotonic() + IDLE_S * 2
    end = await copy(
        b"", Body.of_chunks(frames()), slow_client, StreamCheck("chat"), idle_s=IDLE_S, until=until
    )
    assert end.reason == "too_long"


async def test_a_cancel_from_outside_is_not_taken_for_a_stall() -> None:
    """The client going away cancels the handler: that cancellation goes through, never a stall."""

    async def client(data: bytes) -> None:
        pass

    task = asyncio.ensure_future(
        copy(b"", Body.of_chunks(frames(stall=True)), client, StreamCheck("chat"), idle_s=60.0, until=None)
    )
    await asyncio.sleep(0)
    for _ in range(10):  # let it reach the stalled read
        await asyncio.sleep(0)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


async def test_the_copy_hands_the_check_its_reads_a_batch_at_a_time() -> None:
    """``copy`` collects the check's reads itself: they are judged every ``BATCH_BYTES``, never
    all kept to the end, and a malformed event early in a long stream is still counted."""
    frame = FRAMES[0]
    count = 3 * BATCH_BYTES // len(frame)
    check = StreamCheck("chat")
    held: list[int] = []

    async def many() -> AsyncIterator[bytes]:
        yield b"data: {not json\n\n"
        for _ in range(count):
            yield frame
        yield FRAMES[-1]

    async def client(data: bytes) -> None:
        held.append(sum(map(len, check.reads)))

    end = await copy(b"", Body.of_chunks(many()), client, check, idle_s=60.0, until=None)
    assert end.reason is None and end.malformed == 1
    assert max(held) < BATCH_BYTES + len(frame)
