"""structlog configured for production: one JSON line per event, rendered with orjson."""

from __future__ import annotations

import logging
import sys
from typing import Literal

import orjson
import structlog

LogFormat = Literal["json", "console"]


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
    ]
    if fmt == "json":
        renderer: structlog.typing.Processor = structlog.processors.JSONRenderer(serializer=orjson.dumps)
        structlog.configure(
            processors=[*processors, renderer],
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
