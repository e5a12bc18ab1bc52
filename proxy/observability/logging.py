"""structlog configured for production: one JSON line per event, rendered with orjson.

Secrets never reach a line: every event goes through ``proxy.redact.scrub``, and so does every
record of the standard library's loggers (aiohttp's, asyncio's, any library's): ``ForeignRecords``
turns each into one line of the same format through the same processors.
"""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import MutableMapping
from contextvars import ContextVar
from typing import Any, BinaryIO, Literal

import orjson
import structlog

from proxy.observability.logbuffer import BufferedLines
from proxy.redact import KEY_VERDICTS, KEY_VERDICTS_MAX, REDACTED, is_secret_key, redact_text, scrub

__all__ = [
    "REDACTED",
    "ForeignRecords",
    "LogFormat",
    "bind_request",
    "configure_logging",
    "log_lines",
    "redact_secrets",
    "request_line",
]

LogFormat = Literal["json", "console"]

_LINES: BufferedLines | None = None
_LEVEL = logging.INFO


def log_lines() -> BufferedLines | None:
    """The JSON log's line writer (None before ``configure_logging`` or in console format): the
    server runs its flusher (``BufferedLines.flush_every``)."""
    return _LINES


_REQUEST: ContextVar[tuple[str, str] | None] = ContextVar("proxy_request", default=None)
"""(trace id, route) of the request being served; tasks it starts inherit it."""


def bind_request(trace_id: str, route: str) -> None:
    """Every log line written while this request (and the tasks it starts) runs carries its
    ``trace_id`` and ``route``. One context variable set per request: structlog's
    ``bind_contextvars`` takes a variable per key and ``clear_contextvars`` walks the context."""
    _REQUEST.set((trace_id, route))


def add_request(logger: Any, method: str, event: MutableMapping[str, Any]) -> MutableMapping[str, Any]:
    """structlog processor: the bound request's ``trace_id`` and ``route`` (``bind_request``)."""
    bound = _REQUEST.get()
    if bound is not None:
        event.setdefault("trace_id", bound[0])
        event.setdefault("route", bound[1])
    return event


def redact_secrets(logger: Any, method: str, event: MutableMapping[str, Any]) -> MutableMapping[str, Any]:
    """structlog processor: credentials never leave the process in a log line."""
    for key, value in event.items():  # values are replaced in place; no key is added or removed
        # is_secret_key's remembered verdict read here: a call per key is most of a line's cost.
        secret = KEY_VERDICTS.get(key) if type(key) is str else None
        if secret is None:
            secret = is_secret_key(key)
        if secret:
            event[key] = REDACTED
        elif type(value) is str:  # most values: straight to the text check, past scrub's dispatch
            # redact_text's first look, inlined: most values have neither "-" nor white space.
            if "-" in value or " " in value or not value.isprintable():
                event[key] = redact_text(value)
        elif type(value) not in _PLAIN:
            event[key] = scrub(value)
    return event


_PLAIN = frozenset({int, float, bool, type(None)})
"""Value types that cannot hold a secret: left as they are, without a call."""


class IsoStamper:
    """structlog processor: ``timestamp`` in UTC as ``2026-11-26T08:12:57.127723Z`` (structlog's
    ISO stamp, always with microseconds), the date and time formatted once per second: half the
    cost of a ``datetime`` per line."""

    __slots__ = ("_formatted",)

    def __init__(self) -> None:
        self._formatted = (-1, "")
        """(second, its date and time): one tuple, so a line logged from another thread never
        pairs one second with another's text."""

    def __call__(self, logger: Any, method: str, event: MutableMapping[str, Any]) -> MutableMapping[str, Any]:
        event["timestamp"] = self.stamp()
        return event

    def stamp(self) -> str:
        """The time now, as the ``timestamp`` of a line."""
        now = time.time()
        second = int(now)
        formatted = self._formatted
        if formatted[0] != second:
            formatted = self._formatted = (second, time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(second)))
        return "%s.%06dZ" % (formatted[1], (now - second) * 1_000_000)  # noqa: UP031 (cheaper than format)


_log = structlog.get_logger("proxy")
_STAMPER = IsoStamper()

PROCESSORS: tuple[structlog.typing.Processor, ...] = (
    add_request,
    structlog.processors.format_exc_info,
    redact_secrets,
    # The proxy's own fields, after redaction: nothing in them to scrub.
    structlog.processors.add_log_level,
    _STAMPER,
)
"""Every line's processors, in order, before its renderer: structlog's chain and ``request_line``."""
_REQUEST_LINE_PROCESSORS = tuple(p for p in PROCESSORS if p is not structlog.processors.format_exc_info)
"""``PROCESSORS`` for a request line, which never carries an exception to format."""


