"""Narrowing untyped JSON/YAML values to the shape the code expects, without ``.get(..., {})``."""

from __future__ import annotations

from typing import Any


def as_dict(value: Any) -> dict[str, Any]:
    """``value`` if it is an object, else an empty dict (for optional sections)."""
    return value if isinstance(value, dict) else {}


def as_list(value: Any) -> list[Any]:
    """``value`` if it is an array, else an empty list."""
    return value if isinstance(value, list) else []
