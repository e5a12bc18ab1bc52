"""Context sanitisation before the model (spec §7.3).

Values under credential-like names are replaced (the names are configurable, by default the
spec's password/token/secret/key plus authorization), string values that look like credentials
are masked with the detector the logs use (``proxy.redact``), long strings are cut, and the
whole context is bounded. What was redacted is reported by path (never by value).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from proxy.redact import REDACTED, is_secret_key, redact_text

DEFAULT_SENSITIVE_NAMES = (
    "password",
    "passwd",
    "token",
    "secret",
    "key",
    "authorization",
    "cookie",
    "credential",
)
"""Spec §7.3's list (password, token, secret, key) plus the names the log redaction covers."""
MAX_STRING_CHARS = 10_000
"""Spec §7.3: strings are truncated at 10,000 characters."""
MAX_CONTEXT_BYTES = 256 * 1024
"""The sanitised context as JSON: ten turns of 10,000-character history (~100 KB) plus a session
state and a previous result fit twice over; more is a context the model should not be handed
(and a prompt that would not fit most models' windows anyway)."""
MAX_DEPTH = 32
"""Nesting the walk follows; deeper values are replaced (the input check allows 64 for the whole
input, and context is part of it)."""
TRUNCATED = "…[truncated]"


_WORDS = re.compile(r"[^A-Za-z0-9]+|(?<=[a-z0-9])(?=[A-Z])")


class NameMatcher:
    """A field name is sensitive when one of its words (split at ``_``, ``-``, ``.`` and
    camelCase) is one of ``names``, or when the log redaction calls it a secret: ``api_key``,
    ``X-Auth-Token`` and ``sessionToken`` are; ``max_tokens``, ``keyboard`` and ``monkey`` are not."""

    def __init__(self, names: Iterable[str] = DEFAULT_SENSITIVE_NAMES) -> None:
        self.names = frozenset(n.lower() for n in names)

    def __call__(self, name: str) -> bool:
        words = {w.lower() for w in _WORDS.split(name) if w}
        return bool(words & self.names) or is_secret_key(name)


DEFAULT_MATCHER = NameMatcher()


@dataclass
class Sanitised:
    value: Any
    redacted: list[str] = field(default_factory=list)
    """Paths of the redacted values (names only, never values)."""
    truncated: list[str] = field(default_factory=list)


def sanitise(value: Any, matcher: NameMatcher = DEFAULT_MATCHER) -> Sanitised:
    out = Sanitised(None)
    out.value = _walk(value, "_context", 0, matcher, out)
    return out


def _walk(value: Any, path: str, depth: int, matcher: NameMatcher, out: Sanitised) -> Any:
    if depth > MAX_DEPTH:
        out.truncated.append(path)
        return TRUNCATED
    if isinstance(value, str):
        masked = redact_text(value)
        if masked != value:
            out.redacted.append(path)
        if len(masked) > MAX_STRING_CHARS:
            out.truncated.append(path)
            masked = masked[:MAX_STRING_CHARS] + TRUNCATED
        return masked
    if isinstance(value, dict):
        clean: dict[str, Any] = {}
        for k, v in value.items():
            where = f"{path}.{k}"
            if isinstance(k, str) and matcher(k):
                clean[k] = REDACTED
                out.redacted.append(where)
            else:
                clean[k] = _walk(v, where, depth + 1, matcher, out)
        return clean
    if isinstance(value, list):
        return [_walk(v, f"{path}[{i}]", depth + 1, matcher, out) for i, v in enumerate(value)]
    return value
