"""structlog configured for production: one JSON line per event, rendered with orjson.

Secrets never reach a line: values under keys that look like credentials (the context
protocol's sanitisation list — password, token, secret, key — plus authorization and cookie)
are replaced, at any depth, and bearer tokens inside strings are masked.
"""

from __future__ import annotations

import logging
import re
import sys
from collections.abc import MutableMapping
from typing import Any, Literal

import orjson
import structlog

LogFormat = Literal["json", "console"]
REDACTED = "[REDACTED]"
# "token" as a name (access_token, x-auth-token), not as a count (max_tokens, prompt_tokens).
_SECRET_KEY = re.compile(
    r"(password|passwd|secret|credential|authorization|cookie|api[_-]?key|(^|[_-])key$|(^|[_-])token$)", re.I
)
_BEARER = re.compile(r"(?i)\b(bearer\s+)[A-Za-z0-9._~+/=-]{6,}")
_INLINE_KEY = re.compile(r"\b(sk|sk-ant|pk|rk)-[A-Za-z0-9_-]{8,}")
# Keys the proxy itself logs that merely contain "key" but are not secrets.
_SAFE_KEYS = frozenset({"trace_id", "module", "route", "kinds", "event"})


def _scrub(value: Any, depth: int = 0) -> Any:
    if depth > 8:
        return value
    if isinstance(value, str):
        return _INLINE_KEY.sub(REDACTED, _BEARER.sub(rf"\g<1>{REDACTED}", value))
    if isinstance(value, dict):
        return {k: (REDACTED if _is_secret(k) else _scrub(v, depth + 1)) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_scrub(v, depth + 1) for v in value]
    return value


def _is_secret(key: Any) -> bool:
    return isinstance(key, str) and key not in _SAFE_KEYS and bool(_SECRET_KEY.search(key))


def redact_secrets(logger: Any, method: str, event: MutableMapping[str, Any]) -> MutableMapping[str, Any]:
    """structlog processor: credentials never leave the process in a log line."""
    for key in list(event):
        event[key] = REDACTED if _is_secret(key) else _scrub(event[key])
    return event


def configure_logging(fmt: LogFormat = "json", level: str = "info") -> None:
    """Route structlog (and stdlib logging) to stderr as JSON lines or a console format."""
    numeric = logging.getLevelName(level.upper())
    if not isinstance(numeric, int):
        raise ValueError(f"unknown log level {level!r}")
    processors: list[structlog.typing.Processor] = [
        structlog.contextvars.merge_contextvars,
        structlog.processors.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
        structlog.processors.format_exc_info,
        redact_secrets,
    ]
    if fmt == "json":
        structlog.configure(
            processors=[*processors, structlog.processors.JSONRenderer(serializer=orjson.dumps)],
            wrapper_class=structlog.make_filtering_bound_logger(numeric),
            logger_factory=structlog.BytesLoggerFactory(sys.stderr.buffer),
            cache_logger_on_first_use=True,
        )
    else:
        structlog.configure(
            processors=[*processors, structlog.dev.ConsoleRenderer(colors=False)],
            wrapper_class=structlog.make_filtering_bound_logger(numeric),
            logger_factory=structlog.PrintLoggerFactory(sys.stderr),
            cache_logger_on_first_use=True,
        )
    logging.basicConfig(level=numeric, stream=sys.stderr, format="%(message)s")
