"""Turns a module call as it happens into chunks appended to its session.

The pipeline calls the ``Listener`` hooks: model text (parsed into field deltas), a provider
attempt starting (a failed try's deltas are void), an answer set aside (escalation or re-ask:
a progress chunk, then a snapshot that resets the streamed fields). ``finish`` appends the
decided answer: a final chunk for a success envelope, else an error chunk, either carrying the
answer as the sync call gives it (``chunks.ANSWER_KEY``).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from proxy.pipeline import ModuleAnswer
from proxy.state.stream_sessions import Session
from proxy.stream.chunks import (
    delta_chunk,
    error_chunk,
    final_chunk,
    progress_chunk,
    snapshot_chunk,
    with_answer,
)
from proxy.stream.fields import FieldDiffer


class ChunkEmitter:
    """The pipeline ``Listener`` of one streamed call."""

    def __init__(
        self, session: Session, fields: tuple[str, ...], on_first_delta: Callable[[float], None] | None = None
    ) -> None:
        self.session = session
        self._differ = FieldDiffer(fields)
        self._dirty = False
        self._started = time.perf_counter()
        self._on_first_delta = on_first_delta

    def _next_seq(self) -> int:
        return len(self.session.events) + 1

    def attempt(self) -> None:
        if self._dirty:  # a try failed after its text was streamed: start the fields over
            self.session.append(snapshot_chunk(self._next_seq(), {}))
            self._dirty = False
        self._differ.reset()

    def text(self, piece: str) -> bool:
        appended = False
        for field, delta, accumulated in self._differ.feed(piece):
            if self._on_first_delta is not None:
                self._on_first_delta(time.perf_counter() - self._started)
                self._on_first_delta = None
            self.session.append(delta_chunk(self._next_seq(), field, delta, accumulated))
            self._dirty = appended = True
        return appended

    def retrying(self, stage: str, from_rung: str, to_rung: str, reason: str) -> None:
        self.session.append(progress_chunk(self._next_seq(), stage, from_rung, to_rung, reason))
        self.session.append(snapshot_chunk(self._next_seq(), {}))
        self._dirty = False
        self._differ.reset()

    def finish(self, answer: ModuleAnswer, status: int) -> dict[str, Any]:
        """Append the decided answer (``status``: its HTTP status) as the last chunk and close the
        session; returns it."""
        envelope = answer.envelope
        if envelope.get("ok") is True:
            chunk = final_chunk(self._next_seq(), envelope, answer.usage, answer.cognitive())
        else:
            chunk = error_chunk(self._next_seq(), self.session.id, envelope, cognitive=answer.cognitive())
        self.session.append(with_answer(chunk, status, envelope))
        self.session.finish()
        return chunk

    def fail(self, envelope: dict[str, Any]) -> None:
        """End the session with ``envelope`` (the call itself could not finish)."""
        if not self.session.done:
            self.session.append(error_chunk(self._next_seq(), self.session.id, envelope))
            self.session.finish()
