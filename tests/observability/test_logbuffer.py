"""The buffered log writer: lines wait for the flusher's interval (or 64 KiB) and none is lost,
not at the interval, not at shutdown."""

from __future__ import annotations

import asyncio
import io
import json
import subprocess
import sys
import threading
from collections.abc import Coroutine, Generator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml

from proxy.observability.logbuffer import FLUSH_BYTES, PIPE_BUF, BufferedLines
from tests.fake_upstream import FakeUpstream
from tests.paths import ROOT
from tests.proxy_server import UPSTREAM_KEY, UPSTREAM_KEY_ENV, proxy_process, upstream_policy
from tests.support.polling import until

DEMO = str(ROOT / "policies" / "demo.yaml")


def test_lines_wait_while_buffered_and_all_come_out_in_order_on_flush() -> None:
    sink = io.BytesIO()
    lines = BufferedLines(sink)
    lines.buffered = True
    for n in range(100):
        lines.info(b'{"n":%d}' % n)
    assert sink.getvalue() == b""
    lines.flush()
    assert sink.getvalue().splitlines() == [b'{"n":%d}' % n for n in range(100)]


def test_an_unbuffered_writer_writes_each_line_at_once() -> None:
    sink = io.BytesIO()
    lines = BufferedLines(sink)
    lines.msg(b"one")
    assert sink.getvalue() == b"one\n"


def test_a_full_buffer_is_written_without_waiting_for_the_interval() -> None:
    sink = io.BytesIO()
    lines = BufferedLines(sink)
    lines.buffered = True
    line = b"x" * 1023
    count = FLUSH_BYTES // 1024
    for _ in range(count - 1):
        lines.msg(line)
    assert sink.getvalue() == b""  # just under 64 KiB waits
    lines.msg(line)
    assert len(sink.getvalue()) == count * 1024


async def test_the_flusher_writes_on_its_interval_and_the_rest_when_cancelled() -> None:
    sink = io.BytesIO()
    lines = BufferedLines(sink)
    flusher = asyncio.create_task(lines.flush_every(0.01))
    await asyncio.sleep(0)  # the flusher starts buffering
    lines.msg(b"first")
    # polled: written by the interval, not by anything else
    await until(sink.getvalue, "the interval's flush", step=0.005)
    assert sink.getvalue() == b"first\n"
    lines.msg(b"last")
    flusher.cancel()
    with pytest.raises(asyncio.CancelledError):
        await flusher
    assert sink.getvalue() == b"first\nlast\n"
    assert not lines.buffered  # after the flusher, lines are written at once again
    lines.msg(b"after")
    assert sink.getvalue().endswith(b"after\n")


class CountedSteps(Coroutine[Any, Any, None]):
    """``inner`` as a task runs it, counting how often the event loop resumes it: its wake-ups."""

    def __init__(self, inner: Coroutine[Any, Any, None]) -> None:
        self.inner = inner
        self.steps = 0

    def send(self, value: Any) -> Any:
        self.steps += 1
        return self.inner.send(value)

    def throw(self, *error: Any) -> Any:
        self.steps += 1
        return self.inner.throw(*error)

    def close(self) -> None:
        self.inner.close()

    def __await__(self) -> Generator[Any, None, None]:
        return self.inner.__await__()


INTERVAL_S = 0.001


async def idle_intervals(count: int = 50) -> None:
    """The window in which a flusher waking every ``INTERVAL_S`` would have woken ``count`` times:
    a sibling task sleeping that interval, ``count`` times over (no time is asserted)."""
    for _ in range(count):
        await asyncio.sleep(INTERVAL_S)


async def test_an_idle_flusher_waits_for_a_line_instead_of_waking_every_interval() -> None:
    """An idle sidecar's flusher is parked: no wake-up until a line comes (from the loop or a
    worker thread), then one batch written after the interval, and parked again."""
    sink = io.BytesIO()
    lines = BufferedLines(sink)
    flusher = CountedSteps(lines.flush_every(INTERVAL_S))
    task = asyncio.create_task(flusher)
    await idle_intervals()
    assert flusher.steps == 1  # its start, then no wake-up in 50 of its intervals
    lines.msg(b"from the loop")
    await until(sink.getvalue, "the loop's line", step=INTERVAL_S)
    woken = flusher.steps
    await idle_intervals()
    assert flusher.steps == woken
    writer = threading.Thread(target=lines.msg, args=(b"from a thread",))
    writer.start()
    writer.join()
    await until(lambda: sink.getvalue().endswith(b"from a thread\n"), "the thread's line", step=INTERVAL_S)
    woken = flusher.steps
    await idle_intervals()
    assert flusher.steps == woken
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert sink.getvalue() == b"from the loop\nfrom a thread\n"


