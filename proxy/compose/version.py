"""Semver ranges of ``composition.requires[].version`` (composition.md §3.3) on ``packaging``.

``packaging.specifiers`` does ``==``, ``>=``, ``<``, ``!=`` and ``~=``; the npm forms the spec uses
(``^1.2.3`` compatible, ``~1.2.3`` patch-only, ``*`` any, a bare ``1.2.3`` exact) are translated to
its comparison clauses here, so one kept library does the comparing.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.version import InvalidVersion, Version

_PLAIN = re.compile(r"^v?(\d+)(?:\.(\d+))?(?:\.(\d+))?(?:[-+.].*)?$")


class RangeError(ValueError):
    """A version range that cannot be read."""


def _parts(text: str) -> tuple[int, int, int]:
    match = _PLAIN.match(text)
    if match is None:
        raise RangeError(f"not a semver version: {text!r}")
    return int(match[1]), int(match[2] or 0), int(match[3] or 0)


def _caret(text: str) -> str:
    major, minor, patch = _parts(text)
    if major:
        upper = f"{major + 1}.0.0"
    elif minor:
        upper = f"0.{minor + 1}.0"
    else:
        upper = f"0.0.{patch + 1}"
    return f">={text},<{upper}"


def _tilde(text: str) -> str:
    major, minor, _ = _parts(text)
    return f">={text},<{major}.{minor + 1}.0"


def _clauses(text: str) -> str:
    out = []
    for clause in re.split(r"[,\s]+", text.strip()):
        if not clause or clause in ("*", "x", "latest"):
            continue
        if clause.startswith("^"):
            out.append(_caret(clause[1:]))
        elif clause.startswith("~") and not clause.startswith("~="):
            out.append(_tilde(clause[1:]))
        elif clause[0].isdigit() or clause[0] == "v":
            out.append("==" + clause.lstrip("v"))
        elif clause.startswith("="):
            out.append("==" + clause.lstrip("="))
        else:
            out.append(clause)
    return ",".join(out)


@dataclass(frozen=True, slots=True)
class VersionRange:
    text: str
    specifier: SpecifierSet

    def allows(self, version: str) -> bool:
        try:
            parsed = Version(version)
        except InvalidVersion:
            return False
        return self.specifier.contains(parsed, prereleases=True)

    def __str__(self) -> str:
        return self.text


ANY = VersionRange("*", SpecifierSet(""))


def parse_range(text: str | None) -> VersionRange:
    """``text`` as a range; None or ``*`` allows any version. Raise ``RangeError``."""
    if text is None or not text.strip():
        return ANY
    try:
        return VersionRange(text, SpecifierSet(_clauses(text)))
    except InvalidSpecifier as exc:
        raise RangeError(f"not a version range: {text!r}") from exc
