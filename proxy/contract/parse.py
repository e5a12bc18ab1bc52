"""Stage 1: the model's raw text -> one JSON object.

Strict JSON first; then the first fenced block (```json ... ```) that holds an object; then the
first object embedded in prose. Nothing is *repaired* here: a truncated or malformed object is a
PARSE_ERROR, never completed by guesswork (that would invent business data). NaN and Infinity
are not JSON numbers and are refused on every path.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any, Literal

import orjson

Method = Literal["strict", "fence", "prose"]

_FENCE = re.compile(r"```[ \t]*(?:json|JSON|jsonc|javascript)?[ \t]*\r?\n(.*?)```", re.DOTALL)
# Bounds the prose scan so that hostile text full of '{' costs O(n), not O(n^2).
_MAX_PROSE_STARTS = 64


class ParseFailure(ValueError):
    """The text holds no JSON object. ``reason`` says why, for the E1000 envelope."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


@dataclass(frozen=True, slots=True)
class Parsed:
    value: dict[str, Any]
    method: Method


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a valid JSON number")


_DECODER = json.JSONDecoder(parse_constant=_refuse_constant)


def _loads(text: str) -> Any:
    try:
        return orjson.loads(text)
    except orjson.JSONDecodeError:
        # orjson refuses integers beyond 64 bits; the stdlib decoder (NaN refused) takes them.
        value, end = _DECODER.raw_decode(text)
        if text[end:].strip():
            raise ValueError("extra data after the JSON value") from None
        return value


def _describe(value: Any) -> str:
    return {list: "an array", str: "a string", bool: "a boolean", type(None): "null"}.get(
        type(value), "a number"
    )


def parse_json_object(text: str) -> Parsed:
    """Find the JSON object in ``text``; raise ``ParseFailure`` when there is none."""
    stripped = text.strip().lstrip("\ufeff")
    if not stripped:
        raise ParseFailure("the model returned no text")
    strict_error = ""
    try:
        value = _loads(stripped)
    except ValueError as exc:
        strict_error = str(exc)
    else:
        if isinstance(value, dict):
            return Parsed(value, "strict")
        strict_error = f"expected a JSON object, got {_describe(value)}"

    for match in _FENCE.finditer(stripped):
        try:
            value = _loads(match.group(1).strip())
        except ValueError:
            continue
        if isinstance(value, dict):
            return Parsed(value, "fence")

    start = stripped.find("{")
    tries = 0
    while start != -1 and tries < _MAX_PROSE_STARTS:
        tries += 1
        try:
            value, _ = _DECODER.raw_decode(stripped, start)
        except ValueError:
            pass
        else:
            if isinstance(value, dict):
                return Parsed(value, "prose")
        start = stripped.find("{", start + 1)
    raise ParseFailure(f"no JSON object found in the model output ({strict_error})")
