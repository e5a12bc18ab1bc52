"""The console's decisions in process: sessions and CSRF tokens, the envelope table's bounds,
the queue's bounds, the diagram's figures."""

from __future__ import annotations

import gc
import tracemalloc
from pathlib import Path
from typing import Any

import orjson
import pytest

from proxy.api.console import diagram, tree
from proxy.api.console.session import (
    SESSION_TTL_S,
    admin_id,
    login_token_ok,
    open_session,
    read_session,
)
from proxy.calibration.reliability import from_records
from proxy.memory_budget import bounds
from proxy.policy.loader import load_policy
from proxy.settings import Settings
from proxy.state.feedback import AnswerRecord
from proxy.state.review_queue import (
    BOUND_BYTES,
    CLOSED_KEPT,
    ITEM_OVERHEAD_BYTES,
    QUEUE_MAX_BYTES,
    QUEUE_MAX_ITEMS,
    TOO_LARGE,
    ReviewQueue,
)
from tests.paths import ROOT

KEY, OTHER = "sk-admin-a", "sk-admin-b"
NOW = 1_800_000_000.0


def test_a_session_reads_back_only_as_signed_unexpired_and_under_a_configured_key() -> None:
    session = open_session(KEY, NOW)
    cookie = session.cookie
    assert KEY not in cookie and session.admin == admin_id(KEY)
    assert read_session(cookie, {KEY, OTHER}, NOW) == session
    assert read_session(cookie, {OTHER}, NOW) is None  # the key was removed: its sessions end
    assert read_session(cookie, {KEY}, NOW + SESSION_TTL_S) is None
    admin, expires, nonce, mac = cookie.split(".")
    tampered = [
        f"{admin}.{int(expires) + 3600}.{nonce}.{mac}",  # a longer life
        f"{admin}.{expires}.other.{mac}",
        f"{admin_id(OTHER)}.{expires}.{nonce}.{mac}",
        f"{admin}.{expires}.{nonce}.{mac[:-1]}{'1' if mac.endswith('0') else '0'}",  # a MAC one digit off
        "",
        "a.b.c.d",
        cookie + "x" * 300,
    ]
    assert [read_session(t, {KEY, OTHER}, NOW) for t in tampered] == [None] * len(tampered)


def test_every_login_is_a_new_session_and_a_csrf_token_belongs_to_one() -> None:
    first, second = open_session(KEY, NOW), open_session(KEY, NOW)
    assert first.cookie != second.cookie and first.csrf != second.csrf
    assert first.csrf_ok(first.csrf) and not first.csrf_ok(second.csrf)
    assert not first.csrf_ok(None) and not first.csrf_ok("") and not first.csrf_ok(["x"])


@pytest.mark.parametrize(
    ("cookie", "field", "ok"),
    [("t", "t", True), ("t", "u", False), (None, "t", False), ("", "", False), ("t", None, False)],
)
def test_the_login_form_token_is_a_double_submit(cookie: str | None, field: object, ok: bool) -> None:
    assert login_token_ok(cookie, field) is ok


def nested(levels: int, leaf: Any) -> Any:
    value = leaf
    for _ in range(levels):
        value = [value]
    return value


def test_ten_thousand_nested_levels_are_cut_at_the_depth_bound_without_recursion() -> None:
    rows = tree.tree(nested(10_000, "<script>x</script>")).rows
    assert len(rows) == tree.MAX_DEPTH + 1
    assert rows[-1].depth == tree.MAX_DEPTH and "deeper than" in rows[-1].text
    assert tree.raw_json(nested(10_000, 1)).startswith("(not printable as JSON")


def test_ten_thousand_siblings_stop_at_the_row_bound() -> None:
    shown = tree.tree({"many": [f"<i>{n}</i>" for n in range(10_000)]})
    assert shown.omitted and len(shown.rows) == tree.MAX_ROWS
    assert [r.text for r in shown.rows[2:4]] == ["<i>0</i>", "<i>1</i>"]  # text: the page escapes it
    assert not tree.tree({"few": list(range(10))}).omitted


def test_rows_follow_the_document_in_order_with_kinds() -> None:
    rows = tree.tree({"a": {"b": [True, None]}, "c": "x" * (tree.MAX_TEXT + 5)}).rows
    assert [(r.depth, r.key, r.kind) for r in rows] == [
        (0, "", "object"),
        (1, "a", "object"),
        (2, "b", "array"),
        (3, "0", "boolean"),
        (3, "1", "null"),
        (1, "c", "string"),
    ]
    assert rows[-1].text.endswith("(5 more characters)")


def record(trace_id: str, envelope: Any = None, client: str = "c") -> dict[str, Any]:
    return {
        "module": "m",
        "tier": "decision",
        "trace_id": trace_id,
        "client": client,
        "decision": "review",
        "meta": {"confidence": 0.8, "risk": "high"},
        "envelope": envelope if envelope is not None else {"ok": True},
        "recorded_at": NOW,
        "answer": {"rung": "strong", "calibrated": 0.7, "cost_usd": 0.01},
    }


def test_the_queue_keeps_its_item_bound_and_counts_what_it_drops() -> None:
    dropped: list[int] = []
    queue = ReviewQueue(max_items=3, on_evict=dropped.append)
    for n in range(5):
        queue.add(record(f"t{n}"))
    assert [i.trace_id for i in queue.pending()] == ["t2", "t3", "t4"] and sum(dropped) == 2
    item = queue.get("c", "t3")
    assert item is not None and (item.rung, item.calibrated, item.confidence) == ("strong", 0.7, 0.8)


