"""The Context Builder (spec §7.1): context the proxy can supply itself, so applications need not.

* ``conversation_history``: the earlier messages of a chat-completions module call, as
  ``{role, content}``, the oldest dropped first beyond ``max_turns``.
* ``previous_result``: the last accepted answer of ``from_module`` in the same session.
* ``session_state`` (and any other accepted type): what was emitted for it in this session;
  ``user_profile``: what was emitted for this user.

A read the store cannot answer (Redis down) leaves the type out and is reported in
``unavailable``, so a required type fails with a message that says why.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson

from proxy.context.identity import Identity, expand
from proxy.context.store import ContextStore, ContextUnavailable
from proxy.context.used import MESSAGES, SESSION_SOURCE, STORE_SOURCE, USER_SOURCE
from proxy.module.context_spec import (
    CONVERSATION_HISTORY,
    DEFAULT_KEY_PATTERNS,
    PREVIOUS_RESULT,
    ContextSpec,
)

HISTORY_ROLES = frozenset({"user", "assistant", "system"})


def stored_key(kind: str) -> str:
    """The key pattern under which context of ``kind`` is stored and read by default."""
    return DEFAULT_KEY_PATTERNS.get(kind, f"${{session_id}}:{kind}")


def result_key(identity: Identity, module: str) -> str | None:
    """Where the last accepted answer of ``module`` in the session is kept."""
    return None if identity.session_id is None else identity.key(identity.session_id, "result", module)


def source_of(pattern: str) -> str:
    """Whose key a stored type is read from (``X-Cognitive-Context``): the user's, the session's,
    or another one of the client's."""
    if "${user_id}" in pattern:
        return USER_SOURCE
    return SESSION_SOURCE if "${session_id}" in pattern else STORE_SOURCE


@dataclass
class Built:
    context: dict[str, Any] = field(default_factory=dict)
    unavailable: set[str] = field(default_factory=set)
    sources: dict[str, str] = field(default_factory=dict)
    """Where each type in ``context`` came from (``proxy.context.used``)."""


def history_of(messages: Sequence[Mapping[str, Any]], max_turns: int | None) -> list[dict[str, str]]:
    turns = [
        {"role": str(m["role"]), "content": str(m["content"])}
        for m in messages
        if m.get("role") in HISTORY_ROLES and isinstance(m.get("content"), str)
    ]
    return turns[-max_turns:] if max_turns else turns


def stored_reads(spec: ContextSpec, identity: Identity) -> dict[str, tuple[str, str]]:
    """The stored types ``spec`` accepts that ``identity`` can name: type -> (its key, its source).
    Pure: the module-call service reads these keys before the call (``proxy.context.prefetch``)."""
    reads: dict[str, tuple[str, str]] = {}
    for accept in spec.accepts:
        if accept.type == CONVERSATION_HISTORY:
            continue
        if accept.type == PREVIOUS_RESULT:
            key = result_key(identity, accept.from_module or "")
            if key is not None:
                reads[accept.type] = (key, SESSION_SOURCE)
        else:
            pattern = stored_key(accept.type)
            name = expand(pattern, identity, "", "")
            if name is not None:
                reads[accept.type] = (identity.key(name), source_of(pattern))
    return reads


async def build(
    spec: ContextSpec, identity: Identity, store: ContextStore, history: Sequence[Mapping[str, Any]]
) -> Built:
    built = Built()
    stored = stored_reads(spec, identity)
    for accept in spec.accepts:  # sources in the order the module accepts them
        if accept.type == CONVERSATION_HISTORY and history:
            built.context[accept.type] = history_of(history, accept.max_turns)
            built.sources[accept.type] = MESSAGES
        elif accept.type in stored:
            built.sources[accept.type] = stored[accept.type][1]
    reads = {kind: key for kind, (key, _) in stored.items()}
    if not reads:
        return built
    results = await asyncio.gather(*(store.get(k) for k in reads.values()), return_exceptions=True)
    for kind, result in zip(reads, results, strict=True):
        if isinstance(result, ContextUnavailable):
            built.unavailable.add(kind)
        elif isinstance(result, BaseException):
            raise result
        elif result is not None:
            try:
                built.context[kind] = orjson.loads(result)
            except orjson.JSONDecodeError:
                built.unavailable.add(kind)
    return built


def merge(built: Mapping[str, Any], client: Mapping[str, Any]) -> dict[str, Any]:
    """Client-supplied context wins over built context, field by field: for an object both
    supply, the client's fields replace the built ones and the built fields it does not name
    stay; any other value the client gives replaces the built one whole."""
    merged = dict(built)
    for kind, value in client.items():
        before = merged.get(kind)
        merged[kind] = {**before, **value} if isinstance(before, dict) and isinstance(value, dict) else value
    return merged
