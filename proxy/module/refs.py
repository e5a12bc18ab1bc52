"""The ``$ref`` rule of module schemas: local pointers and files inside the module, nothing else.

A ``$ref`` may be a pointer into its own document (``#/definitions/x``) or a relative file
reference (``common.json``, ``defs/types.json#/definitions/id``) that resolves, symlinks
followed, to a file inside the module directory. Those files are read here, once, and handed to
the schema compiler, which fetches nothing itself (``proxy.json_schema``). Anything else (a
URL of any scheme, ``URL:http://...``, an absolute path, ``..`` out of the directory) is refused
with the JSON path of the ``$ref`` key.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

import orjson


class RefError(ValueError):
    """A ``$ref`` that breaks the rule; ``path`` is the file, ``pointer`` the key's JSON path."""

    def __init__(self, path: Path, pointer: str, reason: str) -> None:
        super().__init__(f"$ref at {pointer}: {reason}")
        self.path = path
        self.pointer = pointer


def _pointer_token(key: str) -> str:
    return key.replace("~", "~0").replace("/", "~1")


def _refs(doc: Any) -> Iterator[tuple[str, Any]]:
    """Every ``$ref`` of ``doc`` with the JSON pointer of its key (iterative walk). Also inside
    ``enum``/``const``/``default`` values: the compiler follows those too, for its messages."""
    stack: list[tuple[str, Any]] = [("#", doc)]
    while stack:
        pointer, node = stack.pop()
        if isinstance(node, dict):
            for key, value in node.items():
                here = f"{pointer}/{_pointer_token(str(key))}"
                if key == "$ref" and not isinstance(value, dict):
                    yield here, value
                else:
                    stack.append((here, value))
        elif isinstance(node, list):
            stack.extend((f"{pointer}/{i}", item) for i, item in enumerate(node))


def _target(ref: Any, source: Path, root: Path, pointer: str) -> str | None:
    """The module-relative POSIX path a file ``$ref`` names (None for a local pointer)."""
    if not isinstance(ref, str):
        raise RefError(source, pointer, f"must be a string, got {type(ref).__name__}")
    if ref.startswith("#"):
        return None
    allowed = "only local pointers ('#/...') and relative files inside the module directory are allowed"
    parts = urlsplit(ref)
    if parts.scheme or parts.netloc or not parts.path or parts.query:
        raise RefError(source, pointer, f"{ref!r} is not allowed: {allowed}")
    relative = unquote(parts.path)
    if relative.startswith("/") or "\\" in relative:
        raise RefError(source, pointer, f"{ref!r} is not allowed: {allowed}")
    target = (source.parent / relative).resolve()
    if not target.is_relative_to(root):
        raise RefError(source, pointer, f"{ref!r} resolves outside the module directory: {allowed}")
    if not target.is_file():
        raise RefError(source, pointer, f"{ref!r}: no such file in the module directory")
    return target.relative_to(root).as_posix()


def referenced_files(schema: dict[str, Any], source: Path, root: Path) -> dict[str, Any]:
    """Check every ``$ref`` of ``schema`` (read from ``source``) and of the files it names,
    transitively; return those files' documents by module-relative path. Raises ``RefError``."""
    root = root.resolve()
    documents: dict[str, Any] = {}
    pending: list[tuple[Any, Path]] = [(schema, source.resolve())]
    while pending:
        doc, where = pending.pop()
        for pointer, ref in _refs(doc):
            name = _target(ref, where, root, pointer)
            if name is None or name in documents:
                continue
            path = root / name
            try:
                loaded = orjson.loads(path.read_bytes())
            except (OSError, orjson.JSONDecodeError) as exc:
                raise RefError(where, pointer, f"{ref!r}: {name} is not readable JSON ({exc})") from exc
            documents[name] = loaded
            pending.append((loaded, path))
    return documents