def test_the_queue_keeps_its_byte_bound_and_a_too_large_envelope_as_a_note() -> None:
    queue = ReviewQueue(max_bytes=10 * ITEM_OVERHEAD_BYTES)
    queue.add(record("big", {"x": "y" * (20 * ITEM_OVERHEAD_BYTES)}))
    big = queue.get("c", "big")
    assert big is not None and TOO_LARGE in big.envelope and queue.bytes <= 10 * ITEM_OVERHEAD_BYTES
    for n in range(20):
        queue.add(record(f"t{n}", {"x": "y" * 500}))
    assert queue.bytes <= 10 * ITEM_OVERHEAD_BYTES and len(queue) < 20


def test_closing_an_item_takes_it_out_and_lists_who_closed_it() -> None:
    queue = ReviewQueue()
    queue.add(record("t1"))
    assert queue.close("c", "t1", "correct", "admin-x", NOW) is not None
    assert queue.close("c", "t1", "correct", "admin-x", NOW) is None
    (closed,) = queue.closed()
    assert (closed.item.trace_id, closed.outcome, closed.by, closed.item.envelope) == (
        "t1",
        "correct",
        "admin-x",
        {},
    )
    assert len(queue) == 0 and queue.bytes == 0


def code_review(n: int) -> dict[str, Any]:
    """A code-reviewer envelope of about 2 KiB, parsed as the sink hands it over."""
    issues = [
        {"line": i, "severity": "minor", "message": f"issue {i} of {n}: " + "m " * 30} for i in range(10)
    ]
    body = {"issues": issues, "summary": "s" * 200, "verdict": "approve", "rationale": "r" * 300}
    parsed: dict[str, Any] = orjson.loads(orjson.dumps({"ok": True, "meta": {"risk": "high"}, "data": body}))
    return parsed


def test_what_the_queue_holds_is_within_what_the_memory_budget_counts_for_it() -> None:
    """A parsed envelope took 2.2 times its JSON, which the byte bound counted: envelopes are kept
    serialized and right-sized, and each item's bookkeeping, pending or closed, is within
    ``ITEM_OVERHEAD_BYTES``."""
    queue = ReviewQueue(max_bytes=1 << 40)
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for n in range(QUEUE_MAX_ITEMS):
            queue.add(record(f"{n:032x}", code_review(n), client=f"key-{n:016x}"))
        for n in range(CLOSED_KEPT):
            queue.close(f"key-{n:016x}", f"{n:032x}", "correct", "admin-0123456789ab", NOW)
        gc.collect()
        held = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    counted = queue.bytes + CLOSED_KEPT * ITEM_OVERHEAD_BYTES
    assert held <= counted, f"{held} bytes held, {counted} counted"
    opened = queue.get(f"key-{CLOSED_KEPT:016x}", f"{CLOSED_KEPT:032x}")
    assert opened is not None and opened.envelope == code_review(CLOSED_KEPT)


def test_the_memory_budget_counts_the_queue_where_the_console_keeps_one(tmp_path: Path) -> None:
    policy_path = tmp_path / "policy.yaml"
    demo = (ROOT / "policies" / "demo.yaml").read_text(encoding="utf-8")
    policy_path.write_text(demo + "review: {sink: redis-stream}\n", encoding="utf-8")
    policy = load_policy(policy_path)
    console = {"admin_port": 9001, "admin_keys": frozenset({KEY})}

    def counted(**settings: Any) -> int:
        (row,) = [
            b
            for b in bounds(Settings(policy_path=policy_path, module_dirs=(), **settings), policy)
            if "review" in b.store
        ]
        return row.bytes

    assert counted() == 0 and counted(redis_url="redis://127.0.0.1:1/0", **console) == 0
    assert counted(**console) == BOUND_BYTES == QUEUE_MAX_BYTES + CLOSED_KEPT * ITEM_OVERHEAD_BYTES


def answer(confidence: float, score: float, n: int) -> AnswerRecord:
    return AnswerRecord(
        trace_id=f"t{n}", module="m", tier="decision", rung="fast", provider="up", model="cheap",
        confidence=confidence, calibrated=confidence, risk="low", decision="review", min_confidence=0.7,
        at=NOW, expires=NOW + 60, verdict="correct" if score else "incorrect", score=score,
    )  # fmt: skip


def test_the_diagram_has_the_reports_figures() -> None:
    records = [answer(0.8, 1.0, 0), answer(0.8, 0.0, 1), answer(0.3, 0.0, 2)]
    (calibrated, reported) = sorted(diagram.diagrams_of(records), key=lambda d: d.scale)
    figures = from_records(records).models[("up/cheap", "reported")]
    assert calibrated.scale == "calibrated" and reported.ece == pytest.approx(figures.ece)
    assert [(d.bucket, d.count, d.accuracy) for d in reported.dots] == [("0.3", 1, 0.0), ("0.8", 2, 0.5)]
    top = reported.dots[1]
    assert top.x == diagram.MARGIN + 0.8 * diagram.SIZE and top.y == diagram.MARGIN + 0.5 * diagram.SIZE
