"""JSON Schemas shipped with the package (copies of the normative spec files)."""

from __future__ import annotations

from functools import cache
from importlib import resources
from typing import Any

import orjson


@cache
def load(name: str) -> dict[str, Any]:
    """Return a shipped schema by file name, e.g. ``response-envelope.schema.json``."""
    raw = resources.files(__package__).joinpath(name).read_bytes()
    doc: dict[str, Any] = orjson.loads(raw)
    return doc
