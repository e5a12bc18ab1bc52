"""The outbox's decisions, in process against the suite's private Redis: write ids that survive a
replay, a replay after a crash applying nothing twice (Redis's per-run mark), the
spool's offset and its rewrite on shutdown, refused writes, the backoff (an injected sleep)."""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import orjson
import pytest
import redis.asyncio as aioredis
from structlog.testing import capture_logs

from proxy.cli import main
from proxy.state.outbox import (
    MARK_PREFIX,
    MARK_TTL_S,
    HashWrite,
    KeyWrite,
    MarkDone,
    RedisOutbox,
    StreamWrite,
    Write,
)
from proxy.state.redis_client import RedisOptions
from proxy.state.spool import OFFSET_FILE, SPOOL_FILE, Spool, adopt_spools, spool_dir_of
from tests.redis_relay import RedisRelay
from tests.support.polling import until
from tests.support.redis_server import redis_url

POLICY = Path(__file__).resolve().parents[2] / "policies" / "default.yaml"
REDIS_URL = redis_url(15)
DB = int(REDIS_URL.rsplit("/", 1)[1])
UNREACHABLE = "redis://127.0.0.1:1/0"
"""Nothing listens on port 1."""
DELIVERY_S = 10.0


@pytest.fixture
async def redis_db() -> AsyncIterator[Any]:
    client: Any = aioredis.Redis.from_url(REDIS_URL, decode_responses=True)
    yield client
    await client.aclose()


@pytest.fixture
def stream() -> str:
    return f"test:outbox:{uuid.uuid4().hex}"


def entry(stream: str, n: int) -> StreamWrite:
    return StreamWrite(stream, {"n": str(n)}, 1000)


def spooled(directory: Path) -> list[dict[str, Any]]:
    return [orjson.loads(line) for line in (directory / SPOOL_FILE).read_bytes().splitlines()]


async def numbers(redis_db: Any, stream: str) -> list[str]:
    return [fields["n"] for _, fields in await redis_db.xrange(stream)]


async def delivered(outbox: RedisOutbox) -> None:
    await outbox.flush(DELIVERY_S)
    assert len(outbox) == 0


async def test_write_ids_follow_the_queue_and_survive_a_replay(
    tmp_path: Path, redis_db: Any, stream: str
) -> None:
    first = RedisOutbox(RedisOptions(UNREACHABLE), spool_dir=tmp_path)
    for n in range(3):
        first.put(entry(stream, n))
    await first.aclose()
    ids = [doc["id"] for doc in spooled(tmp_path)]
    run = ids[0].rsplit(":", 1)[0]
    assert ids == [f"{run}:0", f"{run}:1", f"{run}:2"] and len(run) == 32
    with capture_logs() as logs:
        second = RedisOutbox(RedisOptions(REDIS_URL), spool_dir=tmp_path)
    assert {"event": "proxy.outbox_replayed", "writes": 3} in [
        {k: v for k, v in log.items() if k in ("event", "writes")} for log in logs
    ]
    second.put(entry(stream, 3))
    second.start()
    await delivered(second)
    await second.aclose()
    entries = await redis_db.xrange(stream)
    assert [fields["outbox_id"] for _, fields in entries][:3] == ids
    newest = entries[3][1]["outbox_id"]
    assert newest.endswith(":0") and not newest.startswith(run)  # a run of its own
    assert 0 < await redis_db.ttl(MARK_PREFIX + run) <= MARK_TTL_S
    assert await redis_db.get(MARK_PREFIX + run) == "2"
    assert spooled(tmp_path) == []
    assert {(tmp_path / name).stat().st_mode & 0o777 for name in (SPOOL_FILE, OFFSET_FILE)} == {0o600}


