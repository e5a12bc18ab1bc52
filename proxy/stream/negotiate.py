"""Response mode negotiation (spec v2.5 §3.2.5): which signal wins, and the mismatch table.

Priority (§3.2.5.2): ``X-Cognitive-Response-Mode``, then ``_options.response_mode``, then
``?response_mode=``, then ``Accept`` (``text/event-stream`` or ``application/x-ndjson``), then the
module. The module's ``response.mode`` (or its tier default, §5.2) is read as what it supports;
a request with no signal at all is answered sync unless module.yaml itself declares
``streaming`` (a client that asked for nothing can always read JSON).

Mismatches (§3.2.5.3): streaming asked of a ``sync`` module, or of a module whose providers
cannot stream, falls back to sync with the W4010 warning; sync asked explicitly of a module
whose module.yaml declares ``response.mode: streaming`` is refused with E4010 (the proxy does not
force sync on it). A tier default is no declaration: an unmodified v2.2 exploration module asked
for sync answers sync (v2.5 §0.0.2, "v2.2 modules run without modification"; no warning is due).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from proxy.jsonshape import as_dict
from proxy.module.model import Module

Mode = Literal["sync", "streaming"]
Transport = Literal["sse", "ndjson"]
TRANSPORTS: tuple[Transport, ...] = ("sse", "ndjson")
"""What the proxy streams over (no WebSocket)."""
MODE_HEADER = "X-Cognitive-Response-Mode"
WARNING_HEADER = "X-Cognitive-Warning"
SSE = "text/event-stream"
NDJSON = "application/x-ndjson"
STREAMING_UNAVAILABLE = "W4010"
REASON_MODULE = "module_sync_only"
REASON_PROVIDER = "provider_limitation"
_MODES: tuple[Mode, ...] = ("sync", "streaming")


class BadMode(ValueError):
    """A response-mode signal that is neither ``sync`` nor ``streaming``."""


@dataclass(frozen=True, slots=True)
class ModeSignals:
    """The signals of one request, as sent."""

    header: str | None = None
    option: Any = None
    query: str | None = None
    accept: str = ""


@dataclass(frozen=True, slots=True)
class Negotiated:
    mode: Mode
    transport: Transport = "sse"
    fallback_reason: str | None = None
    """Set when streaming was asked for and sync is answered (W4010)."""
    refused: bool = False
    """Sync asked of a streaming-only module: E4010."""

    @property
    def warning_header(self) -> str | None:
        if self.fallback_reason is None:
            return None
        return f"STREAMING_UNAVAILABLE; fallback=sync; reason={self.fallback_reason}"

    def warnings(self) -> list[dict[str, Any]]:
        """``_warnings`` of a sync fallback body (§3.2.5.3)."""
        if self.fallback_reason is None:
            return []
        return [
            {
                "code": STREAMING_UNAVAILABLE,
                "message": (
                    f"Streaming requested but not available ({self.fallback_reason}), returned sync response"
                ),
                "fallback_used": "sync",
            }
        ]


def _mode(value: Any, where: str) -> Mode | None:
    if value is None or value == "":
        return None
    if isinstance(value, str) and value.strip().lower() in _MODES:
        return "sync" if value.strip().lower() == "sync" else "streaming"
    raise BadMode(f"{where} must be sync or streaming, not {str(value)[:40]!r}")


def transport_of(accept: str) -> Transport:
    return "ndjson" if NDJSON in accept.lower() else "sse"


def requested(signals: ModeSignals) -> Mode | None:
    """The mode the client asked for by the highest-priority signal present, or None."""
    for value, where in (
        (signals.header, MODE_HEADER),
        (signals.option, "_options.response_mode"),
        (signals.query, "the response_mode query parameter"),
    ):
        mode = _mode(value, where)
        if mode is not None:
            return mode
    accept = signals.accept.lower()
    if SSE in accept or NDJSON in accept:
        return "streaming"
    return None


def declared_mode(module: Module) -> Any:
    return as_dict(module.manifest.get("response")).get("mode")


def negotiate(module: Module, signals: ModeSignals, *, can_stream: bool = True) -> Negotiated:
    """The mode to answer in; raises ``BadMode`` for a malformed signal."""
    asked = requested(signals)
    transport = transport_of(signals.accept)
    supports = module.response_mode
    if asked is None:
        streams = declared_mode(module) == "streaming" and can_stream
        return Negotiated("streaming" if streams else "sync", transport)
    if asked == "sync":
        return Negotiated("sync", transport, refused=declared_mode(module) == "streaming")
    if supports == "sync":
        return Negotiated("sync", transport, fallback_reason=REASON_MODULE)
    if not can_stream:
        return Negotiated("sync", transport, fallback_reason=REASON_PROVIDER)
    return Negotiated("streaming", transport)
