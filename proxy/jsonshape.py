"""Narrowing untyped JSON/YAML values to the shape the code expects, without ``.get(..., {})``."""

from __future__ import annotations

from typing import Any

import orjson


def as_dict(value: Any) -> dict[str, Any]:
    """``value`` if it is an object, else an empty dict (for optional sections)."""
    return value if isinstance(value, dict) else {}


def as_list(value: Any) -> list[Any]:
    """``value`` if it is an array, else an empty list."""
    return value if isinstance(value, list) else []


# Nesting of objects and arrays allowed in a module input and in a model's answer. Real inputs and
# answers nest well under 20 levels; 64 keeps every later step safe: orjson.dumps refuses more than
# 254 levels, orjson.loads more than 1024, and validation, repair and deepcopy recurse in Python.
MAX_JSON_DEPTH = 64

# Nesting allowed in a passthrough chat body, which the proxy re-encodes for the provider:
# orjson.dumps refuses more than about 250 levels, so a deeper body could never be sent.
MAX_FORWARDED_DEPTH = 250


def encodable(value: Any) -> bool:
    """Whether orjson can write ``value`` again (it refuses nesting past its recursion limit,
    ``MAX_FORWARDED_DEPTH`` and a little more). One pass in C: a body of any size is checked in
    a fraction of what walking it in Python takes."""
    try:
        orjson.dumps(value)
    except TypeError:  # orjson.JSONEncodeError: the recursion limit (a decoded body has no other)
        return False
    return True


def deeper_than(value: Any, limit: int = MAX_JSON_DEPTH) -> bool:
    """Whether ``value`` nests objects/arrays more than ``limit`` levels deep. Breadth-first and
    iterative: linear in the size of ``value`` and safe at any depth the decoder produced."""
    level: list[Any] = [value]  # the values at one nesting level
    for _ in range(limit):
        level = [
            child
            for item in level
            if isinstance(item, dict | list)
            for child in (item.values() if isinstance(item, dict) else item)
        ]
        if not level:
            return False
    return any(isinstance(item, dict | list) for item in level)
