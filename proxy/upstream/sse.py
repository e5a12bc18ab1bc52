"""Server-sent events: splitting bytes into events, and when a forwarded stream is complete.

:func:`parse_sse` splits bytes into whole events for the clients that read a stream (the
Anthropic client, a streamed module call). :class:`StreamCheck` watches a forwarded stream with
incremental event framing and one rule per wire format; the bytes are only watched, never
changed or re-encoded. Events may split across TCP chunks; an event ends at a blank line
(``\\n\\n``, ``\\r\\n\\r\\n`` or ``\\r\\r``); ``data:`` lines are joined with ``\\n``; comments
(``: keep-alive``) are not events.

Complete means the stream ended as its wire format ends:

* ``chat`` (chat completions, legacy completions): ``data: [DONE]``; for providers that send
  none, every choice seen has a ``finish_reason``. An upstream ``{"error": ...}`` event also ends it.
* ``responses`` (Responses API): a ``response.completed``, ``response.failed``,
  ``response.incomplete`` or ``error`` event.

A ``data`` payload that is not JSON (nor ``[DONE]``) is a malformed chunk: counted, forwarded as is.
"""

from __future__ import annotations

from typing import Any, Literal

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
_DONE = b"[DONE]"


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
    """Feed it the stream's bytes as forwarded; ``events``, ``malformed`` and ``complete`` follow."""

    def __init__(self, wire: WireFormat) -> None:
        self.wire = wire
        self.events = 0
        """Data-carrying events seen (the first one is the stream's first real chunk)."""
        self.malformed = 0
        self.first_malformed = False
        """The first data-carrying event was not JSON."""
        self.complete = False
        self._pending = b""
        self._open_choices: set[int] = set()
        self._finished_choices: set[int] = set()
        self.finished = False
        """Every choice seen has a ``finish_reason`` (complete for providers that send no [DONE])."""

    def feed(self, chunk: bytes) -> None:
        if self.complete:
            return
        data = self._pending + chunk if self._pending else chunk
        held = b""
        if b"\r" in data:
            if data.endswith(b"\r"):  # may be the first half of a \r\n split across chunks
                data, held = data[:-1], b"\r"
            data = data.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
        end = data.rfind(b"\n\n")
        if end == -1:
            self._pending = data
        else:
            self._pending = data[end + 2 :]
            for event in data[:end].split(b"\n\n"):
                self._event(event)
        self._pending += held
        if len(self._pending) > MAX_EVENT_BYTES:
            self.malformed += 1
            self._pending = b""

    def _event(self, raw: bytes) -> None:
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
            return
        self.events += 1
        payload = b"\n".join(lines)
        if self.wire == "chat" and payload == _DONE:
            self.complete = True
            return
        try:
            value: Any = orjson.loads(payload)
        except orjson.JSONDecodeError:
            self.malformed += 1
            self.first_malformed = self.events == 1
            return
        if not isinstance(value, dict):
            return
        if self.wire == "responses":
            kind = name.decode("utf-8", "replace") or str(value.get("type", ""))
            self.complete = kind in RESPONSES_TERMINAL
        else:
            self._chat_chunk(value)

    def _chat_chunk(self, chunk: dict[str, Any]) -> None:
        if "error" in chunk:
            self.complete = True
            return
        choices = chunk.get("choices")
        if not isinstance(choices, list):
            return
        for choice in choices:
            if not isinstance(choice, dict):
                continue
            index = choice.get("index", 0)
            if not isinstance(index, int):
                continue
            self._open_choices.add(index)
            if choice.get("finish_reason"):
                self._finished_choices.add(index)
        # No [DONE] is coming from some providers: every choice finished is a complete answer.
        self.finished = bool(self._open_choices) and self._open_choices <= self._finished_choices

    def ended_complete(self) -> bool:
        """At the stream's clean end: did it end as its wire format ends?"""
        if self._pending.strip():
            self.feed(b"\n\n")  # a last event without its blank line: judged as sent
        return self.complete or self.finished
