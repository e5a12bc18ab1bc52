"""A session call's pending-write mark in the Redis context store (``SessionMarks``): which writes
it covers, for how long, and what its removal leaves (docs/context.md, "Read-your-writes")."""

from __future__ import annotations

from typing import Any

from proxy.context.identity import Identity
from proxy.context.prefetch import ReadThrough
from proxy.context.store import MARK_MARGIN_S, MARK_TTL_S
from proxy.state.context_store import RedisContextStore
from proxy.state.outbox import RedisOutbox
from proxy.state.redis_client import RedisOptions
from tests.support.polling import eventually
from tests.support.redis_server import redis_url

URL = redis_url(15)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


async def test_a_mark_covers_its_sessions_keys_while_it_lives_and_goes_after_them(redis_db: Any) -> None:
    clock = Clock()
    outbox = RedisOutbox(RedisOptions(URL))
    outbox.start()
    store = RedisContextStore(RedisOptions(URL), outbox, clock=clock)
    identity = Identity("0123456789abcdef0123456789abcdef", "marks-1", "u1")
    call = ReadThrough(store)
    state = identity.key("marks-1", "session_state")
    try:
        mark = call.plan_mark(identity)
        assert mark is not None and store.mark(Identity(identity.namespace)) is None  # no session
        await call.fetch([state])  # the read that adds the mark
        assert await redis_db.zrange(mark.key, 0, -1) == [mark.member]
        assert call.covered(state)
        assert not call.covered(identity.key("user", "u1", "user_profile"))  # read by other sessions
        clock.now += MARK_TTL_S - MARK_MARGIN_S
        assert not call.covered(state)  # a call that ran this long waits for its writes' ack
        await call.put(state, b"{}", 60)
        call.release()

        async def removed() -> bool:
            return bool(await redis_db.zcard(mark.key) == 0 and await redis_db.get(state) == "{}")

        await eventually(removed, "the write, then the mark's removal, delivered")
    finally:
        await store.aclose()
        await outbox.aclose()


async def test_a_replica_does_not_wait_for_its_own_marks(redis_db: Any) -> None:
    outbox = RedisOutbox(RedisOptions(URL))  # not started: nothing is delivered
    store = RedisContextStore(RedisOptions(URL), outbox)
    identity = Identity("0123456789abcdef0123456789abcdef", "marks-2")
    first, second = ReadThrough(store), ReadThrough(store)
    key = identity.key("marks-2", "session_state")
    try:
        first.plan_mark(identity)
        await first.fetch([key])
        first.release()  # queued, never delivered: the mark stays in Redis
        mark = second.plan_mark(identity)
        assert mark is not None
        read = await store.read_marked([key], mark)
        alive = frozenset((read[mark.key] or b"").decode().split())
        assert len(alive) == 1 and await store.wait_for_writes([key], mark, alive) is None
    finally:
        await store.aclose()
        await outbox.aclose()


async def test_a_wait_on_another_replicas_mark_is_measured_whether_it_was_seen_or_not(redis_db: Any) -> None:
    """What a reader waited on another replica's marks reaches ``on_mark_wait`` (the proxy's
    ``cognitive_context_mark_wait_seconds{result}``): ``seen`` when the mark went within the
    bound, ``not_seen`` when the bound ran out first; a read with no other mark reports nothing."""
    writer_outbox = RedisOutbox(RedisOptions(URL))  # not started: the writer's mark stays
    writer = RedisContextStore(RedisOptions(URL), writer_outbox)
    waits: list[tuple[str, float]] = []
    reader_outbox = RedisOutbox(RedisOptions(URL))
    reader = RedisContextStore(
        RedisOptions(URL), reader_outbox, on_mark_wait=lambda result, s: waits.append((result, s))
    )
    identity = Identity("0123456789abcdef0123456789abcdef", "marks-3")
    key = identity.key("marks-3", "session_state")
    try:
        alone = ReadThrough(reader)
        mark = alone.plan_mark(identity)
        assert mark is not None
        read = await reader.read_marked([key], mark)
        assert await reader.wait_for_writes([key], mark, frozenset()) is None and waits == []

        held = ReadThrough(writer)
        held.plan_mark(identity)
        await held.fetch([key])  # the writer's mark, never removed
        read = await reader.read_marked([key], mark)
        alive = frozenset((read[mark.key] or b"").decode().split())
        await reader.wait_for_writes([key], mark, alive)
        assert [result for result, _ in waits] == ["not_seen"] and waits[0][1] > 0

        read = await reader.read_marked([key], mark)  # the writer's mark still alive
        alive = frozenset((read[mark.key] or b"").decode().split())
        writer_outbox.start()  # now the writer's release is delivered while the reader waits
        held.release()
        await reader.wait_for_writes([key], mark, alive)
        assert [result for result, _ in waits] == ["not_seen", "seen"]
    finally:
        await reader.aclose()
        await writer.aclose()
        await reader_outbox.aclose()
        await writer_outbox.aclose()
