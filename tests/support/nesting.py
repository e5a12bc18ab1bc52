"""Nested test values for the depth cuts of the redaction and the context sanitiser."""

from __future__ import annotations

from typing import Any


def nested(levels: int, leaf: Any) -> Any:
    """``leaf`` under ``levels`` dicts: it is walked at depth ``levels``."""
    value = leaf
    for _ in range(levels):
        value = {"a": value}
    return value


def leaf_of(value: Any) -> Any:
    while isinstance(value, dict):
        value = value["a"]
    return value