async def test_a_replay_of_writes_redis_already_has_applies_none_of_them(
    tmp_path: Path, redis_db: Any, stream: str
) -> None:
    """A crash after Redis applied the writes and before the spool recorded it: 250 writes (more
    than the 200 newest stream entries the previous version looked at) come back, none twice."""
    outbox = RedisOutbox(RedisOptions(REDIS_URL), spool_dir=tmp_path)
    for n in range(250):
        outbox.put(entry(stream, n))
    before_delivery = (tmp_path / SPOOL_FILE).read_bytes()
    outbox.start()
    await delivered(outbox)
    await outbox.aclose()
    (tmp_path / SPOOL_FILE).write_bytes(before_delivery)
    (tmp_path / OFFSET_FILE).unlink()
    replayed = RedisOutbox(RedisOptions(REDIS_URL), spool_dir=tmp_path)
    assert len(replayed) == 250
    replayed.put(entry(stream, 250))
    replayed.start()
    await delivered(replayed)
    await replayed.aclose()
    assert await numbers(redis_db, stream) == [str(n) for n in range(251)]
    assert (tmp_path / SPOOL_FILE).read_bytes() == b""


async def test_a_replay_starts_after_the_last_delivered_write(tmp_path: Path, stream: str) -> None:
    spool = Spool(tmp_path)
    lines = [
        orjson.dumps({"stream": stream, "fields": {"n": str(n)}, "maxlen": 10, "id": f"r:{n}"})
        for n in range(4)
    ]
    for line in lines:
        spool.append(line)
    assert spool.pending() == lines  # no offset yet
    spool.delivered("r:1")
    assert spool.pending() == lines[2:]
    spool.delivered("r:3")
    assert spool.pending() == []
    spool.delivered("r:9")  # not in the file (rewritten since): everything is replayed
    assert spool.pending() == lines
    spool.close(lines[3:])
    assert (tmp_path / SPOOL_FILE).read_bytes() == lines[3] + b"\n"
    (tmp_path / OFFSET_FILE).write_bytes(b"\xff\xfe torn")
    reopened = Spool(tmp_path)
    assert reopened.pending() == lines[3:]
    reopened.close(lines[3:])


async def test_a_torn_last_append_never_swallows_the_next_write(tmp_path: Path) -> None:
    (tmp_path / SPOOL_FILE).write_bytes(
        b'{"stream":"s","fields":{},"maxlen":1,"id":"r:0"}\n{"stream":"s","fi'
    )
    killed = Spool(tmp_path)
    killed.append(b'{"stream":"s","fields":{},"maxlen":1,"id":"r:1"}')
    killed.close((tmp_path / SPOOL_FILE).read_bytes().splitlines())  # the same bytes; its lock freed
    with capture_logs() as logs:
        outbox = RedisOutbox(RedisOptions(UNREACHABLE), spool_dir=tmp_path)
    assert len(outbox) == 2
    await outbox.aclose()
    assert [log["event"] for log in logs].count("proxy.outbox_spool_line_skipped") == 1


async def test_shutdown_leaves_only_the_undelivered_writes_in_the_spool(
    tmp_path: Path, relay: RedisRelay, redis_db: Any, stream: str
) -> None:
    outbox = RedisOutbox(RedisOptions(relay.url(DB)), spool_dir=tmp_path)
    outbox.start()
    for n in range(3):
        outbox.put(entry(stream, n))
    await delivered(outbox)
    relay.cut()
    for n in range(3, 5):
        outbox.put(entry(stream, n))
    await outbox.aclose(timeout=0.5)
    assert [doc["fields"]["n"] for doc in spooled(tmp_path)] == ["3", "4"]
    assert await numbers(redis_db, stream) == ["0", "1", "2"]