def request_line(event: str, fields: dict[str, Any], *, quiet: bool = False) -> None:
    """Log ``event`` with ``fields`` at info (``quiet``: at debug): the canonical line of a request.

    In the JSON format it is written straight to the line buffer, through ``PROCESSORS`` and the
    renderer every other line goes through, without structlog's bound-logger dispatch: a third of
    its calls, on the one line every request writes. ``fields`` becomes the line."""
    level = logging.DEBUG if quiet else logging.INFO
    if level < _LEVEL:
        return
    lines = _LINES
    if lines is None:  # the console format, or logging not configured
        (_log.debug if quiet else _log.info)(event, **fields)
        return
    method = "debug" if quiet else "info"
    fields["event"] = event
    bound = _REQUEST.get()  # add_request, inlined
    if bound is not None:
        fields.setdefault("trace_id", bound[0])
        fields.setdefault("route", bound[1])
    raw = orjson.dumps(fields, default=_fallback)
    if _redacts_nothing(fields, raw):  # the usual line: the rest of the processors add two fields
        lines.msg(b"".join((raw[:-1], _LEVEL_FIELD[method], _STAMPER.stamp().encode(), b'"}')))
        return
    line: Any = fields  # every processor here returns the mapping it was given
    for processor in _REQUEST_LINE_PROCESSORS[1:]:  # add_request ran
        line = processor(None, method, line)
    lines.msg(orjson.dumps(line, default=_fallback))


_LEVEL_FIELD = {method: f',"level":"{method}","timestamp":"'.encode() for method in ("debug", "info")}
"""What ``add_log_level`` and ``IsoStamper`` add to a request line, up to the time, as JSON."""
_CLEAN_KEYS: set[str] = set()
"""Keys of request lines that ``is_secret_key`` judged not secret (bounded: ``KEY_VERDICTS_MAX``)."""
_ADDED_KEYS = frozenset({"level", "timestamp"})


def _redacts_nothing(fields: dict[str, Any], raw: bytes) -> bool:
    """Whether ``redact_secrets`` would leave the line ``fields`` (``raw`` its JSON) as it is, and
    the level and time go after its last field: no key that names a secret nor that the next
    processors set, no nested value (no ``{`` but the first, no ``[``), and no text the redaction
    could mask (no ``-``, no white space: ASCII JSON without a space or an escape). Two calls in C
    (``bytes.translate`` and ``isalpha``) instead of a call per field; any doubt takes the
    processors' way."""
    if not _CLEAN_KEYS.issuperset(fields):
        if len(_CLEAN_KEYS) >= KEY_VERDICTS_MAX or not _ADDED_KEYS.isdisjoint(fields):
            return False
        if any(map(is_secret_key, fields)):
            return False
        _CLEAN_KEYS.update(fields)
    return raw.translate(_PLAIN_BYTES)[1:].isalpha()


_PLAIN_BYTES = bytes(
    ord("a") if 0x21 <= byte <= 0x7E and chr(byte) not in "-\\[{" else ord("!") for byte in range(256)
)
"""``bytes.translate``'s table: ``a`` for a byte a plain line may hold past its first ``{``
(printable ASCII but space, ``-``, ``\\``, ``[`` and ``{``), ``!`` for any other."""


def _fallback(value: Any) -> str:
    """What structlog's JSON renderer writes for a value JSON has no type for."""
    return repr(value)


class ForeignRecords(logging.Handler):
    """The root logger's one handler: a standard-library record (``aiohttp.server``'s "Error
    handling request" with its traceback, ``asyncio``'s "Task exception was never retrieved") is
    logged as a structlog event, so it goes through ``PROCESSORS`` (redaction included) and the
    configured renderer: one JSON line, never raw text around the redaction."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            fields: dict[str, Any] = {"logger": record.name}
            if record.exc_info:
                fields["exc_info"] = record.exc_info
            if record.stack_info:
                fields["stack_info"] = record.stack_info
            structlog.get_logger("proxy").log(record.levelno, record.getMessage(), **fields)
        except Exception:  # a handler never raises; logging's handleError would print the raw record
            structlog.get_logger("proxy").error("proxy.log_record_unwritable", logger=record.name)


def configure_logging(fmt: LogFormat = "json", level: str = "info", stream: BinaryIO | None = None) -> None:
    """Route structlog (and stdlib logging) to stderr (``stream`` for JSON lines, when given) as
    JSON lines or a console format."""
    numeric = logging.getLevelName(level.upper())
    if not isinstance(numeric, int):
        raise ValueError(f"unknown log level {level!r}")
    global _LINES, _LEVEL
    _LEVEL = numeric
    if fmt == "json":
        lines = _LINES = BufferedLines(stream or sys.stderr.buffer)
        structlog.configure(
            processors=[*PROCESSORS, structlog.processors.JSONRenderer(serializer=orjson.dumps)],
            wrapper_class=structlog.make_filtering_bound_logger(numeric),
            logger_factory=lambda *_: lines,
            cache_logger_on_first_use=True,
        )
    else:
        _LINES = None
        structlog.configure(
            processors=[*PROCESSORS, structlog.dev.ConsoleRenderer(colors=False)],
            wrapper_class=structlog.make_filtering_bound_logger(numeric),
            logger_factory=structlog.PrintLoggerFactory(sys.stderr),
            cache_logger_on_first_use=True,
        )
    root = logging.getLogger()
    for handler in list(root.handlers):
        raw_text = getattr(handler, "stream", None) in (sys.stderr, sys.stdout)
        if raw_text or isinstance(handler, ForeignRecords):
            root.removeHandler(handler)  # raw text on stderr would be written around the redaction
    root.addHandler(ForeignRecords())
    root.setLevel(numeric)
