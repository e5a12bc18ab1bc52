"""Which fields of ``data`` stream, and their growth as the model's JSON arrives.

The model's answer is parsed as it grows with ``jiter`` in partial mode (what the OpenAI SDK uses
for streamed structured outputs): ``trailing-strings`` keeps the unfinished last string, so a
field's value lengthens chunk by chunk and its new suffix is the delta. A value that stops being
an extension of what was sent (the model rewrote it) emits nothing more: the final chunk carries
the validated data, and clients render it over the preview.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, Final

import jiter

from proxy.jsonshape import as_dict
from proxy.module.model import Module

RATIONALE = "data.rationale"
PARTIAL_MODE: Final = "trailing-strings"
MAX_PARSED_BYTES = 256 * 1024
"""Beyond this much answer text no more deltas are parsed out (each parse reads the whole text
so far: this caps the quadratic cost); the final chunk still carries everything."""


def streamable_fields(module: Module) -> tuple[str, ...]:
    """``response.stream_fields`` of module.yaml, else ``data.rationale`` and the top-level
    string properties of the data schema."""
    declared = as_dict(module.manifest.get("response")).get("stream_fields")
    if isinstance(declared, list) and all(isinstance(f, str) for f in declared):
        return tuple(f for f in declared if f.startswith("data."))
    props = as_dict(module.data_schema.get("properties"))
    strings = [f"data.{name}" for name, spec in props.items() if as_dict(spec).get("type") == "string"]
    return (RATIONALE, *[f for f in strings if f != RATIONALE])


def _lookup(doc: Any, path: tuple[str, ...]) -> str | None:
    for key in path:
        if not isinstance(doc, dict):
            return None
        doc = doc.get(key)
    return doc if isinstance(doc, str) else None


class FieldDiffer:
    """Feed the model's text piece by piece; get ``(field, delta, accumulated)`` back."""

    def __init__(self, fields: tuple[str, ...]) -> None:
        self._paths = [(f, tuple(f.split("."))) for f in fields]
        self._buffer = bytearray()
        self._start = -1
        self.sent: dict[str, str] = {}

    def reset(self) -> None:
        self._buffer.clear()
        self._start = -1
        self.sent = {}

    def feed(self, piece: str) -> Iterator[tuple[str, str, str]]:
        self._buffer += piece.encode("utf-8")
        if self._start < 0:
            self._start = self._buffer.find(b"{")  # text or a code fence before the object
            if self._start < 0:
                return
        if len(self._buffer) > MAX_PARSED_BYTES:
            return
        try:
            doc = jiter.from_json(bytes(self._buffer[self._start :]), partial_mode=PARTIAL_MODE)
        except ValueError:
            return  # not JSON (yet, or ever): the contract decides at the end
        for field, path in self._paths:
            value = _lookup(doc, path)
            if value is None:
                continue
            before = self.sent.get(field, "")
            if len(value) > len(before) and value.startswith(before):
                self.sent[field] = value
                yield field, value[len(before) :], value