async def test_a_refused_write_is_dropped_and_the_rest_of_its_batch_delivered(
    redis_db: Any, stream: str
) -> None:
    not_a_stream = f"{stream}:string"
    await redis_db.set(not_a_stream, "x")
    dropped: list[Write] = []
    outbox = RedisOutbox(RedisOptions(REDIS_URL), on_drop=dropped.append)
    outbox.put(entry(stream, 0))
    refused = entry(not_a_stream, 1)
    outbox.put(refused)
    key = f"{stream}:key"
    stored = outbox.put_key(KeyWrite(key, "v", 60))
    outbox.put(entry(stream, 2))
    with capture_logs() as logs:
        outbox.start()
        assert stored is not None and await stored is True
        await delivered(outbox)
    await outbox.aclose()
    assert await numbers(redis_db, stream) == ["0", "2"]
    assert [(w.stream, w.fields) for w in dropped if isinstance(w, StreamWrite)] == [
        (not_a_stream, {"n": "1"})
    ]
    assert len(dropped) == 1
    assert [log["target"] for log in logs if log["event"] == "proxy.outbox_write_refused"] == [not_a_stream]
    assert await redis_db.get(key) == "v" and 0 < await redis_db.ttl(key) <= 60
    await redis_db.delete(not_a_stream, key)


async def test_a_refused_key_write_settles_its_waiter_false(redis_db: Any, stream: str) -> None:
    owner = f"owner-{uuid.uuid4().hex}"
    await redis_db.set(f"cogproxy:ctxquota:{{{owner}}}:sizes", "not a hash")
    outbox = RedisOutbox(RedisOptions(REDIS_URL))
    outbox.start()
    refused = outbox.put_key(KeyWrite(f"{stream}:k", "v", None, owner=owner, max_entries=5, max_bytes=100))
    assert refused is not None and await refused is False
    await outbox.aclose()


async def test_every_kind_of_write_lands_as_its_command(redis_db: Any, stream: str) -> None:
    evicted: list[int] = []
    outbox = RedisOutbox(RedisOptions(REDIS_URL), on_evict=evicted.append)
    outbox.start()
    owner = f"owner-{uuid.uuid4().hex}"
    outbox.put(KeyWrite(f"{stream}:forever", "a", None))
    outbox.put(HashWrite(f"{stream}:hash", "alice", "record", int(time.time() * 1000) + 30_000))
    for n in range(3):
        outbox.put(KeyWrite(f"{stream}:q{n}", "xx", 60, owner=owner, max_entries=2, max_bytes=1000))
    await redis_db.zadd(f"{stream}:marks", {"done": 5000, "dead": 1000, "alive": 9000})
    outbox.put(MarkDone(f"{stream}:marks", "done", 2000))  # its mark, and the marks dead by then
    await delivered(outbox)
    await outbox.aclose()
    assert await redis_db.zrange(f"{stream}:marks", 0, -1) == ["alive"]
    assert await redis_db.get(f"{stream}:forever") == "a" and await redis_db.ttl(f"{stream}:forever") == -1
    assert await redis_db.hgetall(f"{stream}:hash") == {"alice": "record"}
    assert 29_000 < await redis_db.pttl(f"{stream}:hash") <= 30_000
    assert evicted == [1]  # the owner's oldest key, past max_entries
    assert await redis_db.exists(f"{stream}:q0") == 0 and await redis_db.get(f"{stream}:q2") == "xx"


async def test_scripts_flushed_from_redis_are_loaded_again(redis_db: Any, stream: str) -> None:
    outbox = RedisOutbox(RedisOptions(REDIS_URL))
    outbox.start()
    outbox.put(entry(stream, 0))
    await delivered(outbox)
    await redis_db.script_flush()
    outbox.put(entry(stream, 1))
    await delivered(outbox)
    await outbox.aclose()
    assert await numbers(redis_db, stream) == ["0", "1"]


