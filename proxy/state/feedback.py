"""Module answers remembered for ``POST /v1/feedback``, and the verdicts they received.

* ``MemoryFeedbackStore``: bounded by ``feedback.max_entries`` and by time (``feedback.window_s``,
  read against an injected clock). Past the bound the client holding the most records loses its
  own oldest one, so no client's calls evict another's records (issue #26, same class as 8).
* ``RedisFeedbackStore``: the same memory LRU in front (this replica's answers are found without a
  round trip, and survive a Redis outage) plus one Redis hash per trace id,
  ``cogproxy:answers:<trace id>`` (a field per client identity), expiring with the window, so a
  verdict can reach any replica. Writes never wait: they go through the app's Redis outbox
  (``proxy.state.outbox``: kept while Redis is away, and in the spool with ``--spool-dir``).

A record is keyed by (client identity, trace id), never by the trace id alone: trace ids may be
chosen by the client (``X-Request-Id``), so two clients choosing the same one keep two records.
The identity (``proxy.clients``) is a name or a hash of the key, never the key.
"""

from __future__ import annotations

import math
import time
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import asdict, dataclass, fields, replace
from functools import partial
from typing import Any, Protocol

import orjson
import structlog
from redis.exceptions import RedisError

from proxy.clients import ANONYMOUS
from proxy.state.outbox import HashWrite, RedisOutbox
from proxy.state.redis_client import RedisOptions, redis_client

log = structlog.get_logger("proxy.feedback")

VERDICT_SCORES = {"correct": 1.0, "incorrect": 0.0, "partially_correct": 0.5}
"""The verdicts ``POST /v1/feedback`` takes, and each one's default score."""
KEY_PREFIX = "cogproxy:answers:"
LEGACY_PREFIX = "cogproxy:feedback:"
"""0.3's keys (one string per trace id, no client): still read by ``scan_records`` until they
expire with their window, never written."""
SCAN_COUNT = 1000
RECORD_MAX_BYTES = 2304
"""The most one remembered answer takes in the in-process store, judged with the longest note
(1,000 characters), source (64) and trace id (128) the API accepts, the indexes included
(tracemalloc: ~2.1 KiB; ~1 KiB unjudged). Module, model and client names are the registry's,
the policy's and the keys file's strings, shared, not copied. ``feedback.max_entries`` times
this is the store's bound in ``proxy.memory_budget``."""

REDIS_RECORD_BYTES = 360
"""The most a typical unjudged answer takes in Redis (``MEMORY USAGE`` of its key: a 32-hex trace
id, a hashed client key, ~40 characters of module, tier and target names); ~430 bytes of
``used_memory`` with the key's expiry. A verdict adds its own fields (a note up to 1,000)."""

SHADOW_SOURCE = "shadow"
"""The ``source`` of a verdict by the proxy's own judge (``feedback.shadow``); refused from clients."""

Clock = Callable[[], float]
RecordKey = tuple[str, str]
"""(client identity, trace id)."""


