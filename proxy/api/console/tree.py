"""An envelope as rows of a table (path, kind, value), walked iteratively within bounds.

What a model wrote is data, never markup: each row is text the template escapes, and nothing is
ever a link. The walk keeps its own stack (10,000 nested arrays cost no recursion) and stops at
``MAX_ROWS``; deeper than ``MAX_DEPTH`` a container is one row saying how deep it went on.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import islice
from typing import Any

import orjson

MAX_ROWS = 2000
"""Rows rendered per envelope: a person reads tens; the rest is counted, and in the raw JSON."""
MAX_DEPTH = 32
"""Levels shown; a container below it is summarised (its size), not opened."""
MAX_TEXT = 2000
"""Characters of one value shown (the rest is counted)."""
MAX_RAW = 64 * 1024
"""Characters of the raw JSON shown."""


@dataclass(frozen=True, slots=True)
class Row:
    depth: int
    key: str
    kind: str
    """object | array | string | number | boolean | null"""
    text: str


@dataclass(frozen=True, slots=True)
class Tree:
    rows: tuple[Row, ...]
    omitted: bool
    """More rows than ``MAX_ROWS``: the table stops there."""


def _kind(value: Any) -> str:
    if isinstance(value, dict):
        return "object"
    if isinstance(value, list):
        return "array"
    if isinstance(value, str):
        return "string"
    if isinstance(value, bool):
        return "boolean"
    if value is None:
        return "null"
    return "number"


def _clip(text: str) -> str:
    return text if len(text) <= MAX_TEXT else f"{text[:MAX_TEXT]}… ({len(text) - MAX_TEXT} more characters)"


def _scalar(value: Any) -> str:
    if isinstance(value, str):
        return _clip(value)
    if isinstance(value, bool):
        return "true" if value else "false"
    return "null" if value is None else _clip(str(value))


def tree(value: Any) -> Tree:
    """``value``'s rows, depth first, in document order."""
    rows: list[Row] = []
    stack: list[tuple[int, str, Any]] = [(0, "", value)]
    while stack:
        if len(rows) >= MAX_ROWS:
            return Tree(tuple(rows), True)
        depth, key, item = stack.pop()
        kind = _kind(item)
        if kind == "object" or kind == "array":
            size = len(item)
            unit = "keys" if kind == "object" else "items"
            if depth >= MAX_DEPTH and size:
                rows.append(
                    Row(depth, key, kind, f"{size} {unit}, deeper than {MAX_DEPTH} levels: not shown")
                )
                continue
            rows.append(Row(depth, key, kind, f"{size} {unit}"))
            children = item.items() if kind == "object" else enumerate(item)
            room = MAX_ROWS - len(rows) + 1  # each child is a row at least: one more marks the cut
            stack.extend(reversed([(depth + 1, str(k), v) for k, v in islice(children, room)]))
        else:
            rows.append(Row(depth, key, kind, _scalar(item)))
    return Tree(tuple(rows), False)


def raw_json(value: Any) -> str:
    """``value`` as indented JSON text, clipped to ``MAX_RAW`` characters."""
    try:
        text = orjson.dumps(value, option=orjson.OPT_INDENT_2).decode()
    except orjson.JSONEncodeError as exc:
        return f"(not printable as JSON: {exc})"
    return text if len(text) <= MAX_RAW else f"{text[:MAX_RAW]}\n… ({len(text) - MAX_RAW} more characters)"
