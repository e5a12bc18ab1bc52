"""JSONPath expressions of dataflow mappings and conditions (composition.md §4.2) on ``jsonpath-ng``.

Compiled once at load. A path with a wildcard (``$.changes[*].risk``) gives the list of matches; any
other path gives its one value, or ``MISSING``. ``.length`` after a path that names a list, string or
object gives its size (§4.3's ``$.data.changes.length``), unless the data has a ``length`` field.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from jsonpath_ng.exceptions import JsonPathLexerError, JsonPathParserError
from jsonpath_ng.jsonpath import JSONPath
from jsonpath_ng.parser import parse as jsonpath_parse

MISSING: Any = object()
"""What a path finds where the document has nothing."""
MAX_PATH_CHARS = 500
"""A path is one line of module.yaml; longer is a mistake, not a query."""


class PathError(ValueError):
    """An expression that is not a JSONPath the mapping forms allow."""


def _compile(text: str) -> JSONPath:
    try:
        compiled: JSONPath = jsonpath_parse(text)
    except (
        JsonPathLexerError,
        JsonPathParserError,
        Exception,
    ) as exc:  # the parser raises bare Exception too
        raise PathError(f"not a JSONPath expression: {text!r} ({exc})") from exc
    return compiled


@dataclass(frozen=True, slots=True)
class Path:
    text: str
    compiled: JSONPath = field(repr=False, compare=False)
    parent: JSONPath | None = field(repr=False, compare=False)
    """The path without a trailing ``.length``, when it has one."""
    many: bool = False

    def find(self, document: Any) -> Any:
        matches = [m.value for m in self.compiled.find(document)]
        if self.many:
            return matches
        if matches:
            return matches[0]
        if self.parent is not None:
            found = [m.value for m in self.parent.find(document)]
            if found and isinstance(found[0], (list, str, dict)):
                return len(found[0])
        return MISSING


def parse_path(text: str) -> Path:
    text = text.strip()
    if not text.startswith("$") or len(text) > MAX_PATH_CHARS:
        raise PathError(f"a path starts with '$' and has at most {MAX_PATH_CHARS} characters: {text!r}")
    parent = _compile(text[: -len(".length")]) if text.endswith(".length") else None
    return Path(text, _compile(text), parent, many="*" in text or ".." in text)
