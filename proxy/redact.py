"""Credentials never leave the process: one redaction for log lines and for every text the
proxy itself writes into a response from foreign text (upstream error messages).

Values under keys that look like credentials (the context protocol's sanitisation list —
password, token, secret, key — plus authorization and cookie) are replaced at any depth, and
bearer tokens and provider keys (``sk-...``) inside strings are masked.
"""

from __future__ import annotations

import re
from typing import Any

REDACTED = "[REDACTED]"
# "token" as a name (access_token, x-auth-token), not as a count (max_tokens, prompt_tokens).
_SECRET_KEY = re.compile(
    r"(password|passwd|secret|credential|authorization|cookie|api[_-]?key|(^|[_-])key$|(^|[_-])token$)", re.I
)
_BEARER = re.compile(r"(?i)\b(bearer\s+)[A-Za-z0-9._~+/=-]{6,}")
_INLINE_KEY = re.compile(r"\b(sk|sk-ant|pk|rk)-[A-Za-z0-9_-]{8,}")
_MAYBE_SECRET = re.compile(r"(?i)bearer\s|\b(sk|pk|rk)-")
"""A first look (one scan, no copy) that finds every text the two patterns above could mask."""
_SPACE = re.compile(r"\s")
"""Cheaper still: a text with neither ``-`` nor white space matches neither pattern."""
# Keys the proxy itself logs that merely contain "key" but are not secrets.
_SAFE_KEYS = frozenset({"trace_id", "module", "route", "kinds", "event"})
_MAX_DEPTH = 8  # log values are the proxy's own small structures; deeper is not walked


def redact_text(text: str) -> str:
    """``text`` with bearer tokens and provider keys masked."""
    # First in C, no regular expression: a text with neither "-" nor white space matches no
    # pattern here (every white space character but the ASCII space is unprintable), which is most
    # log values (ids, routes, names); ``proxy.observability.logging.redact_secrets`` inlines it.
    if (
        ("-" not in text and " " not in text and text.isprintable())
        or ("-" not in text and _SPACE.search(text) is None)
        or _MAYBE_SECRET.search(text) is None
    ):
        return text
    return _INLINE_KEY.sub(REDACTED, _BEARER.sub(rf"\g<1>{REDACTED}", text))


KEY_VERDICTS: dict[str, bool] = {}
"""``is_secret_key``'s verdicts, by key (``redact_secrets`` reads them without a call)."""
KEY_VERDICTS_MAX = 4096
"""Log keys are the proxy's own few names; foreign keys (a context dict's) are judged afresh
once this many are remembered."""


def is_secret_key(key: Any) -> bool:
    verdict = KEY_VERDICTS.get(key) if type(key) is str else None  # a str subclass may hash otherwise
    if verdict is None:
        if not isinstance(key, str):
            return False
        verdict = key not in _SAFE_KEYS and bool(_SECRET_KEY.search(key))
        if len(KEY_VERDICTS) < KEY_VERDICTS_MAX:
            KEY_VERDICTS[key] = verdict
    return verdict


def scrub(value: Any, depth: int = 0) -> Any:
    """``value`` with secrets masked: strings redacted, credential-named keys replaced."""
    if depth > _MAX_DEPTH:
        return value
    if type(value) is str:  # the common case first: one type check, no isinstance chain
        return redact_text(value)
    if isinstance(value, str):
        return redact_text(value)
    if isinstance(value, dict):
        return {k: (REDACTED if is_secret_key(k) else scrub(v, depth + 1)) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [scrub(v, depth + 1) for v in value]
    return value
