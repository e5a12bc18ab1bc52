"""Whether traces are exported, where to, and what spans may hold: read from the command line and
the standard ``OTEL_*`` variables without importing the SDK (``proxy.observability.otlp`` does)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

ENDPOINT_VARIABLES = ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT")
TRACES_PATH = "v1/traces"
CONTENT_VARIABLE = "OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT"
"""The GenAI instrumentations' switch for message content: the same opt-in as ``--otel-content``."""


@dataclass(frozen=True, slots=True)
class TraceExport:
    """Where spans go and what they may hold, as the command line and environment say."""

    endpoint: str | None = None
    """``--otlp-endpoint``: the collector's base URL (``/v1/traces`` is added), as
    ``OTEL_EXPORTER_OTLP_ENDPOINT``."""
    content: bool = False

    def enabled(self, environ: Mapping[str, str]) -> bool:
        if environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
            return False
        return bool(self.endpoint) or any(environ.get(name, "").strip() for name in ENDPOINT_VARIABLES)

    def captures_content(self, environ: Mapping[str, str]) -> bool:
        return self.content or environ.get(CONTENT_VARIABLE, "").strip().lower() == "true"

    def traces_url(self) -> str | None:
        """The exporter's URL for ``--otlp-endpoint``; None: the SDK reads the environment."""
        return None if not self.endpoint else f"{self.endpoint.rstrip('/')}/{TRACES_PATH}"
