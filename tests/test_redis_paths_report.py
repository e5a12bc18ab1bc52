"""``tests/perf/bench.py --redis-paths``'s arithmetic: the round trips an answer waits on, counted
in the same run's cost of one round trip (not the bare 5 ms the relay holds)."""

from __future__ import annotations

from tests.perf.redis_paths import round_trips

ISSUE_RUN = {
    "Redis off": [0.74, 0.81, 2.01, 1.85],
    "+0 ms": [0.73, 1.43, 4.89, 2.79],
    "+5 ms": [0.70, 7.65, 16.31, 15.51],
}
"""p50 ms of one run on the issue's code (plain chat, with limits, the module call, the session call)."""


def test_round_trips_are_what_the_wire_shows_for_each_path() -> None:
    """Plain chat waits on none, with limits on one (its check), a session call on two (the read
    before the model, the writes' acknowledgement): tests/api/test_redis_round_trips.py. The
    difference from Redis off over 5 ms read 1.4, 2.9 and 2.7."""
    trips = round_trips(ISSUE_RUN)
    assert trips is not None
    assert [round(t) for t in trips] == [0, 1, 2, 2]


def test_no_round_trips_without_both_relay_cells_or_a_measurable_one() -> None:
    assert round_trips({"Redis off": ISSUE_RUN["Redis off"], "+5 ms": ISSUE_RUN["+5 ms"]}) is None
    flat = {**ISSUE_RUN, "+5 ms": ISSUE_RUN["+0 ms"]}
    assert round_trips(flat) is None
