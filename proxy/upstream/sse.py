"""Server-sent events: splitting bytes into events, and when a forwarded stream is complete.

:func:`parse_sse` splits bytes into whole events for the clients that read a stream (the
Anthropic client, a streamed module call). :class:`StreamCheck` watches a forwarded stream with
incremental event framing and one rule per wire format; the bytes are only watched, never
changed or re-encoded. Events may split across TCP chunks; an event ends at a blank line
(``\\n\\n``, ``\\r\\n\\r\\n`` or ``\\r\\r``); ``data:`` lines are joined with ``\\n``; comments
(``: keep-alive``) are not events.

Complete means the stream ended as its wire format ends:

* ``chat`` (chat completions, legacy completions): ``data: [DONE]``; for providers that send
  none, every choice named in the stream's last events (its final ``BATCH_BYTES`` or more) has a
  ``finish_reason``. An upstream ``{"error": ...}`` event also ends it.
* ``responses`` (Responses API): a ``response.completed``, ``response.failed``,
  ``response.incomplete`` or ``error`` event.

What follows the end is forwarded but not judged. A ``data`` payload that is not JSON (nor
``[DONE]``) is a malformed chunk: counted, forwarded as is. The bytes are judged in batches, not
per read (see :class:`StreamCheck`): what a forwarded chunk costs is a list append.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal

import msgspec
import orjson

WireFormat = Literal["chat", "responses"]
IncompleteReason = Literal["truncated", "dropped", "stalled", "too_long", "upstream_error", "malformed_chunk"]
"""Why a stream that had started did not end complete (the ``reason`` label): it ended cleanly
but not as its format ends, the connection broke, no byte came within ``stream_idle_s``, it ran
past ``stream_total_s``, the provider sent an error the proxy translates (Anthropic), or a chunk
was not JSON. ``malformed_chunk`` also counts a stream that went on after such a chunk."""

RESPONSES_TERMINAL = frozenset({"response.completed", "response.failed", "response.incomplete", "error"})
# An event larger than this is not one a provider sends (tool-call arguments stream in deltas):
# past it the event is judged malformed and no longer buffered, so memory stays bounded.
MAX_EVENT_BYTES = 1 << 20
BATCH_BYTES = 16 * 1024
"""Forwarded bytes collected before they are judged (and at most kept for it)."""
_DONE = b"[DONE]"
_NEXT_DATA = b"\n\ndata: "
_SHRINK = len(_NEXT_DATA) - 1
_LAST_DONE = b"\n\ndata: [DONE]\n\n"
_ONLY_DONE = b"data: [DONE]\n\n"
_RAW_ARRAY = msgspec.json.Decoder(list[msgspec.Raw])


def parse_sse(buffer: bytes) -> tuple[list[tuple[str, str]], bytes]:
    """Split ``buffer`` into complete SSE events ``(event name, data)`` and the unconsumed remainder.

    Events end with a blank line; ``\\r\\n`` line ends are accepted, ``data:`` lines are joined with
    ``"\\n"``, comments (``:``) are skipped, and an event without data is not dispatched.
    """
    events: list[tuple[str, str]] = []
    consumed = 0
    name = ""
    data: list[str] = []
    pos = 0
    while (end := buffer.find(b"\n", pos)) != -1:
        line = buffer[pos:end].removesuffix(b"\r").decode("utf-8", errors="replace")
        pos = end + 1
        if not line:
            if data:
                events.append((name or "message", "\n".join(data)))
            name, data, consumed = "", [], pos
            continue
        if line.startswith(":"):
            continue
        field, _, value = line.partition(":")
        value = value.removeprefix(" ")
        if field == "event":
            name = value
        elif field == "data":
            data.append(value)
    return events, buffer[consumed:]


def wire_format(path: str) -> WireFormat | None:
    """The wire format of an OpenAI API path's streamed answer; None: not judged."""
    if path in ("/v1/chat/completions", "/v1/completions"):
        return "chat"
    if path == "/v1/responses":
        return "responses"
    return None