@dataclass(frozen=True, slots=True)
class AnswerRecord:
    """One module answer as feedback needs it, and its latest verdict."""

    trace_id: str
    module: str
    tier: str
    rung: str
    provider: str
    model: str
    confidence: float
    """Reported by the model."""
    calibrated: float
    """Through the target's calibration map: what was decided on."""
    risk: str
    decision: str
    min_confidence: float
    """The threshold the answer was decided against (its module's tier, overrides applied)."""
    at: float
    """Epoch seconds of the answer."""
    expires: float
    client: str = ANONYMOUS
    """The identity of the client that made the call (``proxy.clients``' rule)."""
    verdict: str | None = None
    score: float | None = None
    """Correctness in [0, 1]: the verdict's (1, 0, 0.5 for partially_correct) unless given."""
    source: str | None = None
    note: str | None = None
    verdicts: int = 0
    """How many verdicts it received (the latest replaces the others)."""
    path: str | None = ""
    """The rungs the call went through before the one that answered, oldest first, as the JSON
    ``[[target, reported confidence, risk], ...]`` (at most ``MAX_PATH``, the latest kept); ""
    when it answered on its first rung; None when not stored (a record of an older version)."""

    def dumps(self) -> bytes:
        """Every field, as 0.3 to 0.4 stored it in Redis (still read: ``from_redis``)."""
        return orjson.dumps(asdict(self))

    def packed(self) -> bytes:
        """What Redis keeps (``from_redis`` reads it back): a JSON array of the fields verdicts and
        calibration read, the verdict's only once given. The trace id and the client are the
        key and the field; the rung's name and the answer's time stay in this replica's memory;
        the risk is one letter (``RISK_CODES``, "" unknown) and the path its JSON (null: not
        stored); the confidences are cut to 4 decimals, never up, so every comparison with a
        threshold or a bin edge of at most 4 decimals comes out as before."""
        row: list[object] = [
            self.module,
            self.tier,
            f"{self.provider}/{self.model}",
            _cut(self.confidence),
            _cut(self.calibrated),
            self.decision,
            self.min_confidence,
            math.ceil(self.expires),
            RISK_CODES.get(self.risk, ""),
            None if self.path is None else orjson.Fragment(self.path or "[]"),
        ]
        if self.verdicts:
            row += [self.verdict, self.score, self.verdicts, self.source, self.note]
        return orjson.dumps(row)

    @property
    def key(self) -> RecordKey:
        return (self.client, self.trace_id)

    @classmethod
    def loads(cls, raw: bytes | str) -> AnswerRecord:
        """A record as ``dumps`` wrote it; fields of other versions (0.3's ``key_hash``) are left out."""
        doc = orjson.loads(raw)
        if not isinstance(doc, dict):
            raise TypeError("a record is a JSON object")
        return _whole(doc)


_FIELDS = frozenset(f.name for f in fields(AnswerRecord))
_PACKED = 10
"""Fields of an unjudged ``packed`` row; a judged one has 5 more."""
_PACKED_0_4 = 8
"""Fields of an unjudged row 0.4 packed (no risk, no path); a judged one has 5 more."""
MAX_PATH = 3
"""Earlier rungs a record keeps at most (the latest ones): bounded whatever the ladder."""
RISK_CODES = {"none": "n", "low": "l", "medium": "m", "high": "h"}
"""A risk as Redis keeps it: one letter."""
_RISKS = {code: risk for risk, code in RISK_CODES.items()}
PathStep = tuple[str, float, str]
"""One earlier rung's answer: target, reported confidence, risk."""


def pack_path(steps: Sequence[PathStep]) -> str:
    """``steps`` (oldest first) as ``AnswerRecord.path``: the latest ``MAX_PATH``, confidences cut
    to 4 decimals; "" for none."""
    kept = [[target, _cut(confidence), RISK_CODES.get(risk, "")] for target, confidence, risk in steps]
    return orjson.dumps(kept[-MAX_PATH:]).decode() if kept else ""


def path_steps(path: str | None) -> list[PathStep] | None:
    """``AnswerRecord.path`` back as steps (risk "" when unknown); None when not stored."""
    if path is None:
        return None
    return [
        (target, confidence, _RISKS.get(code, "")) for target, confidence, code in orjson.loads(path or "[]")
    ]


def _whole(doc: dict[str, Any]) -> AnswerRecord:
    """A record stored whole (0.3 to 0.4: no path, ``path`` None then)."""
    return checked(AnswerRecord(**{"path": None, **{k: v for k, v in doc.items() if k in _FIELDS}}))


def _cut(confidence: float) -> float:
    """``confidence`` to 4 decimals, rounded down."""
    near = round(confidence, 4)
    return near if near <= confidence else round(near - 1e-4, 4)


