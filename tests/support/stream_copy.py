"""The stream-recovery copy under load (#32 item 2), shared by its test
(tests/state/test_stream_mirror.py: the share within the issue's window, asserted) and ``make
bench``'s ``--stream-copy`` section (the share and the lag's p50/p99, printed): ``STREAMS``
concurrent module streams through one ``SessionHub`` copying to Redis, and for each session the
lag from its last chunk to the moment it is whole in Redis."""

from __future__ import annotations

import asyncio
from typing import Any

from proxy.state.redis_client import RedisOptions
from proxy.state.stream_sessions import Session, SessionHub
from proxy.stream.chunks import delta_chunk, final_chunk

STREAMS = 16
ANSWERS_PER_STREAM = 4
CHUNKS = 240
"""Deltas of one answer: a few hundred tokens, one delta each."""
BURST = 6
BURST_GAP_S = 0.02
"""A model streams ~300 tokens/s, read a few tokens per TCP read: the producer appends
``BURST`` deltas at once, then waits for the next read (the rate being simulated, not a wait
for something to happen)."""
POLL_S = 0.02
"""How often a session is looked for in Redis after its last chunk: the lag's resolution."""


async def answer(hub: SessionHub) -> tuple[Session, float]:
    """One streamed answer of ``CHUNKS`` deltas and a final chunk; the session and the loop time
    of its last chunk."""
    session = hub.create("sk-a", "m")
    text = ""
    for seq in range(1, CHUNKS + 1):
        text += "tok "
        session.append(delta_chunk(seq, "data.rationale", "tok ", text))
        if seq % BURST == 0:
            await asyncio.sleep(BURST_GAP_S)
    session.append(final_chunk(CHUNKS + 1, {"ok": True, "meta": {}, "data": {"rationale": text}}, {}, {}))
    session.finish()
    return session, asyncio.get_running_loop().time()


async def whole_in_redis(store: Any, session: Session) -> bool:
    """Whether Redis (``store``, answering bytes) has the session finished with every event."""
    info = f"cogproxy:stream:{session.id}:info"
    done, count = await store.hmget(info, ["done", "count"])
    stored = await store.llen(f"cogproxy:stream:{session.id}:events")
    return bool(done == b"1" and count == str(len(session.events)).encode() and stored == len(session.events))


async def copy_lag(
    store: Any, session: Session, finished_at: float, give_up_s: float, step: float
) -> float | None:
    """Seconds from the session's last chunk until it is whole in Redis, looked for every
    ``step``; None when it is not within ``give_up_s``."""
    loop = asyncio.get_running_loop()
    while not await whole_in_redis(store, session):
        if loop.time() - finished_at >= give_up_s:
            return None
        await asyncio.sleep(step)
    return loop.time() - finished_at


async def copy_lags(
    url: str,
    store: Any,
    give_up_s: float,
    *,
    answers: int = ANSWERS_PER_STREAM,
    step: float = POLL_S,
) -> list[float | None]:
    """``STREAMS`` concurrent streams answering ``answers`` times each through one hub copying to
    ``url``; each session's :func:`copy_lag`, looked for in ``store`` (the same Redis, directly)."""
    hub = SessionHub(ttl_s=60, max_bytes=1 << 30, redis=RedisOptions(url))
    checks: list[asyncio.Task[float | None]] = []

    async def stream() -> None:
        for _ in range(answers):
            session, finished_at = await answer(hub)
            checks.append(asyncio.ensure_future(copy_lag(store, session, finished_at, give_up_s, step)))

    try:
        await asyncio.gather(*(stream() for _ in range(STREAMS)))
        return list(await asyncio.gather(*checks))
    finally:
        await hub.aclose()


def share_within(lags: list[float | None], window_s: float) -> float:
    """The share of the sessions whole in Redis within ``window_s`` of their last chunk."""
    return sum(1 for lag in lags if lag is not None and lag <= window_s) / len(lags)