def test_a_line_written_after_the_flushers_loop_closed_waits_for_the_exit_flush() -> None:
    """A line (from the loop's thread or a worker's) when the flusher's loop is already closed:
    kept, never an error, and written by the flush at exit (``atexit``)."""
    sink = io.BytesIO()
    lines = BufferedLines(sink)
    loop = asyncio.new_event_loop()
    task = loop.create_task(lines.flush_every(INTERVAL_S))
    loop.run_until_complete(asyncio.sleep(0))  # the flusher starts buffering
    loop.close()
    writer = threading.Thread(target=lines.msg, args=(b"late",))
    writer.start()
    writer.join()
    assert sink.getvalue() == b""
    lines.flush()
    lines.msg(b"later")  # from the loop's own thread
    assert sink.getvalue() == b"late\n"
    lines.flush()
    assert sink.getvalue() == b"late\nlater\n"
    task.get_coro().close()


async def test_every_request_line_is_written_by_shutdown(fake_upstream: FakeUpstream, tmp_path: Path) -> None:
    """A long interval keeps lines in memory; SIGTERM must still write each one."""
    policy = tmp_path / "policy.yaml"
    policy.write_text(yaml.safe_dump(upstream_policy(fake_upstream)))
    env = {UPSTREAM_KEY_ENV: UPSTREAM_KEY}
    count = 40
    body = {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "hi"}]}
    served_process = proxy_process("--policy", str(policy), "--log-flush-interval", "10", env=env)
    async with served_process as served, aiohttp.ClientSession() as session:
        for n in range(count):
            resp = await session.post(
                served.url + "/v1/chat/completions", json=body, headers={"X-Request-Id": f"buffered-{n}"}
            )
            assert resp.status == 200
    _, stderr = served.output
    traces = [
        event["trace_id"]
        for event in (json.loads(line) for line in stderr.splitlines() if line.startswith("{"))
        if event.get("event") == "proxy.request" and event.get("route") == "/v1/chat/completions"
    ]
    assert traces == [f"buffered-{n}" for n in range(count)]


@pytest.mark.parametrize("value", ["-1", "11", "nan"])
def test_a_flush_interval_out_of_range_is_refused_at_start(value: str) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "proxy", "serve", "--policy", DEMO, "--log-flush-interval", value],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode != 0
    assert "--log-flush-interval must be 0..10 seconds" in done.stderr


class RecordedWrites:
    """A file that keeps each flushed write apart, as a pipe's reader would see the writes."""

    def __init__(self) -> None:
        self.writes: list[bytes] = []
        self._pending = b""

    def write(self, data: bytes) -> int:
        self._pending += data
        return len(data)

    def flush(self) -> None:
        if self._pending:
            self.writes.append(self._pending)
            self._pending = b""


def test_each_write_holds_whole_lines_and_fits_an_atomic_pipe_write() -> None:
    """Workers share one stderr pipe: a write of more than PIPE_BUF bytes may interleave with
    another worker's mid-line, so a batch goes out in whole lines of at most PIPE_BUF bytes (a
    longer line alone, as before batching)."""
    sink = RecordedWrites()
    lines = BufferedLines(sink)  # type: ignore[arg-type]
    lines.buffered = True
    sent = [b'{"n":%d,"pad":"%s"}' % (n, b"x" * (n % 300)) for n in range(2000)]
    sent.append(b"y" * (PIPE_BUF + 100))  # one line longer than an atomic write
    for line in sent:
        lines.msg(line)
    lines.flush()
    assert b"".join(sink.writes).splitlines() == sent
    for write in sink.writes:
        assert write.endswith(b"\n")
        assert len(write) <= PIPE_BUF or write.count(b"\n") == 1
