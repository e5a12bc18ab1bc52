"""Stream sessions: unguessable ids, client key binding, the memory bound, TTL, reading."""

from __future__ import annotations

import asyncio

import pytest

from proxy.stream.chunks import delta_chunk, final_chunk
from proxy.stream.sessions import SessionHub, client_hash, is_session_id
from tests.support.polling import eventually


def test_session_ids_carry_128_random_bits() -> None:
    hub = SessionHub(ttl_s=60, max_bytes=1 << 20)
    ids = {hub.create("anonymous", "m").id for _ in range(2000)}
    assert len(ids) == 2000 and all(is_session_id(i) for i in ids)
    assert {len(i) for i in ids} == {len("sess_") + 32}
    # every hex digit position varies: no counter, no timestamp prefix
    assert all(len({i[5 + p] for i in ids}) == 16 for p in range(32))


async def test_only_the_client_key_hash_is_kept_and_compared() -> None:
    hub = SessionHub(ttl_s=60, max_bytes=1 << 20)
    session = hub.create("sk-secret", "m")
    assert "sk-secret" not in repr(session) and session.client == client_hash("sk-secret")
    found = await hub.find(session.id)
    assert found is not None
    assert hub.same_client(found.client, "sk-secret") and not hub.same_client(found.client, "sk-other")
    assert not hub.same_client(found.client, "anonymous")


async def test_finished_sessions_are_evicted_oldest_first_beyond_the_memory_bound() -> None:
    hub = SessionHub(ttl_s=60, max_bytes=4000)
    sessions = []
    for _ in range(5):
        session = hub.create("anonymous", "m")
        session.append(delta_chunk(1, "data.rationale", "x" * 900, "x" * 900))
        session.finish()
        sessions.append(session)
    assert hub.used_bytes <= 4000
    assert await hub.find(sessions[0].id) is None  # the oldest went first
    assert await hub.find(sessions[-1].id) is not None


async def test_a_live_session_is_never_evicted() -> None:
    hub = SessionHub(ttl_s=60, max_bytes=1000)
    live = hub.create("anonymous", "m")
    for seq in range(1, 5):
        live.append(delta_chunk(seq, "data.rationale", "y" * 500, "y" * 500 * seq))
    assert await hub.find(live.id) is not None and hub.live == 1


async def test_a_finished_session_expires_after_its_ttl() -> None:
    hub = SessionHub(ttl_s=0.05, max_bytes=1 << 20)
    session = hub.create("anonymous", "m")
    session.finish()
    assert await hub.find(session.id) is not None
    await eventually(
        lambda: hub.find(session.id), "the session expired", ready=lambda s: s is None, step=0.01
    )
    assert hub.used_bytes == 0


async def test_a_reader_waits_for_the_next_chunk_and_sees_the_end() -> None:
    hub = SessionHub(ttl_s=60, max_bytes=1 << 20)
    session = hub.create("anonymous", "m")
    reader = asyncio.ensure_future(session.read(0, 5))
    await asyncio.sleep(0)
    assert not reader.done()
    session.append(delta_chunk(1, "data.rationale", "a", "a"))
    events, done = await reader
    assert [kind for kind, _ in events] == ["chunk"] and done is False
    session.append(final_chunk(2, {"ok": True, "meta": {}, "data": {}}, {}, {}))
    session.finish()
    events, done = await session.read(1, 5)
    assert [kind for kind, _ in events] == ["final"] and done is True
    assert await session.read(2, 0.01) == ([], True)


@pytest.mark.parametrize("bad", ["sess_abc", "sess_" + "G" * 32, "x" * 37, 42, None, "sess_" + "0" * 33])
def test_malformed_session_ids_are_not_ids(bad: object) -> None:
    assert not is_session_id(bad)


async def test_mirror_failures_name_no_request_and_are_logged_once_per_outage() -> None:
    """The mirror's writer is nobody's request: its lines carry no trace id of the request that
    happened to start it, and an outage is one warning (with the count when it ends), not one per
    chunk (#29.7: 1,386 warnings, each with an unrelated request's trace id)."""
    from structlog.testing import capture_logs

    from proxy.observability.logging import add_request, bind_request
    from tests.proxy_server import free_port

    hub = SessionHub(ttl_s=60, max_bytes=1 << 20, redis_url=f"redis://127.0.0.1:{free_port()}/0")
    bind_request("trace-of-alice", "/v1/chat/completions")
    with capture_logs(processors=[add_request]) as logs:
        for _ in range(5):
            session = hub.create("anonymous", "m")
            session.append(delta_chunk(1, "data.rationale", "x", "x"))
            session.finish()
        await hub.aclose()  # drains the mirror queue: every write is tried (and fails)
    failures = [e for e in logs if e["event"] == "proxy.stream_mirror_failed"]
    assert len(failures) == 1, logs
    assert "trace_id" not in failures[0] and "route" not in failures[0]
