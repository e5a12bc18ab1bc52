"""The review queue: answers decided ``review`` waiting for a person (the review console).

``ReviewItems`` is what the console reads and closes items through. Two kinds:

* ``MemoryItems`` over ``ReviewQueue``: in process and bounded, for the log and webhook sinks
  (and the stream sink without Redis): this process's answers only. Past either bound the oldest
  pending items go first (counted as ``evicted``); an item is keyed by (client identity, trace
  id), like its feedback record.
* ``proxy.state.review_stream.StreamItems``: the policy's Redis review stream, every replica's
  answers, closed items a shared fact.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, Protocol

import orjson

from proxy.jsonshape import as_dict
from proxy.retained import retained

QUEUE_MAX_ITEMS = 1000
"""Pending items kept; a person reviews tens an hour, so a thousand is days of backlog."""
QUEUE_MAX_BYTES = 8 * 1024 * 1024
"""The envelopes kept, in serialized bytes: a few very large answers cannot take the heap."""
CLOSED_KEPT = 200
"""Closed items listed (their outcome and who closed them), envelopes dropped."""
ITEM_OVERHEAD_BYTES = 1024
"""What an item costs besides its envelope (the dataclass, its strings, the index)."""
BOUND_BYTES = QUEUE_MAX_BYTES + CLOSED_KEPT * ITEM_OVERHEAD_BYTES
"""The most a queue holds: its pending items within the byte bound, and the closed ones it lists
(``proxy.memory_budget``)."""

ItemKey = tuple[str, str]
"""(client identity, trace id)."""
Serialized = bytes
"""An envelope's JSON (the name ``bytes`` is ``ReviewQueue``'s property in its body)."""


@dataclass(frozen=True, slots=True)
class PendingReview:
    """One answer sent to review, with the facts a reviewer needs."""

    trace_id: str
    client: str
    module: str
    tier: str
    decision: str
    envelope: dict[str, Any]
    at: float
    """Epoch seconds it was queued."""
    rung: str = ""
    target: str = ""
    confidence: float | None = None
    """As the model reported it."""
    calibrated: float | None = None
    """Through the target's calibration map: what was decided on."""
    risk: str = ""
    """The risk routed on (``risk_source``)."""
    model_risk: str | None = None
    rule_risk: str | None = None
    cost_usd: float = 0.0
    size: int = 0
    """The envelope's serialized bytes (counted against ``QUEUE_MAX_BYTES``)."""
    entry: str = ""
    """Its review stream entry id (``StreamItems``); empty in the in-process queue."""

    @property
    def key(self) -> ItemKey:
        return (self.client, self.trace_id)


def _number(value: object) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _text(value: object) -> str | None:
    return value if isinstance(value, str) else None


def pending_from_record(record: Mapping[str, Any], size: int) -> PendingReview:
    """The queue's item for a review sink's record (``proxy.review.review_record``)."""
    answer = as_dict(record.get("answer"))
    meta = as_dict(record.get("meta"))
    return PendingReview(
        trace_id=str(record["trace_id"]),
        client=str(record["client"]),
        module=str(record["module"]),
        tier=str(record["tier"]),
        decision=str(record["decision"]),
        envelope=as_dict(record.get("envelope")),
        at=float(record.get("recorded_at") or 0.0),
        rung=_text(answer.get("rung")) or "",
        target=_text(answer.get("target")) or "",
        confidence=_number(answer.get("confidence", meta.get("confidence"))),
        calibrated=_number(answer.get("calibrated")),
        risk=_text(answer.get("risk")) or _text(meta.get("risk")) or "",
        model_risk=_text(answer.get("model_risk")),
        rule_risk=_text(answer.get("rule_risk")),
        cost_usd=_number(answer.get("cost_usd")) or 0.0,
        size=size,
    )


@dataclass(frozen=True, slots=True)
class ClosedReview:
    item: PendingReview
    """Its envelope dropped (the queue keeps closed items' facts only)."""
    outcome: str
    """The verdict (correct, incorrect, partially_correct) or the overriding decision (accept, reject)."""
    by: str
    at: float


