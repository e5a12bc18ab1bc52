"""A real OTLP/HTTP trace receiver on a free loopback port: ``POST /v1/traces`` with a protobuf
``ExportTraceServiceRequest`` (the classes of ``opentelemetry-proto``), decoded into ``Span``
records the tests read back, as a collector would store them."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue

from tests.support.polling import until

KINDS = {0: "unspecified", 1: "internal", 2: "server", 3: "client", 4: "producer", 5: "consumer"}


def _value(value: AnyValue) -> Any:
    which = value.WhichOneof("value")
    if which == "array_value":
        return [_value(v) for v in value.array_value.values]
    if which == "kvlist_value":
        return {kv.key: _value(kv.value) for kv in value.kvlist_value.values}
    return getattr(value, which) if which else None


@dataclass(frozen=True)
class Span:
    name: str
    trace_id: str
    span_id: str
    parent_id: str
    kind: str
    attributes: dict[str, Any]
    events: tuple[tuple[str, dict[str, Any]], ...]
    status_code: int
    resource: dict[str, Any]
    scope_schema: str


@dataclass
class OtlpReceiver:
    url: str = ""
    spans: list[Span] = field(default_factory=list)
    requests: int = 0
    content_types: list[str] = field(default_factory=list)
    headers: list[dict[str, str]] = field(default_factory=list)
    """Each export request's headers (``OTEL_EXPORTER_OTLP_HEADERS`` arrive here)."""
    open: asyncio.Event = field(default_factory=asyncio.Event)
    """Cleared by ``hold``: export requests then wait, as on a stalled collector."""

    def hold(self) -> None:
        self.open.clear()

    def release(self) -> None:
        self.open.set()

    async def _traces(self, request: web.Request) -> web.Response:
        self.requests += 1
        self.content_types.append(request.content_type)
        self.headers.append(dict(request.headers))
        await self.open.wait()
        message = ExportTraceServiceRequest.FromString(await request.read())
        for resource_spans in message.resource_spans:
            resource = {a.key: _value(a.value) for a in resource_spans.resource.attributes}
            for scope_spans in resource_spans.scope_spans:
                for span in scope_spans.spans:
                    self.spans.append(
                        Span(
                            span.name,
                            span.trace_id.hex(),
                            span.span_id.hex(),
                            span.parent_span_id.hex(),
                            KINDS[span.kind],
                            {a.key: _value(a.value) for a in span.attributes},
                            tuple(
                                (e.name, {a.key: _value(a.value) for a in e.attributes}) for e in span.events
                            ),
                            span.status.code,
                            resource,
                            scope_spans.schema_url or resource_spans.schema_url,
                        )
                    )
        return web.Response(
            body=ExportTraceServiceResponse().SerializeToString(), content_type="application/x-protobuf"
        )

    def trace(self, trace_id: str) -> list[Span]:
        return [s for s in self.spans if s.trace_id == trace_id]

    async def wait_for(self, what: str, found: Callable[[list[Span]], bool], timeout: float = 20.0) -> None:
        """Until the spans received so far satisfy ``found`` (export is batched, in the background)."""
        await until(lambda: found(self.spans), what, timeout=timeout)


@asynccontextmanager
async def otlp_receiver() -> AsyncIterator[OtlpReceiver]:
    receiver = OtlpReceiver()
    receiver.release()
    app = web.Application()
    app.router.add_post("/v1/traces", receiver._traces)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    host, port = runner.addresses[0][:2]
    receiver.url = f"http://{host}:{port}"
    try:
        yield receiver
    finally:
        receiver.release()
        await runner.cleanup()