async def test_a_replay_past_the_bound_drops_and_counts_the_rest(tmp_path: Path, stream: str) -> None:
    spool = Spool(tmp_path)
    for n in range(5):
        spool.append(orjson.dumps({"stream": stream, "fields": {"n": str(n)}, "maxlen": 10, "id": f"r:{n}"}))
    spool.close([orjson.dumps({"key": "k", "value": "v", "ttl": None, "id": f"r:{n}"}) for n in range(5)])
    dropped: list[Write] = []
    outbox = RedisOutbox(RedisOptions(UNREACHABLE), spool_dir=tmp_path, bound=3, on_drop=dropped.append)
    assert len(outbox) == 3 and [w.id for w in dropped] == ["r:3", "r:4"]
    assert all(isinstance(w, KeyWrite) and w.ttl is None for w in dropped)
    with capture_logs() as logs:
        await outbox.aclose()
    assert len(spooled(tmp_path)) == 3
    assert not [log for log in logs if log["event"] == "proxy.outbox_lost_on_shutdown"]


async def test_a_spool_of_the_previous_version_is_delivered(
    tmp_path: Path, redis_db: Any, stream: str
) -> None:
    """Its ids are bare uuids (no run and sequence number): each is a run of its own."""
    legacy = [
        {"stream": stream, "fields": {"n": str(n)}, "maxlen": 10, "id": uuid.uuid4().hex} for n in range(2)
    ]
    legacy.append({"key": f"{stream}:k", "value": "v", "ttl": 30, "id": uuid.uuid4().hex})
    (tmp_path / SPOOL_FILE).write_bytes(b"".join(orjson.dumps(doc) + b"\n" for doc in legacy))
    outbox = RedisOutbox(RedisOptions(REDIS_URL), spool_dir=tmp_path)
    outbox.start()
    await delivered(outbox)
    await outbox.aclose()
    assert [fields["outbox_id"] for _, fields in await redis_db.xrange(stream)] == [
        legacy[0]["id"],
        legacy[1]["id"],
    ]
    assert await redis_db.get(f"{stream}:k") == "v" and 0 < await redis_db.ttl(f"{stream}:k") <= 30


async def test_without_a_spool_what_is_left_at_shutdown_is_logged_as_lost(stream: str) -> None:
    outbox = RedisOutbox(RedisOptions(UNREACHABLE).with_timeout("outbox", 0.1))
    outbox.start()
    outbox.put(entry(stream, 0))
    with capture_logs() as logs:
        await outbox.aclose(timeout=0.2)
    assert [log.get("writes") for log in logs if log["event"] == "proxy.outbox_lost_on_shutdown"] == [1]


def test_adopting_a_spool_takes_only_its_undelivered_writes(tmp_path: Path) -> None:
    gone = Spool(tmp_path / "worker-2")
    lines = [orjson.dumps({"key": "k", "value": str(n), "ttl": None, "id": f"w:{n}"}) for n in range(3)]
    for line in lines:
        gone.append(line)
    gone.delivered("w:0")
    gone.close(lines)  # as a killed worker left it: the offset names w:0
    (tmp_path / SPOOL_FILE).write_bytes(b'{"torn')
    adopt_spools(tmp_path, workers=2)
    assert (tmp_path / SPOOL_FILE).read_bytes() == b'{"torn\n' + lines[1] + b"\n" + lines[2] + b"\n"
    assert not (tmp_path / "worker-2").exists()


async def test_every_kind_of_write_comes_back_from_the_spool_as_it_went_in(tmp_path: Path) -> None:
    first = RedisOutbox(RedisOptions(UNREACHABLE), spool_dir=tmp_path)
    first.put(StreamWrite("s", {"a": "1", "b": "2"}, 7))
    first.put(KeyWrite("k", "v", None))
    first.put(KeyWrite("k2", "v2", 30, owner="o", max_entries=3, max_bytes=99))
    first.put(HashWrite("h", "alice", "record", 1234))
    first.put(MarkDone("m", "call-1", 5678))
    await first.aclose()
    written = (tmp_path / SPOOL_FILE).read_bytes()
    second = RedisOutbox(RedisOptions(UNREACHABLE), spool_dir=tmp_path)  # parses every line, writes them back
    await second.aclose()
    assert (tmp_path / SPOOL_FILE).read_bytes() == written
    assert [sorted(doc) for doc in spooled(tmp_path)] == [
        ["fields", "id", "maxlen", "stream"],
        ["id", "key", "max_bytes", "max_entries", "owner", "ttl", "value"],
        ["id", "key", "max_bytes", "max_entries", "owner", "ttl", "value"],
        ["expires_at_ms", "field", "id", "key", "value"],
        ["id", "key", "member", "now_ms"],
    ]
    assert spooled(tmp_path)[2] | {"id": ""} == {
        "key": "k2",
        "value": "v2",
        "ttl": 30,
        "id": "",
        "owner": "o",
        "max_entries": 3,
        "max_bytes": 99,
    }