class ReviewQueue:
    """Pending review items, oldest first, within ``max_items`` and ``max_bytes``."""

    def __init__(
        self,
        max_items: int = QUEUE_MAX_ITEMS,
        max_bytes: int = QUEUE_MAX_BYTES,
        on_evict: Callable[[int], None] = lambda count: None,
    ) -> None:
        self._items: OrderedDict[ItemKey, PendingReview] = OrderedDict()
        """Without their envelopes: those are in ``_envelopes``, serialized."""
        self._envelopes: dict[ItemKey, bytes] = {}
        """Serialized and right-sized: what the byte bound counts is what is held (a parsed
        envelope takes twice its JSON or more)."""
        self._max_items = max_items
        self._max_bytes = max_bytes
        self._bytes = 0
        self._on_evict = on_evict
        self._closed: deque[ClosedReview] = deque(maxlen=CLOSED_KEPT)

    def __len__(self) -> int:
        return len(self._items)

    @property
    def bytes(self) -> int:
        return self._bytes

    def add(self, record: Mapping[str, Any]) -> None:
        """Queue the review sink's ``record`` (never raises for a record the sink accepts)."""
        try:
            raw = orjson.dumps(record.get("envelope"))
        except orjson.JSONEncodeError:  # nested past orjson's depth: shown as too large to keep
            raw = b"x" * (self._max_bytes + 1)
        self._put(replace(pending_from_record(record, len(raw)), envelope={}), raw)

    def reopen(self, item: PendingReview) -> None:
        """Put a closed ``item`` (with its envelope) back as pending: its verdict failed to record."""
        self._closed = deque((c for c in self._closed if c.item.key != item.key), maxlen=CLOSED_KEPT)
        raw = orjson.dumps(item.envelope)
        self._put(replace(item, envelope={}, size=len(raw)), raw)

    def _put(self, item: PendingReview, raw: Serialized) -> None:
        if len(raw) + ITEM_OVERHEAD_BYTES > self._max_bytes:
            raw = orjson.dumps({TOO_LARGE: len(raw)})
            item = replace(item, size=len(raw))
        self._drop(item.key)
        self._items[item.key] = item
        self._envelopes[item.key] = retained(raw)
        self._bytes += _cost(item)
        evicted = 0
        while len(self._items) > self._max_items or self._bytes > self._max_bytes:
            self._drop(next(iter(self._items)))
            evicted += 1
        if evicted:
            self._on_evict(evicted)

    def _drop(self, key: ItemKey) -> PendingReview | None:
        item = self._items.pop(key, None)
        if item is not None:
            del self._envelopes[key]
            self._bytes -= _cost(item)
        return item

    def get(self, client: str, trace_id: str) -> PendingReview | None:
        """The pending item with its envelope."""
        item = self._items.get((client, trace_id))
        if item is None:
            return None
        return replace(item, envelope=as_dict(orjson.loads(self._envelopes[item.key])))

    def close(self, client: str, trace_id: str, outcome: str, by: str, at: float) -> PendingReview | None:
        """Take the item out of the queue, judged or overridden (``outcome``) by ``by``; None when
        it was not there."""
        item = self._drop((client, trace_id))
        if item is not None:
            self._closed.appendleft(ClosedReview(replace(item, size=0), outcome, by, at))
        return item

    def closed(self) -> tuple[ClosedReview, ...]:
        """Newest first."""
        return tuple(self._closed)

    def pending(self) -> Iterable[PendingReview]:
        """Oldest first, without their envelopes (``get`` has them)."""
        return tuple(self._items.values())


TOO_LARGE = "envelope_too_large"


def _cost(item: PendingReview) -> int:
    return item.size + ITEM_OVERHEAD_BYTES


@dataclass(frozen=True, slots=True)
class QueuePage:
    """What the queue page lists: pending items that pass its filters."""

    items: tuple[PendingReview, ...]
    total: int
    """Pending in all (from the stream: about, closed entries trimmed meanwhile still counted)."""
    older: str | None = None
    """The stream entry id the next page reads after (older entries); None: nothing more."""


class QueueUnavailable(Exception):
    """The shared queue cannot be read or written now (Redis is not answering)."""


Keeps = Callable[[PendingReview], bool]


class ReviewItems(Protocol):
    """The review console's queue: where pending items are read and closed."""

    @property
    def shared(self) -> bool:
        """Every replica's items (the Redis stream), not this process's only."""
        ...

    async def page(self, keeps: Keeps, older_than: str | None) -> QueuePage: ...

    async def item(self, client: str, trace_id: str, entry: str) -> PendingReview | None:
        """The pending item, with its envelope; None when closed, evicted or never queued."""
        ...

    async def neighbours(self, item: PendingReview) -> tuple[PendingReview | None, PendingReview | None]:
        """The pending items listed just before and just after ``item``."""
        ...

    async def claim(self, item: PendingReview, outcome: str, by: str, at: float) -> ClosedReview | None:
        """Close ``item`` (``outcome`` by ``by``) unless it is closed already: None when this
        claim closed it, else how it was closed first (one verdict wins)."""
        ...

    async def release(self, item: PendingReview) -> None:
        """Undo this process's claim of ``item``: pending again (its verdict failed to record)."""
        ...

    async def close_answer(self, client: str, trace_id: str, outcome: str, by: str, at: float) -> bool:
        """Close the pending item of ``client``'s answer ``trace_id`` (a verdict given elsewhere,
        ``POST /v1/feedback``); False when none is pending."""
        ...

    async def closed(self) -> Sequence[ClosedReview]:
        """Closed items, newest first (at most ``CLOSED_KEPT``)."""
        ...


GONE = "gone"
"""A claimed item no longer in the queue, with no closure known (evicted, or trimmed)."""


class MemoryItems:
    """``ReviewItems`` over this process's ``ReviewQueue`` (one event loop: a claim is atomic)."""

    shared = False

    def __init__(self, queue: ReviewQueue) -> None:
        self.queue = queue

    async def page(self, keeps: Keeps, older_than: str | None) -> QueuePage:
        return QueuePage(tuple(i for i in self.queue.pending() if keeps(i)), len(self.queue))

    async def item(self, client: str, trace_id: str, entry: str) -> PendingReview | None:
        return self.queue.get(client, trace_id)

    async def neighbours(self, item: PendingReview) -> tuple[PendingReview | None, PendingReview | None]:
        pending = list(self.queue.pending())
        at = next((i for i, p in enumerate(pending) if p.key == item.key), None)
        if at is None:
            return None, None
        return (pending[at - 1] if at else None, pending[at + 1] if at + 1 < len(pending) else None)

    async def claim(self, item: PendingReview, outcome: str, by: str, at: float) -> ClosedReview | None:
        if self.queue.close(item.client, item.trace_id, outcome, by, at) is not None:
            return None
        prior = next((c for c in self.queue.closed() if c.item.key == item.key), None)
        return prior or ClosedReview(item, GONE, "", at)

    async def release(self, item: PendingReview) -> None:
        self.queue.reopen(item)

    async def close_answer(self, client: str, trace_id: str, outcome: str, by: str, at: float) -> bool:
        return self.queue.close(client, trace_id, outcome, by, at) is not None

    async def closed(self) -> Sequence[ClosedReview]:
        return self.queue.closed()
