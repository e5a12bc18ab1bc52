"""``--redis-durable-replicas``: the outbox pops a write only once its master's replicas have it
(``WAIT`` on the writes' connection), against a real master and replica (tests/support/redis_pair.py)."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from typing import Any

import pytest
import redis.asyncio as aioredis
from structlog.testing import capture_logs

from proxy.cli import build_parser, resolve_serve_options, serve_settings
from proxy.settings import Settings
from proxy.state.outbox import MARK_PREFIX, MARK_TTL_S, SCRIPTS, SKIPPED, KeyWrite, RedisOutbox, StreamWrite
from proxy.state.redis_client import RedisOptions
from tests.support.polling import eventually, until
from tests.support.redis_pair import RedisPair, redis_pair
from tests.support.redis_server import redis_url

DELIVERY_S = 10.0


@pytest.fixture(scope="module")
def pair() -> Iterator[RedisPair]:
    with redis_pair() as started:
        yield started


def durable_outbox(url: str, shortfalls: list[int]) -> RedisOutbox:
    return RedisOutbox(RedisOptions(url), durable_replicas=1, on_short=shortfalls.append)


@asynccontextmanager
async def three_held(pair: RedisPair) -> AsyncIterator[tuple[str, RedisOutbox, list[int], Any]]:
    """A durable outbox given three stream records with the replica paused: (the stream, the
    outbox, its shortfalls, a client of the master); the replica resumed after."""
    stream = f"test:durable:{uuid.uuid4().hex}"
    shortfalls: list[int] = []
    outbox = durable_outbox(pair.url, shortfalls)
    master: Any = aioredis.Redis(port=pair.master.port, decode_responses=True)
    outbox.start()
    pair.replica.pause()
    try:
        for n in range(3):
            assert outbox.put(StreamWrite(stream, {"n": str(n)}, 1000))
        yield stream, outbox, shortfalls, master
    finally:
        pair.replica.resume()
        await outbox.aclose()
        await master.aclose()


async def test_writes_stay_queued_while_the_replica_lags_and_land_once_when_it_acks(pair: RedisPair) -> None:
    replica: Any = aioredis.Redis(port=pair.replica.port, decode_responses=True)
    try:
        async with three_held(pair) as (stream, outbox, shortfalls, master):
            await until(lambda: len(shortfalls) >= 2, "a batch and its resend fell short", timeout=DELIVERY_S)
            assert len(outbox) == 3 and outbox.up  # the master has them, its replica not: kept
            assert await master.xlen(stream) == 3 and set(shortfalls) == {0}
            pair.replica.resume()
            await until(lambda: len(outbox) == 0, "the outbox popped the writes", timeout=DELIVERY_S)
            entries = await replica.xrange(stream)  # popped only once the replica acknowledged them
            assert [fields["n"] for _, fields in entries] == ["0", "1", "2"]  # once each, despite resends
    finally:
        await replica.aclose()


async def test_a_context_write_waits_for_its_master_only(pair: RedisPair) -> None:
    """Read-your-writes needs the master: a request does not wait for a lagging replica."""
    key = f"test:durable:{uuid.uuid4().hex}"
    shortfalls: list[int] = []
    outbox = durable_outbox(pair.url, shortfalls)
    outbox.start()
    pair.replica.pause()
    try:
        future = outbox.put_key(KeyWrite(key, "v", 60))
        assert future is not None
        assert await future is True
        assert len(outbox) == 1  # still kept for the replica
        pair.replica.resume()
        await until(lambda: len(outbox) == 0, "the outbox popped the write", timeout=DELIVERY_S)
    finally:
        pair.replica.resume()
        await outbox.aclose()


async def test_without_a_replica_writes_reach_the_master_and_stay_queued_said_once() -> None:
    """N=1 against a Redis with no replica: the writes are applied, kept (not lost if a replica
    appears and the master dies later), one warning for the episode, a shortfall per batch."""
    stream = f"test:durable:{uuid.uuid4().hex}"
    url = redis_url(15)
    shortfalls: list[int] = []
    outbox = durable_outbox(url, shortfalls)
    reader: Any = aioredis.Redis.from_url(url, decode_responses=True)
    with capture_logs() as logs:
        outbox.start()
        try:
            assert outbox.put(StreamWrite(stream, {"n": "0"}, 1000))
            await until(lambda: len(shortfalls) >= 2, "two batches fell short", timeout=DELIVERY_S)
            assert await reader.xlen(stream) == 1 and len(outbox) == 1 and outbox.up
        finally:
            await outbox.aclose(timeout=0)
            await reader.aclose()
    behind = [entry for entry in logs if entry["event"] == "proxy.outbox_replicas_behind"]
    assert len(behind) == 1 and behind[0]["wanted"] == 1 and behind[0]["acked"] == 0


async def test_zero_replicas_pops_on_the_masters_answer(pair: RedisPair) -> None:
    """The default: no WAIT, a lagging replica does not hold anything."""
    stream = f"test:durable:{uuid.uuid4().hex}"
    outbox = RedisOutbox(RedisOptions(pair.url))
    outbox.start()
    pair.replica.pause()
    try:
        assert outbox.put(StreamWrite(stream, {"n": "0"}, 1000))
        await until(lambda: len(outbox) == 0, "the outbox popped the write", timeout=DELIVERY_S)
    finally:
        pair.replica.resume()
        await outbox.aclose()


def settings_of(*flags: str) -> Settings:
    args = build_parser().parse_args(["serve", "--policy", "p.yaml", *flags])
    args.modules = []
    resolve_serve_options(args)
    return serve_settings(args)


def test_the_replica_count_is_a_flag_or_a_variable_default_zero(monkeypatch: pytest.MonkeyPatch) -> None:
    assert settings_of().redis_durable_replicas == 0
    assert settings_of("--redis-durable-replicas", "2").redis_durable_replicas == 2
    monkeypatch.setenv("COGPROXY_REDIS_DURABLE_REPLICAS", "1")
    assert settings_of().redis_durable_replicas == 1
    assert settings_of("--redis-durable-replicas", "0").redis_durable_replicas == 0  # the flag wins
    with pytest.raises(ValueError, match="redis_durable_replicas must be >= 0"):
        settings_of("--redis-durable-replicas", "-1")


async def test_a_skipped_resend_still_replicates_so_its_wait_covers_the_original(pair: RedisPair) -> None:
    """The resend of a write the master has is skipped by the mark, yet moves the replication
    offset: a WAIT on the resending connection (perhaps another one) then covers the original."""
    master: Any = aioredis.Redis(port=pair.master.port, decode_responses=True)
    key, mark = f"test:durable:{uuid.uuid4().hex}", f"{MARK_PREFIX}{uuid.uuid4().hex}"
    call = (2, mark, key, 0, MARK_TTL_S, "v", 60)  # the "set" script: its mark and key, seq 0
    try:
        assert await master.eval(SCRIPTS["set"], *call) == 0
        before = (await master.info("replication"))["master_repl_offset"]
        assert await master.eval(SCRIPTS["set"], *call) == SKIPPED
        assert (await master.info("replication"))["master_repl_offset"] > before
    finally:
        await master.aclose()


async def test_held_records_a_restarted_master_lost_are_written_again(pair: RedisPair) -> None:
    """A master that comes back without what it had applied (a restart without persistence),
    before its replica confirmed: the held records are written to it again, each once. (Why the
    records behind a held batch wait instead of going to the master: docs/deployment.md.)"""
    async with three_held(pair) as (stream, outbox, shortfalls, master):
        await until(lambda: len(shortfalls) >= 1, "a batch fell short", timeout=DELIVERY_S)
        assert await master.xlen(stream) == 3
        marks = await master.keys(f"{MARK_PREFIX}*")
        await master.delete(stream, *marks)  # what a restart without persistence leaves
        await eventually(
            lambda: master.xlen(stream), "the records again", ready=lambda n: n == 3, timeout=DELIVERY_S
        )
        pair.replica.resume()
        await until(lambda: len(outbox) == 0, "the outbox popped the writes", timeout=DELIVERY_S)
        assert [fields["n"] for _, fields in await master.xrange(stream)] == ["0", "1", "2"]  # once each