def test_each_worker_has_a_spool_directory_of_its_own(tmp_path: Path) -> None:
    assert [spool_dir_of(tmp_path, slot) for slot in (None, 0, 2)] == [
        tmp_path,
        tmp_path,
        tmp_path / "worker-2",
    ]


@pytest.mark.parametrize(
    "wrong",
    [
        {"stream": "s", "fields": {"n": {"nested": 1}}, "maxlen": 10, "id": "r:0"},
        {"stream": "s", "fields": ["n", "1"], "maxlen": 10, "id": "r:0"},
        {"stream": ["s"], "fields": {"n": "1"}, "maxlen": 10, "id": "r:0"},
        {"key": "k", "value": "v", "ttl": None, "id": 5},
        {"key": "k", "field": "f", "value": "v", "ttl_ms": 10, "id": None},
        {"key": "k", "value": {"a": 1}, "ttl": None, "id": "r:0"},
    ],
    ids=[
        "nested field value",
        "fields a list",
        "stream a list",
        "id a number",
        "id null",
        "value an object",
    ],
)
async def test_a_spool_line_of_the_wrong_shape_is_skipped_and_the_rest_delivered(
    tmp_path: Path, redis_db: Any, stream: str, wrong: dict[str, Any]
) -> None:
    """Adversarial pass #29: valid JSON of the wrong shape (an edited or corrupted spool) was
    queued, then either killed the delivery task (an id that is not a string) or failed its batch
    forever (a value Redis cannot take): nothing behind it was ever delivered."""
    good = {"stream": stream, "fields": {"n": "1"}, "maxlen": 10, "id": f"{uuid.uuid4().hex}:1"}
    (tmp_path / SPOOL_FILE).write_bytes(orjson.dumps(wrong) + b"\n" + orjson.dumps(good) + b"\n")
    with capture_logs() as logs:
        outbox = RedisOutbox(RedisOptions(REDIS_URL), spool_dir=tmp_path)
    assert len(outbox) == 1
    outbox.start()
    await delivered(outbox)
    await outbox.aclose()
    assert await numbers(redis_db, stream) == ["1"]
    assert [log["event"] for log in logs].count("proxy.outbox_spool_line_skipped") == 1


async def test_a_hash_write_spooled_by_the_previous_version_expires_its_ttl_after_delivery(
    tmp_path: Path, redis_db: Any, stream: str
) -> None:
    """The previous version's spool holds a TTL (``ttl_ms``) rather than an expiry: replayed, it
    keeps that meaning."""
    old = {
        "key": f"{stream}:h",
        "field": "alice",
        "value": "v",
        "ttl_ms": 30_000,
        "id": f"{uuid.uuid4().hex}:0",
    }
    (tmp_path / SPOOL_FILE).write_bytes(orjson.dumps(old) + b"\n")
    outbox = RedisOutbox(RedisOptions(REDIS_URL), spool_dir=tmp_path)
    outbox.start()
    await delivered(outbox)
    await outbox.aclose()
    assert await redis_db.hgetall(f"{stream}:h") == {"alice": "v"}
    assert 29_000 < await redis_db.pttl(f"{stream}:h") <= 30_000
    await redis_db.delete(f"{stream}:h")