class StreamCheck:
    """Feed it the stream's bytes as forwarded; ``events``, ``malformed`` and ``complete`` follow.

    Reads are only collected as they come (a forwarded chunk costs a list append) and judged
    together every ``BATCH_BYTES``, when a count is read and at the end: a batch of plain chat
    events (one ``data:`` line each, no comment, no error) is checked in one pass in C — its
    payloads joined into one JSON array that ``msgspec`` validates without building objects, a
    ``[DONE]`` at its end — and any other batch event by event.

    ``sniff`` gets the same bytes, a batch at a time (the usage sniffer: no call of its own per
    read); ``flush`` hands it what is not judged yet."""

    def __init__(self, wire: WireFormat, *, sniff: Callable[[bytes], None] | None = None) -> None:
        self.wire = wire
        self._sniff = sniff
        self.complete = False
        self._events = 0
        self._malformed = 0
        self._first_malformed = False
        self.reads: list[bytes] = []
        """The reads not judged yet, in order. ``feed`` appends to it; so may a copy that counts
        their bytes itself and calls ``flush`` once they reach ``BATCH_BYTES`` (a list append per
        chunk, no call of its own: ``relay.copy``)."""
        self._size = 0
        self._pending = b""
        """Bytes after the last judged event boundary (an event split across reads)."""
        self._tail = (b"", b"")
        """The last two judged batches of whole events: where the end looks for finish reasons."""

    def feed(self, chunk: bytes) -> None:
        self.reads.append(chunk)
        self._size += len(chunk)
        if self._size >= BATCH_BYTES:
            self._judge()

    @property
    def events(self) -> int:
        """Data-carrying events seen (the first one is the stream's first real chunk)."""
        self._judge()
        return self._events

    @property
    def malformed(self) -> int:
        self._judge()
        return self._malformed

    @property
    def first_malformed(self) -> bool:
        """The first data-carrying event was not JSON."""
        self._judge()
        return self._first_malformed

    def flush(self) -> None:
        """Judge (and hand ``sniff``) the reads collected so far: a full batch, or a stream that
        ended early."""
        self._judge()

    def _judge(self, *, last: bool = False) -> None:
        """Judge the whole events collected (``last``: everything, a final event without its
        blank line included)."""
        if not self.reads and not last:
            return
        joined = b"".join(self.reads)
        if self._sniff is not None and joined:
            self._sniff(joined)
        data = self._pending + joined if self._pending else joined
        self.reads.clear()
        self._size = 0
        if self.complete:
            self._pending = b""
            return
        held = b""
        if b"\r" in data:
            if data.endswith(b"\r") and not last:  # may be the first half of a \r\n split across reads
                data, held = data[:-1], b"\r"
            data = data.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
        if last:
            if not data.strip():
                whole = b""
            elif data.endswith(b"\n\n") and not data.endswith(b"\n\n\n"):
                whole = data  # it ends an event already: no copy
            else:
                whole = data.rstrip(b"\n") + b"\n\n"
            self._pending = b""
        else:
            end = data.rfind(b"\n\n") + 2
            whole, self._pending = data[:end], data[end:] + held
            if len(self._pending) > MAX_EVENT_BYTES:
                self._malformed += 1
                self._pending = b""
        if not whole:
            return
        self._tail = (self._tail[1], whole)
        if not (self.wire == "chat" and self._plain_chat(whole)):
            for event in whole.split(b"\n\n"):
                if self._event(event):
                    break  # what follows the end is not judged

    def _plain_chat(self, whole: bytes) -> bool:
        """Judge ``whole`` in one pass when each of its events is one ``data: `` line; False: not
        that shape (or not all JSON), to be judged event by event.

        The shape is read off one ``replace``: with every ``\\n\\ndata: `` between events turned
        into a comma, no line end may be left but the last blank line's, and the events are the
        commas put in plus one (each took 7 bytes out)."""
        if not whole.startswith(b"data: "):
            return False
        joined = whole.replace(_NEXT_DATA, b",")
        end = len(joined) - 2
        if joined.find(b"\n") != end:
            return False
        events = (len(whole) - len(joined)) // _SHRINK + 1
        done = whole.endswith(_LAST_DONE) or whole == _ONLY_DONE
        values = events - done
        if done:
            end -= len(_DONE) + (events > 1)  # the [DONE] and the comma before it
        if b'"error"' in joined:  # an error event ends the stream: judged event by event
            return False
        if values and not _json_values(b"".join((b"[", memoryview(joined)[6:end], b"]")), values):
            return False
        self._events += events
        self.complete = done
        return True

    def _event(self, raw: bytes) -> bool:
        """Judge one event; True: it ended the stream."""
        name = b""
        lines: list[bytes] = []
        for line in raw.split(b"\n"):
            if not line or line.startswith(b":"):
                continue
            field, _, rest = line.partition(b":")
            rest = rest.removeprefix(b" ")
            if field == b"data":
                lines.append(rest)
            elif field == b"event":
                name = rest
        if not lines:
            return False
        self._events += 1
        payload = b"\n".join(lines)
        if self.wire == "chat" and payload == _DONE:
            self.complete = True
            return True
        try:
            value: Any = orjson.loads(payload)
        except orjson.JSONDecodeError:
            self._malformed += 1
            self._first_malformed = self._events == 1
            return False
        if not isinstance(value, dict):
            return False
        if self.wire == "responses":
            kind = name.decode("utf-8", "replace") or str(value.get("type", ""))
            self.complete = kind in RESPONSES_TERMINAL
        else:
            self.complete = "error" in value
        return self.complete

    def ended_complete(self) -> bool:
        """At the stream's clean end: did it end as its wire format ends? A chat stream without
        [DONE] did when every choice named in its last events (the final one or two batches,
        ``BATCH_BYTES`` or more) has a ``finish_reason``."""
        self._judge(last=True)
        return self.complete or (self.wire == "chat" and _choices_finished(b"".join(self._tail)))

    def finish_reasons(self) -> list[str]:
        """The finish reasons of a chat stream's choices, by index, as its last events (the final
        one or two batches) name them; read once, at the end (a trace's attributes)."""
        self._judge(last=True)
        finished = _choices(b"".join(self._tail))[1]
        return [finished[index] for index in sorted(finished)]


