"""Trace export: the official OpenTelemetry SDK and its OTLP/HTTP (protobuf) exporter, behind a
batch span processor with a bounded queue. Imported only when tracing is on.

On with ``--otlp-endpoint`` or the standard ``OTEL_EXPORTER_OTLP_ENDPOINT`` /
``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT``; ``OTEL_SDK_DISABLED=true`` turns it off. Every other
standard variable is the SDK's own: ``OTEL_SERVICE_NAME``, ``OTEL_RESOURCE_ATTRIBUTES``,
``OTEL_EXPORTER_OTLP_(TRACES_)HEADERS`` / ``_TIMEOUT`` / ``_COMPRESSION``, ``OTEL_TRACES_SAMPLER``
and ``_ARG``, ``OTEL_BSP_*`` (queue size, batch size, delay).

Spans leave from the processor's own thread: a collector that is slow or down never holds up a
request. A span that cannot be queued (the queue is full) or exported (the collector refused it
or could not be reached) is counted in ``cognitive_trace_spans_dropped_total{reason}``.
"""

from __future__ import annotations

import os
import secrets
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.metrics import Counter, Meter, NoOpCounter, NoOpMeter, NoOpMeterProvider
from opentelemetry.sdk.resources import SERVICE_NAME, Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult
from opentelemetry.sdk.trace.id_generator import IdGenerator
from opentelemetry.util.types import Attributes

from proxy.observability.trace_export import TraceExport
from proxy.observability.tracing import SCHEMA_URL, TRACER_NAME, Tracing, enable

DEFAULT_SERVICE_NAME = "cognitive-proxy"

Dropped = Callable[[str, int], None]
"""Counts ``n`` spans lost for ``reason`` (queue_full, export_failed)."""


class SecretIds(IdGenerator):
    """Trace and span ids from the OS's CSPRNG: the proxy's trace id is the server span's, and it
    guards feedback records (the SDK's default draws from ``random``, predictable from its output)."""

    def generate_span_id(self) -> int:
        return secrets.randbits(64) or 1

    def generate_trace_id(self) -> int:
        return secrets.randbits(128) or 1


class CountingExporter(SpanExporter):
    """The OTLP exporter, counting the spans of a batch it could not deliver."""

    def __init__(self, inner: SpanExporter, dropped: Dropped) -> None:
        self._inner = inner
        self._dropped = dropped

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        try:
            result = self._inner.export(spans)
        except Exception:
            self._dropped("export_failed", len(spans))
            raise
        if result is not SpanExportResult.SUCCESS:
            self._dropped("export_failed", len(spans))
        return result

    def shutdown(self) -> None:
        self._inner.shutdown()

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return self._inner.force_flush(timeout_millis)


_PROCESSED = "otel.sdk.processor.span.processed"
"""The SDK's own count of what its batch processor did; the ones with ``error.type`` were dropped.
A full queue is visible nowhere else (no log, no callback): tests/observability/test_traces.py fills
one end to end, so a renamed instrument fails a test, and ``Exporting.counts_drops`` says at start-up
whether the processor asked for it."""
INTERNAL_METRICS = "OTEL_PYTHON_SDK_INTERNAL_METRICS_ENABLED"
"""The SDK reports that count only with this set (its default: off); the proxy turns it on for its
batch processor unless the operator set it, and the count goes to the proxy's meter alone."""


@contextmanager
def _internal_metrics() -> Iterator[None]:
    """``INTERNAL_METRICS`` on (unless set) while the batch processor is built: the SDK reads it
    from ``os.environ`` then. Off again after, or every tracer would count the spans it starts and
    ends (two counter calls a span, measured 9% of starting one, that nobody reads)."""
    unset = INTERNAL_METRICS not in os.environ
    if unset:
        os.environ[INTERNAL_METRICS] = "true"
    try:
        yield
    finally:
        if unset:
            os.environ.pop(INTERNAL_METRICS, None)


class _DropCounter(NoOpCounter):
    def __init__(self, name: str, dropped: Dropped) -> None:
        super().__init__(name)
        self._dropped = dropped

    def add(self, amount: int | float, attributes: Attributes = None, context: Any = None) -> None:
        reason = (attributes or {}).get("error.type")
        if reason is not None:
            self._dropped(str(reason), int(amount))


class _DropMeter(NoOpMeter):
    def __init__(self, provider: DropMeterProvider) -> None:
        super().__init__("cognitive-proxy.spans")
        self._provider = provider

    def create_counter(self, name: str, unit: str = "", description: str = "") -> Counter:
        if name == _PROCESSED:
            self._provider.hooked = True
            return _DropCounter(name, self._provider.dropped)
        return super().create_counter(name, unit, description)


class DropMeterProvider(NoOpMeterProvider):
    """Hands the batch processor a meter whose only live instrument is its processed-spans
    counter, so the spans it drops (a full queue) reach the proxy's Prometheus counter."""

    def __init__(self, dropped: Dropped) -> None:
        self.dropped = dropped
        self.hooked = False
        """Whether the processor created the processed-spans counter (its drops are counted)."""

    def get_meter(self, name: str, *args: Any, **kwargs: Any) -> Meter:
        return _DropMeter(self)


def resource(environ: Mapping[str, str]) -> Resource:
    """``OTEL_RESOURCE_ATTRIBUTES`` and ``OTEL_SERVICE_NAME`` (the SDK's), else our service name."""
    detected = Resource.create(schema_url=SCHEMA_URL)
    named = environ.get("OTEL_SERVICE_NAME") or "service.name=" in environ.get("OTEL_RESOURCE_ATTRIBUTES", "")
    return detected if named else detected.merge(Resource({SERVICE_NAME: DEFAULT_SERVICE_NAME}))


@dataclass(frozen=True, slots=True)
class Exporting:
    tracing: Tracing
    provider: TracerProvider
    counts_drops: bool
    """Whether spans dropped on a full queue are counted (False: the SDK no longer reports them
    where ``DropMeterProvider`` listens, or ``OTEL_PYTHON_SDK_INTERNAL_METRICS_ENABLED=false``)."""

    def shutdown(self) -> None:
        """Flush what is queued (bounded by the exporter's timeout) and stop the worker thread."""
        self.provider.shutdown()


def start_export(
    export: TraceExport,
    dropped: Dropped,
    environ: Mapping[str, str] = os.environ,
    exporter: SpanExporter | None = None,
) -> Exporting:
    """The app's tracer provider with its batch processor (``exporter``: the OTLP one unless a
    test hands another in)."""
    inner = exporter if exporter is not None else OTLPSpanExporter(endpoint=export.traces_url())
    meters = DropMeterProvider(dropped)
    with _internal_metrics():
        processor = BatchSpanProcessor(CountingExporter(inner, dropped), meter_provider=meters)
    provider = TracerProvider(resource=resource(environ), id_generator=SecretIds())
    provider.add_span_processor(processor)
    tracer = provider.get_tracer(TRACER_NAME, schema_url=SCHEMA_URL)
    enable()
    return Exporting(Tracing(tracer, content=export.captures_content(environ)), provider, meters.hooked)