@pytest.mark.parametrize(
    "taken", ["", OFFSET_FILE, SPOOL_FILE], ids=["dir a file", "offset a dir", "spool a dir"]
)
def test_a_spool_dir_that_cannot_hold_a_spool_is_a_usage_error_naming_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], taken: str
) -> None:
    """Adversarial pass #29: the startup hook's OSError was reported as the listen socket's
    ("cannot listen on 127.0.0.1:0: file exists"), sending the operator to the wrong place."""
    spool = tmp_path / "spool"
    if taken:
        (spool / taken).mkdir(parents=True)
    else:
        spool.write_bytes(b"")
    args = [
        "serve",
        "--policy",
        str(POLICY),
        "--port",
        "0",
        "--redis-url",
        UNREACHABLE,
        "--spool-dir",
        str(spool),
    ]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert f"--spool-dir {spool}" in err and "cannot listen" not in err, err


async def test_a_second_process_on_a_spool_in_use_is_refused(tmp_path: Path) -> None:
    """Adversarial pass #29: two proxies given one --spool-dir each replayed the other's writes,
    and one's rewrite renamed a new file over the one the other appended to: its later appends
    were gone at its next start. The second is refused until the first has exited."""
    first = RedisOutbox(RedisOptions(UNREACHABLE), spool_dir=tmp_path)
    with pytest.raises(ValueError, match=f"--spool-dir {tmp_path}: another process is using this spool"):
        RedisOutbox(RedisOptions(UNREACHABLE), spool_dir=tmp_path)
    await first.aclose()
    second = RedisOutbox(RedisOptions(UNREACHABLE), spool_dir=tmp_path)
    await second.aclose()


async def test_client_text_with_line_breaks_stays_one_spool_line_and_comes_back_whole(tmp_path: Path) -> None:
    """Held in the #29 adversarial pass: a feedback note or review field carries client text; every
    line break a reader might split on is escaped or not one to ``bytes.splitlines``, so a client
    cannot add a spool line."""
    note = 'ok\n{"key":"cogproxy:x","value":"forged","ttl":null,"id":"z:0"}\r\u2028\u0085\x1c\x0b\x0c'
    first = RedisOutbox(RedisOptions(UNREACHABLE), spool_dir=tmp_path)
    first.put(HashWrite("h", "alice", note, 1234))
    first.put(StreamWrite("s", {"note": note}, 7))
    await first.aclose()
    assert len((tmp_path / SPOOL_FILE).read_bytes().splitlines()) == 2
    second = RedisOutbox(RedisOptions(UNREACHABLE), spool_dir=tmp_path)
    assert len(second) == 2
    await second.aclose()
    assert [doc.get("value") or doc["fields"]["note"] for doc in spooled(tmp_path)] == [note, note]


async def test_every_write_behind_a_failed_batch_reports_its_first_failure_once(stream: str) -> None:
    """The review sink's failure counter hangs on this: a feedback record queued before a review
    record must not hide the review's failure (only the head of the queue was reported)."""
    failed: list[Write] = []
    outbox = RedisOutbox(RedisOptions(UNREACHABLE), on_first_failure=failed.append)
    record, review = HashWrite("test:feedback", "alice", "{}", 1000), entry(stream, 1)
    outbox.start()
    try:
        assert outbox.put(record) and outbox.put(review)
        await until(lambda: len(failed) >= 2, "both writes reported as failed", timeout=DELIVERY_S)
        later = entry(stream, 2)
        assert outbox.put(later)  # a later resend of the batch fails it too; the first two again not
        await until(lambda: len(failed) >= 3, "the later write reported as failed", timeout=DELIVERY_S)
    finally:
        await outbox.aclose(timeout=0.1)
    assert [replace(write, id="") for write in failed] == [record, review, later]  # ids set when queued
