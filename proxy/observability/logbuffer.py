"""A buffered, interval-flushed line writer: every log line is kept, written in batches.

Writing and flushing each line costs a ``write(2)`` per request. Like Envoy's access log, lines
are appended to a buffer and written when it holds ``FLUSH_BYTES`` or when the flusher's
interval elapses (and always at exit), so a burst of requests shares one write. Until a flusher
runs (CLI commands, start-up) every line is written at once, as before. The flusher waits for the
first line of a batch rather than waking every interval: an idle proxy (a sidecar, most of the
time) spends nothing on it.
"""

from __future__ import annotations

import asyncio
import atexit
import select
import threading
from collections.abc import Iterator
from contextlib import suppress
from typing import BinaryIO, Final

FLUSH_BYTES: Final = 64 * 1024
"""A buffer this full is written at once, without waiting for the interval."""
PIPE_BUF: Final = select.PIPE_BUF
"""The most a write to a pipe puts in at once, never interleaved with another writer's: the
workers of ``serve --workers N`` share one stderr, so a batch is written in whole lines of at
most this many bytes (a longer line alone, as each line was before batching)."""
DEFAULT_FLUSH_INTERVAL_S: Final = 0.1
MAX_FLUSH_INTERVAL_S: Final = 10.0
"""Lines older than this would make a crash lose too much and tailing the log useless."""


class BufferedLines:
    """structlog logger (``msg`` and its level aliases) writing byte lines to ``file``."""

    __slots__ = ("_buffer", "_file", "_flusher", "_lock", "buffered")

    def __init__(self, file: BinaryIO) -> None:
        self._file = file
        self._buffer = bytearray()
        self._lock = threading.Lock()  # a line may come from a worker thread (asyncio.to_thread)
        self.buffered = False
        """Whether lines wait for the flusher; False writes each line at once."""
        self._flusher: tuple[asyncio.AbstractEventLoop, int, asyncio.Event] | None = None
        """The running flusher's loop, that loop's thread and the event it waits on for a line."""
        atexit.register(self.flush)

    def msg(self, message: bytes) -> None:
        with self._lock:
            first = not self._buffer
            self._buffer += message
            self._buffer += b"\n"
            if self.buffered and len(self._buffer) < FLUSH_BYTES:
                if first:
                    self._wake_flusher()
                return
            self._write_out()

    log = debug = info = warn = warning = err = error = critical = exception = fatal = failure = msg

    def flush(self) -> None:
        with self._lock:
            self._write_out()

    def _write_out(self) -> None:
        if self._buffer:
            data, self._buffer = self._buffer, bytearray()
            with suppress(ValueError, OSError):  # a closed or broken stderr loses lines, not requests
                for piece in _atomic_pieces(data):
                    self._file.write(piece)
                    self._file.flush()

    def _wake_flusher(self) -> None:
        """Tell the flusher a batch has begun (the lock held): at once on its loop's thread, through
        the loop from any other (a worker thread's line)."""
        if self._flusher is None:
            return
        loop, thread, pending = self._flusher
        with suppress(RuntimeError):  # the loop is closed: the line waits for the flush at exit
            if threading.get_ident() == thread:
                pending.set()
            else:
                loop.call_soon_threadsafe(pending.set)

    async def flush_every(self, interval_s: float) -> None:
        """Buffer lines and write each batch ``interval_s`` after its first line until cancelled;
        then write the rest. With nothing buffered it waits, never waking."""
        pending = asyncio.Event()
        with self._lock:
            self.buffered = interval_s > 0
            self._flusher = (asyncio.get_running_loop(), threading.get_ident(), pending)
            if self._buffer:
                pending.set()
        try:
            while self.buffered:
                await pending.wait()
                await asyncio.sleep(interval_s)  # the rest of the batch comes meanwhile
                # Cleared with the flush, in one step of the loop: a line after the flush sets it again.
                pending.clear()
                self.flush()
        finally:
            with self._lock:
                self._flusher = None
                self.buffered = False
                self._write_out()


def _atomic_pieces(data: bytearray) -> Iterator[memoryview]:
    """``data`` (whole lines) cut after a newline into pieces of at most ``PIPE_BUF`` bytes; a line
    longer than that is a piece of its own."""
    view = memoryview(data)
    start, end = 0, len(data)
    while start < end:
        stop = start + PIPE_BUF
        if stop >= end:
            yield view[start:end]
            return
        cut = data.rfind(b"\n", start, stop) + 1
        if cut <= start:  # one line longer than PIPE_BUF: alone, up to its newline
            cut = data.find(b"\n", start) + 1 or end
        yield view[start:cut]
        start = cut
