"""What context a module call used, and where each type came from: the ``X-Cognitive-Context``
header and ``cognitive.context``, so a session can be seen working without reading the model's
prompt.

The header is a list of ``type=source`` items (RFC 8941 dictionary syntax), in the order the
model sees them, e.g. ``conversation_history=messages;turns=2, previous_result=session,
session_state=session+client``; ``none`` when the call used no context. Sources:

* ``messages``: built from the earlier messages of a chat call (``turns``: how many were kept);
* ``session`` / ``user`` / ``store``: read from the context store under the session's, the user's
  or another key;
* ``client``: the request's ``_context`` (it replaced anything built);
* ``<built>+client``: an object both gave, merged field by field;
* ``unavailable``: the store could not be read (Redis down), so the type was left out.

Only type names (declared by the module, percent-encoded outside ``[A-Za-z0-9_.-]``), sources
and counts: never a value, an id or a key.
"""

from __future__ import annotations

from collections.abc import Mapping, Set
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

CONTEXT_HEADER = "X-Cognitive-Context"
NONE = "none"
MESSAGES = "messages"
SESSION_SOURCE = "session"
USER_SOURCE = "user"
STORE_SOURCE = "store"
CLIENT = "client"
UNAVAILABLE = "unavailable"
MAX_LISTED = 16
"""Types named in the header; past it one ``*omitted=N`` item counts the rest. A module accepts a
handful of types; the bound keeps a manifest with hundreds from making a header proxies refuse."""
MAX_NAME_CHARS = 64
"""Characters of one (encoded) type name in the header: 16 x 64 keeps the header under 1.5 KiB."""


@dataclass(frozen=True, slots=True)
class Used:
    """One context type the model saw (or that could not be read)."""

    type: str
    source: str
    turns: int | None = None

    def as_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"type": self.type, "source": self.source}
        if self.turns is not None:
            out["turns"] = self.turns
        return out

    def item(self) -> str:
        name = _header_name(self.type)
        return f"{name}={self.source}" + (f";turns={self.turns}" if self.turns is not None else "")


def _header_name(kind: str) -> str:
    """``kind`` percent-encoded, cut to ``MAX_NAME_CHARS`` on a whole character (never inside an
    escape); a character UTF-8 cannot hold (a lone surrogate) becomes ``?`` rather than an exception."""
    out = ""
    for char in kind:
        part = quote(char, safe="_.-", errors="replace")
        if len(out) + len(part) > MAX_NAME_CHARS:
            break
        out += part
    return out


@dataclass(frozen=True, slots=True)
class ContextUsed:
    entries: tuple[Used, ...] = ()

    def header(self) -> str:
        if not self.entries:
            return NONE
        items = [u.item() for u in self.entries[:MAX_LISTED]]
        if len(self.entries) > MAX_LISTED:
            items.append(f"*omitted={len(self.entries) - MAX_LISTED}")
        return ", ".join(items)

    def as_list(self) -> list[dict[str, Any]]:
        return [u.as_dict() for u in self.entries]


def context_used(
    context: Mapping[str, Any],
    built: Mapping[str, Any],
    sources: Mapping[str, str],
    client: Mapping[str, Any],
    unavailable: Set[str],
) -> ContextUsed:
    """``context``: what the model is shown, by type; ``built``: what the proxy built, with the
    ``sources`` of each type; ``client``: the request's ``_context``; ``unavailable``: types the
    store could not read."""
    entries = []
    for kind, value in context.items():
        if kind not in client:
            source = sources.get(kind, CLIENT)
        elif isinstance(built.get(kind), dict) and isinstance(client[kind], dict):
            source = f"{sources.get(kind, CLIENT)}+{CLIENT}"
        else:
            source = CLIENT
        turns = len(value) if source == MESSAGES and isinstance(value, list) else None
        entries.append(Used(kind, source, turns))
    entries += [Used(kind, UNAVAILABLE) for kind in sorted(unavailable) if kind not in context]
    return ContextUsed(tuple(entries))
