"""A module's ``tools`` policy applied to a call: what the provider may see, what the answer may call.

Tools come from the client (chat ``tools``); the module decides which of them reach the model
(``tools.allowed``/``denied`` over ``tools.policy``, deny by default as module.yaml's schema says).
A tool call in the answer to a tool the module does not permit is a contract failure (E4007).
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from proxy.jsonshape import as_dict
from proxy.module.model import Module


def tool_name(tool: Mapping[str, Any]) -> str:
    """An OpenAI tool's name (``function.name``; ``name`` for other tool types)."""
    return str(as_dict(tool.get("function")).get("name") or tool.get("name") or tool.get("type") or "")


def permitted_tools(
    module: Module, tools: Sequence[Mapping[str, Any]]
) -> tuple[tuple[Mapping[str, Any], ...], tuple[str, ...]]:
    """The tools the module permits, and the names of those stripped."""
    kept = tuple(t for t in tools if module.tools.permits(tool_name(t)))
    stripped = tuple(tool_name(t) for t in tools if not module.tools.permits(tool_name(t)))
    return kept, stripped


def denied_tool_calls(reply: Mapping[str, Any], module: Module) -> tuple[str, ...]:
    """Names of tools the answer calls that the module does not permit."""
    try:
        calls = reply["choices"][0]["message"].get("tool_calls") or ()
    except (KeyError, IndexError, TypeError, AttributeError):
        return ()
    if not isinstance(calls, list):
        return ()
    names = (str(as_dict(as_dict(c).get("function")).get("name", "")) for c in calls)
    return tuple(n for n in names if not module.tools.permits(n))


_NETWORK_URL = re.compile(r"^(?:https?|ftp|wss?)://", re.IGNORECASE)
_URL_FORMATS = frozenset({"uri", "url", "iri", "uri-reference", "iri-reference"})
_URL_KEYS = frozenset({"url", "image_url", "audio_url", "video_url", "file_url"})


def _url_paths(value: Any, schema: Mapping[str, Any], path: str, depth: int) -> Iterator[str]:
    if depth > _MAX_WALK_DEPTH:
        return
    if isinstance(value, str):
        if schema.get("format") in _URL_FORMATS and _NETWORK_URL.match(value):
            yield path
        return
    if isinstance(value, dict):
        props = as_dict(schema.get("properties"))
        for key, item in value.items():
            where = f"{path}.{key}"
            if key in _URL_KEYS and isinstance(item, str) and _NETWORK_URL.match(item):
                yield where
                continue
            child = props.get(key)
            yield from _url_paths(item, child if isinstance(child, dict) else {}, where, depth + 1)
    elif isinstance(value, list):
        items = schema.get("items")
        for i, item in enumerate(value):
            yield from _url_paths(item, items if isinstance(items, dict) else {}, f"{path}[{i}]", depth + 1)


_MAX_WALK_DEPTH = 64
"""Input depth is bounded before this runs (check_input); this only keeps the walk finite."""


def network_violation(module: Module, value: Any) -> str | None:
    """Where the input carries a network URL (a media ``url``, a ``format: uri`` field) for a
    module that declares ``policies.network: deny``: the proxy fetches nothing for it."""
    if not module.network_denied:
        return None
    return next(_url_paths(value, module.input_schema or {}, "input", 0), None)
