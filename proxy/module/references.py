"""``{{name.path}}`` references to composition step results (composition.md §5.4), found in one
linear pass with no regex.

The text searched holds the client's own ``$ARGUMENTS`` by the time results are injected, so the
cost must not depend on its shape: the regex this replaces (a lazy name before a repeated path)
took 11 s on 40 KB of ``{{a.data.data…``. Grammar, as before::

    "{{" ws* name "." root ("." segment)* ws* "}}"
    name    := [a-z0-9][a-z0-9._-]*   (the shortest that leaves a valid root and path)
    root    := ok | meta | data | error | partial_data
    segment := [A-Za-z0-9_-]+

``Found.steps`` counts the characters looked at (the tests bound it by the length).
"""

from __future__ import annotations

import string
from collections.abc import Iterator
from dataclasses import dataclass, field

ROOTS = frozenset({"ok", "meta", "data", "error", "partial_data"})
_NAME_FIRST = frozenset(string.ascii_lowercase + string.digits)
_NAME = _NAME_FIRST | frozenset("._-")
_SEGMENT = frozenset(string.ascii_letters + string.digits + "_-")
_RUN = _SEGMENT | frozenset(".")
_SPACE = frozenset(" \t\n\r\f\v")


@dataclass(frozen=True, slots=True)
class Reference:
    start: int
    end: int
    name: str
    path: str


@dataclass
class Found:
    references: list[Reference] = field(default_factory=list)
    steps: int = 0


def _split(run: str) -> tuple[str, str] | None:
    """(name, path) of the characters between the braces, the shortest name first."""
    parts = run.split(".")
    valid_after = [True] * (len(parts) + 1)  # valid_after[k]: parts[k:] are all path segments
    for k in range(len(parts) - 1, -1, -1):
        valid_after[k] = valid_after[k + 1] and bool(parts[k]) and set(parts[k]) <= _SEGMENT
    if not parts[0] or parts[0][0] not in _NAME_FIRST:
        return None
    end = -1  # where the name ends in ``run`` (the dot before parts[k])
    for k in range(1, len(parts)):
        end += len(parts[k - 1]) + 1
        if not set(parts[k - 1]) <= _NAME:
            return None  # a longer name holds this part too
        if parts[k] in ROOTS and valid_after[k + 1]:
            return run[:end], run[end + 1 :]
    return None


def scan(text: str) -> Found:
    found = Found()
    for ref in _references(text, found):
        found.references.append(ref)
    return found


def _references(text: str, found: Found) -> Iterator[Reference]:
    at = 0
    while (start := text.find("{{", at)) >= 0:
        found.steps += start + 2 - at
        i = start + 2
        while i < len(text) and text[i] in _SPACE:
            i += 1
        begin = i
        while i < len(text) and text[i] in _RUN:
            i += 1
        run_end = i
        while i < len(text) and text[i] in _SPACE:
            i += 1
        found.steps += i - start - 2
        parsed = _split(text[begin:run_end]) if text.startswith("}}", i) else None
        if parsed is None:
            at = start + 1
            continue
        found.steps += run_end - begin  # the split
        yield Reference(start, i + 2, *parsed)
        at = i + 2