def checked(record: AnswerRecord) -> AnswerRecord:
    """``record`` if it is one this proxy could have written: names are strings, confidences and
    the threshold finite numbers in [0, 1], a verdict one of ``VERDICT_SCORES`` with a score in
    [0, 1] (and no score without one). ValueError or TypeError otherwise: a record read from Redis
    is data another version, a hand edit or a partial restore may have left, and one NaN or a
    missing score would otherwise crash or poison every figure computed from the rest."""
    names = (record.trace_id, record.module, record.tier, record.rung, record.provider, record.model)
    if not all(isinstance(name, str) for name in (*names, record.risk, record.decision, record.client)):
        raise TypeError("a record's names are strings")
    for name, value, bounded in (
        ("confidence", record.confidence, True),
        ("calibrated", record.calibrated, True),
        ("min_confidence", record.min_confidence, True),
        ("at", record.at, False),
        ("expires", record.expires, False),
    ):
        _number(name, value, bounded)
    if record.verdict is None:
        if record.score is not None:
            raise ValueError("a score without a verdict")
    elif record.verdict not in VERDICT_SCORES:
        raise ValueError("not a verdict")
    else:
        _number("score", record.score, bounded=True)
    if isinstance(record.verdicts, bool) or not isinstance(record.verdicts, int) or record.verdicts < 0:
        raise TypeError("verdicts is a count")
    if not all(text is None or isinstance(text, str) for text in (record.source, record.note)):
        raise TypeError("source and note are strings")
    _check_path(record.path)
    return record


def _check_path(path: object) -> None:
    """A stored path: None, or the JSON of at most ``MAX_PATH`` [target, confidence, risk code]."""
    if path is None:
        return
    if not isinstance(path, str):
        raise TypeError("a path is JSON text")
    steps = orjson.loads(path or "[]")
    if not isinstance(steps, list) or len(steps) > MAX_PATH:
        raise ValueError("a path is a list of at most MAX_PATH steps")
    for step in steps:
        if not isinstance(step, list) or len(step) != 3:
            raise TypeError("a path step is [target, confidence, risk]")
        target, confidence, code = step
        if not isinstance(target, str) or not isinstance(code, str):
            raise TypeError("a path step's target and risk are strings")
        _number("a path step's confidence", confidence, bounded=True)


def _number(name: str, value: object, bounded: bool) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name} is a number")
    if not math.isfinite(value) or (bounded and not 0 <= value <= 1):
        raise ValueError(f"{name} out of range")


