"""The attribute sets of the module-call span and the client span, exactly: key sets and types,
read from the SDK's in-memory exporter behind the proxy's own tracer provider
(``proxy.observability.otlp.start_export``), no OTLP in between."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind

from proxy.observability import otlp
from proxy.observability.trace_export import TraceExport
from tests.api.test_routing import REVIEW_INPUT, answer, routing_policy
from tests.fake_upstream import FakeUpstream
from tests.proxy_server import UPSTREAM_KEY, UPSTREAM_KEY_ENV, RunningProxy, running_proxy

MODULE_CALL_ATTRIBUTES: dict[str, type | tuple[type, ...]] = {
    "cognitive.module": str,
    "cognitive.tier": str,
    "cognitive.decision": str,
    "cognitive.origin": str,
    "cognitive.attempts": int,
    "cognitive.escalations": int,
    "cognitive.reasks": int,
    "cognitive.cost_usd": float,
    "cognitive.risk": str,
    "cognitive.rung": str,
    "cognitive.target": str,
    "cognitive.confidence": float,
    "cognitive.confidence.calibrated": float,
    "cognitive.risk.model": str,
    "gen_ai.usage.input_tokens": int,
    "gen_ai.usage.output_tokens": int,
}
"""An escalated module call with no cache or composition: every attribute it has."""

CLIENT_ATTRIBUTES: dict[str, type | tuple[type, ...]] = {
    "gen_ai.operation.name": str,
    "gen_ai.provider.name": str,
    "gen_ai.request.model": str,
    "gen_ai.response.model": str,
    "gen_ai.response.id": str,
    "gen_ai.response.finish_reasons": tuple,
    "gen_ai.usage.input_tokens": int,
    "gen_ai.usage.output_tokens": int,
    "cognitive.provider": str,
    "cognitive.retry": int,
    "cognitive.breaker.state": str,
}
"""A successful chat attempt (no request parameters set, no content recorded)."""


class _Exported:
    """The in-memory exporter and the provider that feeds it (flushed before each read)."""

    def __init__(self) -> None:
        self.memory = InMemorySpanExporter()
        self.exporting: otlp.Exporting | None = None

    def spans(self) -> list[ReadableSpan]:
        assert self.exporting is not None, "the app did not start exporting"
        assert self.exporting.provider.force_flush(5000)
        return list(self.memory.get_finished_spans())


@pytest.fixture
def exported(monkeypatch: pytest.MonkeyPatch) -> Iterator[_Exported]:
    """The app's ``start_export`` with the in-memory exporter in place of the OTLP one."""
    found = _Exported()
    real = otlp.start_export

    def start(
        export: TraceExport, dropped: otlp.Dropped, *_: Any, exporter: SpanExporter | None = None
    ) -> otlp.Exporting:
        found.exporting = real(export, dropped, {}, found.memory)
        return found.exporting

    monkeypatch.setattr(otlp, "start_export", start)
    monkeypatch.setenv(UPSTREAM_KEY_ENV, UPSTREAM_KEY)
    yield found


@pytest.fixture
async def traced_proxy(
    exported: _Exported, fake_upstream: FakeUpstream, tmp_path: Path
) -> AsyncIterator[RunningProxy]:
    # the endpoint turns export on; nothing is sent there (the exporter is the in-memory one)
    async with running_proxy(
        tmp_path, routing_policy(fake_upstream), otlp_endpoint="http://127.0.0.1:9"
    ) as px:
        yield px


async def _execute(url: str) -> dict[str, Any]:
    async with (
        aiohttp.ClientSession() as session,
        session.post(f"{url}/v1/modules/code-reviewer/execute", json={"input": REVIEW_INPUT}) as resp,
    ):
        assert resp.status == 200
        reply: dict[str, Any] = await resp.json()
        return reply


def _types(span: ReadableSpan) -> dict[str, type]:
    return {key: type(value) for key, value in (span.attributes or {}).items()}


async def test_the_module_call_span_has_exactly_its_attributes_with_their_types(
    traced_proxy: RunningProxy, exported: _Exported, fake_upstream: FakeUpstream
) -> None:
    fake_upstream.script("cheap", answer(0.3))
    fake_upstream.script("strong", answer(0.93))
    reply = await _execute(traced_proxy.url)
    assert reply["ok"] is True
    (call,) = [s for s in exported.spans() if s.name == "module_call code-reviewer"]
    assert call.kind is SpanKind.INTERNAL
    assert _types(call) == MODULE_CALL_ATTRIBUTES
    assert call.attributes is not None
    assert (call.attributes["cognitive.decision"], call.attributes["cognitive.attempts"]) == ("escalated", 2)


async def test_the_client_span_has_exactly_its_attributes_with_their_types(
    traced_proxy: RunningProxy, exported: _Exported, fake_upstream: FakeUpstream
) -> None:
    fake_upstream.script("cheap", answer(0.95))
    await _execute(traced_proxy.url)
    spans = exported.spans()
    (client,) = [s for s in spans if s.kind is SpanKind.CLIENT]
    assert client.name == "chat cheap"
    assert _types(client) == CLIENT_ATTRIBUTES
    assert client.attributes is not None
    assert client.attributes["gen_ai.response.finish_reasons"] == ("stop",)
    (call,) = [s for s in spans if s.name == "module_call code-reviewer"]
    assert client.parent is not None and client.parent.span_id == call.context.span_id
