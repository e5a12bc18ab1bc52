"""``ReadDeadline``: the edge's client read deadline, one timer per connection re-aimed when it
fires early, driven here by a fake clock (``tests/security/test_slow_clients.py`` drives the
edge itself through a real server)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from proxy.server import ReadDeadline


class FakeLoop:
    """``time`` and ``call_at`` over a clock the test moves with ``advance``."""

    def __init__(self) -> None:
        self.now = 0.0
        self.timers: list[tuple[asyncio.TimerHandle, Callable[[], object]]] = []
        self._loop = asyncio.new_event_loop()  # a TimerHandle wants one; it never runs

    def time(self) -> float:
        return self.now

    def call_at(self, when: float, callback: Callable[[], object]) -> asyncio.TimerHandle:
        handle = asyncio.TimerHandle(when, callback, (), self._loop)
        self.timers.append((handle, callback))
        return handle

    def pending(self) -> list[asyncio.TimerHandle]:
        return [handle for handle, _ in self.timers if not handle.cancelled()]

    def advance(self, to: float) -> None:
        """Run the timers due by ``to`` in order, each once, as the event loop would."""
        while True:
            due = [(h, cb) for h, cb in self.timers if not h.cancelled() and h.when() <= to]
            if not due:
                break
            handle, callback = min(due, key=lambda timer: timer[0].when())
            self.now = handle.when()
            handle.cancel()
            callback()
        self.now = to

    def close(self) -> None:
        self._loop.close()


def deadline() -> tuple[FakeLoop, ReadDeadline, list[float]]:
    loop = FakeLoop()
    expired: list[float] = []
    return loop, ReadDeadline(loop, lambda: expired.append(loop.now)), expired


def test_requests_move_the_due_time_without_a_timer_each() -> None:
    loop, read, expired = deadline()
    read.arm(10, restart=True)  # the connection opens: its first head is due at 10
    loop.now = 1.0
    read.disarm()  # the head and body arrived
    for start in (2.0, 3.0, 8.0):  # three more requests on the kept-alive connection
        loop.now = start
        read.arm(10, restart=False)
        read.disarm()
    loop.now = 8.5
    read.arm(10, restart=False)  # a fifth head starts and stalls: due at 18.5
    assert len(loop.timers) == 1  # five requests, one timer
    loop.advance(17.0)  # the timer set at the start fires at 10, finds 18.5 ahead, re-aims
    assert expired == [] and [t.when() for t in loop.pending()] == [18.5]
    loop.advance(20.0)
    assert expired == [18.5]
    loop.close()


def test_a_running_deadline_is_kept_unless_restarted() -> None:
    loop, read, expired = deadline()
    read.arm(10, restart=True)
    loop.now = 4.0
    read.arm(10, restart=False)  # more bytes of the same head: still due at 10 (slowloris)
    assert read.due == 10.0
    loop.advance(10.0)
    assert expired == [10.0]
    read.arm(10, restart=True)  # a body arriving: each read restarts it
    loop.now = 15.0
    read.arm(10, restart=True)
    loop.advance(30.0)
    assert expired == [10.0, 25.0]
    loop.close()


def test_a_disarmed_deadline_never_fires_and_closing_drops_the_timer() -> None:
    loop, read, expired = deadline()
    read.arm(10, restart=True)
    read.disarm()
    loop.advance(50.0)  # the timer fires, finds nothing due, and is not set again
    assert expired == [] and loop.pending() == []
    read.arm(10, restart=True)  # the next request sets a fresh one
    assert [t.when() for t in loop.pending()] == [60.0]
    read.close()  # the connection closed: nothing holds it until 60
    assert loop.pending() == [] and read.due is None
    loop.advance(100.0)
    assert expired == []
    loop.close()
