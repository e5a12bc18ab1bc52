"""Stage 1: the model's raw text -> one JSON object.

The whole answer parsed strictly always wins. Otherwise one linear, string-aware scan finds the
*top-level* objects of the text (in prose or in a fenced block): never an object nested inside
another object or array, even an unclosed one. Exactly one candidate that parses is the answer;
two or more are ambiguous (a quoted envelope must not be able to steer the decision); unbalanced
text is truncated. Nothing is *repaired* here: a truncated or malformed object is a PARSE_ERROR,
never completed by guesswork (that would invent business data). NaN and Infinity are not JSON
numbers and are refused on every path. Every stage is linear in the length of the text.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Literal

import orjson

from proxy.jsonshape import MAX_JSON_DEPTH, deeper_than

Method = Literal["strict", "fence", "prose"]

# Candidates decoded at most. Two valid objects already make the answer ambiguous; the bound keeps
# a flood of '{}' from paying Python overhead per candidate beyond what the report needs.
MAX_DECODED_CANDIDATES = 64

_AT_TOP = re.compile(r"[{\[]|`{3,}")  # openers, and fence markers (only meaningful at depth 0)
_INSIDE = re.compile(r'[{}\[\]"]')
_IN_STRING = re.compile(r'["\\]')
_CLOSES = {"}": "{", "]": "["}
_FENCE_OPENER = re.compile(r"`{3,}[A-Za-z0-9_+-]*")  # ```json, ```JSON, ```
_FENCE_CLOSER = re.compile(r"`{3,}")


class ParseFailure(ValueError):
    """The text holds no single JSON object. ``reason`` says why, for the E1000 envelope."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


@dataclass(frozen=True, slots=True)
class Parsed:
    value: dict[str, Any]
    method: Method
    span: tuple[int, int] = (0, 0)
    """Where the object is in the text given to ``parse_json_object``: ``text[start:end]``."""
    alone: bool = True
    """Whether the object is the whole answer, or alone in one fenced block; False when prose
    surrounds it (it may be a quotation of the input rather than the model's own answer)."""


@dataclass(frozen=True, slots=True)
class Span:
    start: int
    end: int
    fenced: bool


@dataclass(slots=True)
class Scan:
    """What one pass over the text found; ``visited`` and ``steps`` measure its cost."""

    spans: list[Span] = field(default_factory=list)
    unclosed: str = ""
    malformed: str = ""
    too_deep: bool = False
    visited: int = 0
    """Characters the pass stepped over (never more than the text's length)."""
    steps: int = 0
    """Structural characters handled one by one in Python (never more than the text's length)."""


def scan(text: str) -> Scan:
    """One left-to-right pass: the spans of complete top-level objects, and whether the text is
    balanced. Quotes count only inside a JSON value (prose apostrophes and quotes are not strings);
    a closer at depth 0 is prose."""
    out = Scan()
    stack: list[str] = []
    pos, start, fenced, n = 0, 0, False, len(text)
    while pos < n:
        out.steps += 1
        if not stack:
            match = _AT_TOP.search(text, pos)
            if match is None:
                break
            char = match.group()
            if char[0] == "`":
                fenced = not fenced
            else:
                stack.append(char)
                start = match.start()
            pos = match.end()
            continue
        match = _INSIDE.search(text, pos)
        if match is None:
            break
        char, pos = match.group(), match.end()
        if char == '"':
            while True:
                out.steps += 1
                end = _IN_STRING.search(text, pos)
                if end is None:
                    out.visited = n
                    out.unclosed = f"a string opened inside the value at offset {start} is never closed"
                    return out
                pos = end.end()
                if end.group() == '"':
                    break
                pos += 1  # the escaped character
        elif char in _CLOSES:
            if stack.pop() != _CLOSES[char]:
                out.visited = pos
                out.malformed = f"unbalanced brackets: {char!r} at offset {pos - 1} closes the wrong opener"
                return out
            if not stack and char == "}":
                out.spans.append(Span(start, pos, fenced))
        else:
            stack.append(char)
            if len(stack) > MAX_JSON_DEPTH:
                out.visited = pos
                out.too_deep = True
                return out
    out.visited = n
    if stack:
        kind = "an object" if stack[0] == "{" else "an array"
        out.unclosed = f"{kind} opened at offset {start} is never closed"
    return out


def _loads(text: str) -> Any:
    """Strict JSON, as orjson reads it: NaN, Infinity, numbers beyond a double and lone surrogates
    are refused. No lenient fallback: the stdlib decoder takes the last two, and an envelope
    holding them cannot be written back to the caller (orjson refuses to encode them: a 500)."""
    return orjson.loads(text)


def _describe(value: Any) -> str:
    return {list: "an array", str: "a string", bool: "a boolean", type(None): "null"}.get(
        type(value), "a number"
    )


def _trimmed(text: str) -> tuple[str, int]:
    """``text`` without surrounding whitespace and byte-order mark, and the offset it starts at."""
    body = text.lstrip()
    body = body.lstrip("\ufeff").lstrip()
    return body.rstrip(), len(text) - len(body)


def parse_json_object(text: str) -> Parsed:
    """Find the one JSON object in ``text``; raise ``ParseFailure`` when there is not exactly one."""
    body, offset = _trimmed(text)
    if not body:
        raise ParseFailure("the model returned no text")
    value: Any = None
    strict_error = ""
    try:
        value = _loads(body)
    except ValueError as exc:
        strict_error = str(exc)
    else:  # the common case, without a scan: an object parsed whole nests as deep as its text
        if isinstance(value, dict) and not deeper_than(value):
            return Parsed(value, "strict", (offset, offset + len(body)))
    found = scan(body)
    if found.too_deep:
        raise ParseFailure(f"too deeply nested: more than {MAX_JSON_DEPTH} levels of objects and arrays")
    if not strict_error:  # parsed whole, not an object (an object too deep was refused just above)
        raise ParseFailure(f"expected a JSON object, got {_describe(value)}")
    if found.malformed:
        raise ParseFailure(found.malformed)
    if found.unclosed:
        raise ParseFailure(f"truncated: {found.unclosed}")
    objects: list[tuple[dict[str, Any], Span]] = []
    for span in found.spans:
        try:
            candidate = _loads(body[span.start : span.end])
        except ValueError:
            continue
        if isinstance(candidate, dict):
            objects.append((candidate, span))
            if len(objects) >= MAX_DECODED_CANDIDATES:
                break
    if len(objects) > 1:
        more = " or more" if len(objects) >= MAX_DECODED_CANDIDATES else ""
        raise ParseFailure(
            f"ambiguous: {len(objects)}{more} envelopes at the top level of the answer"
            " (answer with exactly one JSON object)"
        )
    if not objects:
        raise ParseFailure(f"no JSON object found in the model output ({strict_error})")
    value, span = objects[0]
    return Parsed(
        value,
        "fence" if span.fenced else "prose",
        (offset + span.start, offset + span.end),
        _alone(body, span),
    )


def _alone(body: str, span: Span) -> bool:
    """Whether only whitespace, or one fence around it, surrounds the object (linear: the
    patterns have no nested repetition)."""
    before, after = body[: span.start].strip(), body[span.end :].strip()
    if not before and not after:
        return True
    return bool(span.fenced and _FENCE_OPENER.fullmatch(before) and _FENCE_CLOSER.fullmatch(after))