def _json_values(array: bytes, count: int) -> bool:
    """``array`` is a JSON array of ``count`` values. Events that are not JSON each but join into
    as many values (``1,2`` ``[3`` ``4]``) would pass: no provider writes such."""
    try:
        return len(_RAW_ARRAY.decode(array)) == count
    except msgspec.DecodeError:
        return False


def _choices_finished(events: bytes) -> bool:
    """Every choice named in these chat events has a ``finish_reason`` (and there is one)."""
    opened, finished = _choices(events)
    return bool(opened) and opened <= finished.keys()


def _choices(events: bytes) -> tuple[set[int], dict[int, str]]:
    """The choice indexes these chat events name, and the finish reason each one ended with."""
    opened: set[int] = set()
    finished: dict[int, str] = {}
    for _, data in parse_sse(events)[0]:
        try:
            chunk: Any = orjson.loads(data)
        except orjson.JSONDecodeError:
            continue
        choices = chunk.get("choices") if isinstance(chunk, dict) else None
        for choice in choices if isinstance(choices, list) else ():
            index = choice.get("index", 0) if isinstance(choice, dict) else None
            if isinstance(index, int):
                opened.add(index)
                reason = choice.get("finish_reason")
                if reason:
                    finished[index] = reason if isinstance(reason, str) else str(reason)
    return opened, finished
