"""Client identity: who a bearer key is (its name and team from the keys file), never the key.

Keys file lines: ``KEY`` (the old format) or ``KEY name=alice team=search``; blank lines and
``#`` comments are ignored. A key without ``name=`` is an unnamed client: its metrics label is
``other`` and its identity is a hash of the key (never the key itself).

**The identity rule**, one for every feature (limits, feedback records, stream sessions, context
and caches): with client keys configured, a caller is its key's identity (its name, else
``key-<hash>``); without, every caller is the one ``anonymous`` client, whatever bearer it sends
(the SDKs' placeholder ``api_key="unused"`` and a curl without one are the same client).
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

OTHER = "other"
ANONYMOUS = "anonymous"
"""The client of a proxy without client keys: every request shares its limits."""
LABELS = frozenset({"name", "team"})
_NAME = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")
SHADOW = "cogproxy-shadow"
"""The proxy itself as a client: the shadow judge's spend (``feedback.shadow``)."""
HASHED_PREFIX = "key-"
_DERIVED = re.compile(rf"^({HASHED_PREFIX}[0-9a-f]{{16}}|{ANONYMOUS}|{SHADOW})$")
"""Identities the rule derives; a configured name never takes one (it would share its records)."""


@dataclass(frozen=True, slots=True)
class ClientIdentity:
    name: str | None = None
    team: str | None = None

    @property
    def label(self) -> str:
        """The bounded metrics label: the configured name, else ``other``."""
        return self.name or OTHER


@dataclass(frozen=True, slots=True)
class Caller:
    """A request's client as limits see it."""

    id: str
    """The client's identity (the rule in the module docstring): its name, else ``key-<hash>``,
    else ``anonymous``. Never holds ':' (stores put it before a trace id or a key)."""
    identity: ClientIdentity

    @property
    def label(self) -> str:
        return self.identity.label


ANONYMOUS_CALLER = Caller(ANONYMOUS, ClientIdentity())


def caller_of(token: str | None, identities: Mapping[str, ClientIdentity], *, keyed: bool) -> Caller:
    """The identity rule: ``keyed`` (client keys are configured, so ``token`` is one of them)
    -> the key's identity; else the one anonymous caller, whatever ``token`` is."""
    if not keyed or not token:
        return ANONYMOUS_CALLER
    identity = identities.get(token)
    if identity is not None and identity.name:
        return Caller(identity.name, identity)
    return Caller(
        HASHED_PREFIX + hashlib.sha256(token.encode()).hexdigest()[:16], identity or ClientIdentity()
    )


def parse_key_line(line: str, where: str) -> tuple[str, ClientIdentity] | None:
    """One keys-file line -> (key, identity); None for blank and comment lines."""
    parts = line.split()
    if not parts or parts[0].startswith("#"):
        return None
    labels: dict[str, str] = {}
    for part in parts[1:]:
        name, sep, value = part.partition("=")
        if not sep or name not in LABELS or not _NAME.match(value):
            what = f"label {name!r}" if sep and name.isidentifier() else "a word after the key"
            raise ValueError(  # never echoes the word: it may be a key pasted on the wrong line
                f"{where}: {what} is not name=NAME or team=TEAM (letters, digits, '_', '.', '-'); "
                "write KEY [name=NAME] [team=TEAM]"
            )
        if name == "name" and _DERIVED.match(value):
            raise ValueError(
                f"{where}: name={value} is an identity the proxy derives itself; choose another name"
            )
        labels[name] = value
    return parts[0], ClientIdentity(labels.get("name"), labels.get("team"))


def read_identities(path: Path) -> dict[str, ClientIdentity]:
    """Every key of a keys file with its name and team; a malformed label is a ValueError."""
    out: dict[str, ClientIdentity] = {}
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        parsed = parse_key_line(line, f"{path}:{number}")
        if parsed is not None:
            out[parsed[0]] = parsed[1]
    return out
