"""One wording for YAML syntax errors: the line and column, then what went wrong."""

from __future__ import annotations

import yaml


def describe(exc: yaml.YAMLError) -> str:
    """``line 3, column 1: invalid YAML: did not find expected node content (while parsing ...)``
    instead of PyYAML's multi-line text about ``<unicode string>``."""
    if isinstance(exc, yaml.reader.ReaderError):  # a character YAML refuses: no line, an offset
        what = f"unacceptable character #x{exc.character:04x}: {exc.reason}"
        return f"character {exc.position}: invalid YAML: {what}"
    mark = getattr(exc, "problem_mark", None)
    problem = getattr(exc, "problem", None) or str(exc)
    context = getattr(exc, "context", None)
    where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark is not None else ""
    return f"{where}invalid YAML: {problem}" + (f" ({context})" if context else "")