def _real(value: object) -> float:
    """A packed number as a float; TypeError for anything else (a string "NaN" included)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError("a packed number")
    return float(value)


def from_redis(raw: bytes | str, client: str, trace_id: str) -> AnswerRecord:
    """The record stored as ``raw`` in the field ``client`` of ``trace_id``'s hash: ``packed``, or
    the whole record of an older version (kept the window through: they expire with it).
    ValueError or TypeError for anything else, a row that is not a sane record included
    (``checked``)."""
    row = orjson.loads(raw)
    if isinstance(row, dict):
        return _whole(row)
    if not isinstance(row, list) or len(row) not in (_PACKED, _PACKED + 5, _PACKED_0_4, _PACKED_0_4 + 5):
        raise TypeError("a packed record is an array of 8, 10, 13 or 15 fields")
    module, tier, target, confidence, calibrated, decision, min_confidence, expires = row[:_PACKED_0_4]
    if not isinstance(target, str):
        raise TypeError("a packed target is provider/model")
    provider, _, model = target.partition("/")
    risk: object = ""
    path: object = None  # 0.4's rows: neither stored
    if len(row) in (_PACKED, _PACKED + 5):
        code, steps = row[_PACKED_0_4:_PACKED]
        risk = _RISKS.get(code, "") if isinstance(code, str) else code
        path = None if steps is None else (orjson.dumps(steps).decode() if steps else "")
    width = _PACKED if len(row) in (_PACKED, _PACKED + 5) else _PACKED_0_4
    verdict, score, verdicts, source, note = row[width:] or (None, None, 0, None, None)
    return checked(
        AnswerRecord(
            trace_id=trace_id,
            module=module,
            tier=tier,
            rung="",
            provider=provider,
            model=model,
            confidence=_real(confidence),
            calibrated=_real(calibrated),
            risk=risk,  # type: ignore[arg-type]  # checked() below
            decision=decision,
            min_confidence=_real(min_confidence),
            at=0.0,
            expires=_real(expires),
            client=client,
            verdict=verdict,
            score=None if score is None else _real(score),
            source=source,
            note=note,
            verdicts=verdicts,
            path=path,  # type: ignore[arg-type]  # checked() below
        )
    )


class FeedbackStore(Protocol):
    def remember(self, record: AnswerRecord, max_entries: int, max_per_day: int = 0) -> None:
        """Keep ``record`` until ``record.expires`` (never waits, never raises); ``max_per_day``
        (0: no cap) bounds the records one replica shares in a UTC day."""
        ...

    async def get(self, client: str, trace_id: str) -> AnswerRecord | None:
        """The record of ``client``'s answer ``trace_id``; None when unknown or expired."""
        ...

    async def find(self, trace_id: str) -> list[AnswerRecord]:
        """Every client's record of ``trace_id`` (for an admin key's verdict)."""
        ...

    async def judged(self, record: AnswerRecord) -> None:
        """Store ``record`` (with its new verdict) in place of the old one, same expiry."""
        ...

    async def aclose(self) -> None: ...


class MemoryFeedbackStore:
    """Bounded LRU in process; expiry read against ``clock`` (epoch seconds)."""

    def __init__(self, clock: Clock = time.time) -> None:
        self._clock = clock
        self._records: OrderedDict[RecordKey, AnswerRecord] = OrderedDict()
        self._clients: dict[str, set[str]] = {}
        """trace id -> the clients with a record of it (an admin's verdict names no client)."""
        self._owned: dict[str, OrderedDict[str, None]] = {}
        """client -> its trace ids, oldest first: past the bound, the client holding the most
        records loses its own oldest, so one client's calls never evict another's records."""
        self._unshared: set[RecordKey] = set()
        """Records a ``RedisFeedbackStore`` kept here only (past ``feedback.max_per_day``): their
        verdicts stay here too, or judging would carry every capped answer into Redis."""

    def __len__(self) -> int:
        return len(self._records)

    def remember(
        self, record: AnswerRecord, max_entries: int, max_per_day: int = 0, *, shared: bool = True
    ) -> None:
        records = self._records
        key = record.key
        records[key] = record
        records.move_to_end(key)
        if shared:
            self._unshared.discard(key)
        else:
            self._unshared.add(key)
        self._clients.setdefault(record.trace_id, set()).add(record.client)
        owned = self._owned.setdefault(record.client, OrderedDict())
        owned[record.trace_id] = None
        owned.move_to_end(record.trace_id)
        while len(records) > max_entries:
            # Clients are the keys file's (proxy.clients): few, so a scan of their counts is cheap.
            largest = max(self._owned, key=lambda c: (len(self._owned[c]), c == record.client))
            self._forget((largest, next(iter(self._owned[largest]))))

    def _forget(self, key: RecordKey) -> None:
        del self._records[key]
        self._unshared.discard(key)
        client, trace_id = key
        owned = self._owned[client]
        del owned[trace_id]
        if not owned:
            del self._owned[client]
        clients = self._clients[trace_id]
        clients.discard(client)
        if not clients:
            del self._clients[trace_id]

    async def get(self, client: str, trace_id: str) -> AnswerRecord | None:
        return self.peek(client, trace_id)

    def peek(self, client: str, trace_id: str) -> AnswerRecord | None:
        record = self._records.get((client, trace_id))
        if record is not None and record.expires <= self._clock():
            self._forget(record.key)
            return None
        return record

    async def find(self, trace_id: str) -> list[AnswerRecord]:
        return self.peek_all(trace_id)

    def peek_all(self, trace_id: str) -> list[AnswerRecord]:
        found = (self.peek(client, trace_id) for client in sorted(self._clients.get(trace_id, ())))
        return [record for record in found if record is not None]

    async def judged(self, record: AnswerRecord) -> None:
        if record.key in self._records:
            self._records[record.key] = record

    def unshared(self, key: RecordKey) -> bool:
        """The record of ``key`` is held here and was kept here only (``remember(shared=False)``)."""
        return key in self._unshared and self.peek(*key) is not None

    def records(self) -> list[AnswerRecord]:
        now = self._clock()
        return [r for r in self._records.values() if r.expires > now]

    async def aclose(self) -> None:
        return None


