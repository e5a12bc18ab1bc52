"""Issue #26 adversarial pass by an outside attacker: neighbouring inputs of each finding.

Each test here failed on e966788 (the merged fixes) and passes with its fix.
"""

from __future__ import annotations

from proxy.state.feedback import AnswerRecord, MemoryFeedbackStore


def _record(client: str, trace_id: str) -> AnswerRecord:
    return AnswerRecord(
        trace_id,
        "m",
        "decision",
        "fast",
        "up",
        "cheap",
        0.9,
        0.6,
        "low",
        "accept",
        0.7,
        1000.0,
        1060.0,
        client,
    )


class _Clock:
    def __call__(self) -> float:
        return 1000.0


async def test_one_client_cannot_evict_another_clients_feedback_records() -> None:
    """Same class as #26.8: the feedback LRU (feedback.max_entries) is shared by every client, so
    Bob's calls evicted Alice's record before she could give her verdict. Past the bound, the
    client holding the most records loses its oldest (the caller, on a tie)."""
    store = MemoryFeedbackStore(_Clock())
    store.remember(_record("alice", "a-1"), 10)
    for i in range(100):
        store.remember(_record("bob", f"b-{i}"), 10)
    assert len(store) == 10
    assert await store.get("alice", "a-1") is not None
    assert [await store.get("bob", f"b-{i}") is not None for i in (91, 99)] == [True, True]
    assert await store.get("bob", "b-90") is None  # Bob kept his newest 9
    # Alice, below her share, still evicts the largest client's oldest, never her own.
    for i in range(2, 6):
        store.remember(_record("alice", f"a-{i}"), 10)
    assert len(store) == 10
    assert all([await store.get("alice", f"a-{i}") is not None for i in (1, 2, 3, 4, 5)])
    # At her share (5 each), one more of Alice's evicts her own oldest.
    store.remember(_record("alice", "a-6"), 10)
    assert await store.get("alice", "a-1") is None
    assert await store.get("bob", "b-95") is not None