class DailyCount:
    """Records this replica shared in the current UTC day (by ``clock``)."""

    def __init__(self, clock: Clock) -> None:
        self._clock = clock
        self.day = -1
        self._count = 0
        self._capped = False

    def _roll(self) -> None:
        day = int(self._clock() // 86_400)
        if day != self.day:
            self.day, self._count, self._capped = day, 0, False

    @property
    def count(self) -> int:
        self._roll()
        return self._count

    def add(self) -> None:
        self._roll()
        self._count += 1

    def first_capped(self) -> bool:
        """True the first time today the cap is reached."""
        first, self._capped = not self._capped, True
        return first


class RedisFeedbackStore:
    """The memory LRU in front of Redis keys that expire with the window."""

    def __init__(
        self,
        options: RedisOptions,
        outbox: RedisOutbox,
        clock: Clock = time.time,
        on_capped: Callable[[], None] = lambda: None,
    ) -> None:
        self._redis: Any = redis_client(options, "feedback")
        self._outbox = outbox
        self._clock = clock
        self._local = MemoryFeedbackStore(clock)
        self._today = DailyCount(clock)
        self._on_capped = on_capped

    def remember(self, record: AnswerRecord, max_entries: int, max_per_day: int = 0) -> None:
        capped = bool(max_per_day) and self._today.count >= max_per_day
        self._local.remember(record, max_entries, shared=not capped)
        if capped:
            self._capped(max_per_day)
            return
        self._today.add()
        self._write(record)

    def _capped(self, max_per_day: int) -> None:
        """Past the day's cap: kept in this replica's memory only, counted, logged once a day."""
        self._on_capped()
        if self._today.first_capped():
            log.warning("proxy.feedback_daily_cap_reached", max_per_day=max_per_day, day=self._today.day)

    def _write(self, record: AnswerRecord) -> None:
        """Queue ``record`` in the outbox, its key expiring at the record's ``expires`` (a hash
        holds every client's record of a trace id: it goes with the latest written, and readers
        check each record's own); an expired one is not written."""
        if record.expires > self._clock():
            expires_at_ms = int(record.expires * 1000)
            self._outbox.put(
                HashWrite(
                    KEY_PREFIX + record.trace_id, record.client, record.packed().decode(), expires_at_ms
                )
            )

    async def get(self, client: str, trace_id: str) -> AnswerRecord | None:
        record = self._local.peek(client, trace_id)
        if record is not None:
            return record
        try:
            raw = await self._redis.hget(KEY_PREFIX + trace_id, client)
        except (RedisError, OSError) as exc:
            log.warning("proxy.redis_unavailable", error=str(exc), store="feedback")
            return None
        return None if raw is None else self._valid(raw, client, trace_id)

    async def find(self, trace_id: str) -> list[AnswerRecord]:
        found = {record.client: record for record in self._local.peek_all(trace_id)}
        try:
            shared = await self._redis.hgetall(KEY_PREFIX + trace_id)
        except (RedisError, OSError) as exc:
            log.warning("proxy.redis_unavailable", error=str(exc), store="feedback")
            shared = {}
        for client, raw in shared.items():
            try:
                name = _text(client)
            except UnicodeDecodeError:  # no client name this proxy writes: not a record
                continue
            record = self._valid(raw, name, trace_id)
            if record is not None:
                found.setdefault(name, record)
        return [found[name] for name in sorted(found)]

    def _valid(self, raw: bytes, client: str, trace_id: str) -> AnswerRecord | None:
        """The stored record if it is readable, unexpired, and the one asked for."""
        try:
            record = from_redis(raw, client, trace_id)
        except (ValueError, TypeError):  # written by another version: not judgeable here
            return None
        if record.key != (client, trace_id) or record.expires <= self._clock():
            return None
        return record

    async def judged(self, record: AnswerRecord) -> None:
        """The verdict replaces the record where it is: here only for an answer kept here only
        (past the day's cap), else here (if held) and in Redis."""
        unshared = self._local.unshared(record.key)
        await self._local.judged(record)
        if not unshared:
            self._write(record)

    async def aclose(self) -> None:
        """Close its reads; its writes are the outbox's (closed by the app after this store)."""
        await self._redis.aclose()


async def scan_records(
    options: RedisOptions, clock: Clock = time.time, on_skipped: Callable[[str], None] | None = None
) -> AsyncIterator[AnswerRecord]:
    """Every record in the Redis ``options`` name still in its window (for ``cogproxy
    calibration``), 0.3's ``cogproxy:feedback:<trace id>`` strings included. A stored value that is
    not a sane record (``checked``) is left out and its key given to ``on_skipped`` (default: a
    ``proxy.feedback_record_skipped`` log line)."""
    skipped = on_skipped or _log_skipped
    client: Any = redis_client(options, "scan")
    try:
        async for key in client.scan_iter(match=KEY_PREFIX + "*", count=SCAN_COUNT, _type="hash"):
            for name, raw in (await client.hgetall(key)).items():
                record = _loaded(partial(_from_hash, key, name, raw), _shown(key), skipped)
                if record is not None and record.expires > clock():
                    yield record
        async for key in client.scan_iter(match=LEGACY_PREFIX + "*", count=SCAN_COUNT, _type="string"):
            raw = await client.get(key)
            record = None if raw is None else _loaded(partial(AnswerRecord.loads, raw), _shown(key), skipped)
            if record is not None and record.expires > clock():
                yield record
    finally:
        await client.aclose()


def _text(name: bytes | str) -> str:
    """A key or field name as text; UnicodeDecodeError (a ValueError) when it is not UTF-8."""
    return name.decode() if isinstance(name, bytes) else name


def _shown(name: bytes | str) -> str:
    """A key as a log line names it, whatever its bytes."""
    return name.decode(errors="backslashreplace") if isinstance(name, bytes) else name


def _from_hash(key: bytes | str, name: bytes | str, raw: bytes | str) -> AnswerRecord:
    """``from_redis`` of the field ``name`` of the hash ``key``: a key or field name that is not
    UTF-8 (no name this proxy writes) raises like any other row that is not a record."""
    return from_redis(raw, _text(name), _text(key).removeprefix(KEY_PREFIX))


def _log_skipped(key: str) -> None:
    log.warning("proxy.feedback_record_skipped", key=key)


def _loaded(
    load: Callable[[], AnswerRecord], key: str, skipped: Callable[[str], None]
) -> AnswerRecord | None:
    try:
        return load()
    except (ValueError, TypeError):  # another version's, or damaged: not a record to count
        skipped(key)
        return None


def with_verdict(
    record: AnswerRecord, verdict: str, score: float, source: str | None, note: str | None
) -> AnswerRecord:
    return replace(
        record, verdict=verdict, score=score, source=source, note=note, verdicts=record.verdicts + 1
    )
