"""Each metric moves by the right amount on the right path (read back from /metrics)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.api.test_routing import REVIEW_INPUT, answer, routing_policy
from tests.conftest import ProxyWith
from tests.fake_upstream import FakeUpstream, Fault
from tests.proxy_server import RunningProxy, free_port, running_proxy
from tests.support.polling import eventually


class Scrape:
    def __init__(self, text: str) -> None:
        self.samples = [s for family in text_string_to_metric_families(text) for s in family.samples]

    def value(self, name: str, **labels: str) -> float:
        return sum(
            s.value
            for s in self.samples
            if s.name == name and all(s.labels.get(k) == v for k, v in labels.items())
        )


async def scrape(px: RunningProxy) -> Scrape:
    async with aiohttp.ClientSession() as session:
        return Scrape(await (await session.get(px.url + "/metrics")).text())


@pytest.fixture
def policy(fake_upstream: FakeUpstream) -> dict[str, Any]:
    """What the ``proxy`` fixture serves here."""
    return routing_policy(fake_upstream)


async def module_call(px: RunningProxy, module: str = "code-reviewer", value: Any = REVIEW_INPUT) -> int:
    async with aiohttp.ClientSession() as session:
        resp = await session.post(px.base + f"/modules/{module}/execute", json={"input": value})
        await resp.read()
        return resp.status


async def test_passthrough_counts_request_upstream_tokens_and_overhead(
    proxy: RunningProxy, fake_upstream: FakeUpstream
) -> None:
    before = await scrape(proxy)
    await proxy.client().chat.completions.create(
        model="gpt-4o-mini", messages=[{"role": "user", "content": "hi"}]
    )
    after = await scrape(proxy)
    route = {"route": "/v1/chat/completions"}
    assert (
        after.value("cognitive_requests_total", module="none", status="200", **route)
        - before.value("cognitive_requests_total", module="none", status="200", **route)
        == 1
    )
    assert after.value("cognitive_upstream_requests_total", provider="up", model="cheap", outcome="ok") == 1
    assert after.value("cognitive_upstream_latency_seconds_count", provider="up", model="cheap") == 1
    assert after.value("cognitive_tokens_total", provider="up", model="cheap", kind="prompt") > 0
    assert after.value("cognitive_tokens_total", provider="up", model="cheap", kind="completion") > 0
    assert after.value("cognitive_output_tokens_per_second_count", provider="up", model="cheap") == 1
    assert after.value("cognitive_proxy_overhead_seconds_count", **route) == 1


async def test_streamed_passthrough_counts_tokens_from_the_usage_chunk(proxy: RunningProxy) -> None:
    stream = await proxy.client().chat.completions.create(
        model="gpt-4o-mini",
        messages=[{"role": "user", "content": "hi"}],
        stream=True,
        stream_options={"include_usage": True},
    )
    async for _ in stream:
        pass
    after = await scrape(proxy)
    assert after.value("cognitive_tokens_total", provider="up", model="cheap", kind="completion") > 0
    assert after.value("cognitive_output_tokens_per_second_count", provider="up", model="cheap") == 1
    assert after.value("cognitive_requests_total", route="/v1/chat/completions", status="200") == 1


async def test_accepted_module_answer(proxy: RunningProxy, fake_upstream: FakeUpstream) -> None:
    fake_upstream.script("cheap", answer(0.92))
    await module_call(proxy)
    m = await scrape(proxy)
    labels = {"module": "code-reviewer", "tier": "decision"}
    assert m.value("cognitive_decisions_total", decision="accept", **labels) == 1
    assert m.value("cognitive_confidence_count", attempt="final", **labels) == 1
    assert m.value("cognitive_confidence_bucket", attempt="final", le="0.9", **labels) == 0
    assert m.value("cognitive_confidence_bucket", attempt="final", le="1.0", **labels) == 1
    assert m.value("cognitive_risk_total", risk="low", **labels) == 1
    assert (
        m.value(
            "cognitive_requests_total",
            route="/v1/modules/{name}/execute",
            module="code-reviewer",
            status="200",
        )
        == 1
    )


async def test_escalation_counts_from_and_to_rung(proxy: RunningProxy, fake_upstream: FakeUpstream) -> None:
    fake_upstream.script("cheap", answer(0.3))
    fake_upstream.script("strong", answer(0.95))
    await module_call(proxy)
    m = await scrape(proxy)
    assert (
        m.value("cognitive_escalations_total", module="code-reviewer", from_rung="fast", to_rung="strong")
        == 1
    )
    assert m.value("cognitive_confidence_count", module="code-reviewer", attempt="intermediate") == 1
    assert m.value(
        "cognitive_confidence_sum", module="code-reviewer", attempt="intermediate"
    ) == pytest.approx(0.3)
    assert m.value("cognitive_decisions_total", module="code-reviewer", decision="escalated") == 1


async def test_repairs_and_contract_errors(proxy: RunningProxy, fake_upstream: FakeUpstream) -> None:
    repaired = json.loads(answer(0.9))
    repaired["meta"]["risk"] = "LOW"
    fake_upstream.script("cheap", json.dumps(repaired))
    await module_call(proxy)
    fake_upstream.script("cheap", "no json here")
    fake_upstream.script("strong", answer(0.9))
    await module_call(proxy)
    assert await module_call(proxy, value={"language": "python"}) == 400
    m = await scrape(proxy)
    assert m.value("cognitive_repairs_total", module="code-reviewer", kind="enum_normalized") == 1
    assert m.value("cognitive_contract_errors_total", module="code-reviewer", code="E1000") == 1
    assert m.value("cognitive_contract_errors_total", module="code-reviewer", code="E1002") == 1


async def test_a_caller_input_error_is_an_outcome_not_a_decision(proxy: RunningProxy) -> None:
    """A refused input is the caller's mistake: no decision was made, no model was asked."""
    assert await module_call(proxy, value={"language": "python"}) == 400
    m = await scrape(proxy)
    assert m.value("cognitive_decisions_total", module="code-reviewer") == 0
    assert m.value("cognitive_confidence_count", module="code-reviewer") == 0
    assert (
        m.value("cognitive_requests_total", module="code-reviewer", status="400", outcome="invalid_input")
        == 1
    )
    async with aiohttp.ClientSession() as session:
        await session.post(proxy.url + "/v1/modules/nope/execute", json={"input": {}})
        await session.post(proxy.url + "/v1/modules/code-reviewer/execute", json={"no": "input"})
    m = await scrape(proxy)
    assert m.value("cognitive_requests_total", module="other", status="404", outcome="unknown_module") == 1
    assert m.value("cognitive_requests_total", module="code-reviewer", outcome="invalid_input") == 2
    assert m.value("cognitive_decisions_total") == 0


async def test_failover_upstream_outcome_and_breaker_gauge(
    fake_upstream: FakeUpstream, tmp_path: Path
) -> None:
    policy = routing_policy(
        fake_upstream, circuit_breaker={"consecutive_failures": 1, "window_s": 30, "open_s": 30}
    )
    fake_upstream.script("cheap", Fault.http(500))
    fake_upstream.script("backup", answer())
    async with running_proxy(tmp_path, policy) as px:
        before = await scrape(px)
        assert before.value("cognitive_circuit_open", target="up/cheap") == 0
        await module_call(px)
        m = await scrape(px)
    assert (
        m.value(
            "cognitive_failovers_total", from_target="up/cheap", to_target="up/backup", reason="server_error"
        )
        == 1
    )
    assert (
        m.value("cognitive_upstream_requests_total", provider="up", model="cheap", outcome="server_error")
        == 1
    )
    assert m.value("cognitive_circuit_open", target="up/cheap") == 1
    assert m.value("cognitive_circuit_open", target="up/backup") == 0


async def test_labels_stay_bounded(fake_upstream: FakeUpstream, proxy_with: ProxyWith) -> None:
    """A model the policy does not name (allowed by ``allow_any_model``) is ``other``."""
    policy = routing_policy(fake_upstream)
    policy["providers"]["up"]["allow_any_model"] = True
    async with proxy_with(policy) as px:
        await px.client().chat.completions.create(
            model="up/made-up-model-123", messages=[{"role": "user", "content": "x"}]
        )
        assert await module_call(px, module="no-such-module") == 404
        async with aiohttp.ClientSession() as session:
            await session.get(px.url + "/some/random/path/42")
        m = await scrape(px)
    assert m.value("cognitive_upstream_requests_total", provider="up", model="other", outcome="ok") == 1
    assert m.value("cognitive_requests_total", module="other", status="404") == 1
    assert m.value("cognitive_requests_total", route="unmatched", status="404") == 1
    names = {s.labels.get("model") for s in m.samples if "model" in s.labels}
    assert "made-up-model-123" not in names


async def test_review_and_sink_failures_are_counted(fake_upstream: FakeUpstream, tmp_path: Path) -> None:
    policy = routing_policy(fake_upstream)
    policy["review"] = {"sink": "redis-stream", "timeout_s": 0.2}
    fake_upstream.script("cheap", answer(0.95, "high"))
    fake_upstream.script("strong", answer(0.95, "high"))
    async with running_proxy(tmp_path, policy, redis_url=f"redis://127.0.0.1:{free_port()}/0") as px:
        await module_call(px)
        m = await eventually(
            lambda: scrape(px),
            "the review sink failure counted",
            ready=lambda m: bool(m.value("cognitive_review_sink_failures_total", sink="redis-stream")),
            timeout=20,
        )
    assert m.value("cognitive_decisions_total", module="code-reviewer", decision="review") == 1
    assert m.value("cognitive_review_sink_failures_total", sink="redis-stream") == 1


async def test_openmetrics_by_accept_and_on_the_admin_port(
    fake_upstream: FakeUpstream, tmp_path: Path
) -> None:
    port = free_port()
    async with (
        running_proxy(tmp_path, routing_policy(fake_upstream), admin_port=port) as px,
        aiohttp.ClientSession() as session,
    ):
        om = await session.get(px.url + "/metrics", headers={"Accept": "application/openmetrics-text"})
        om_text = await om.text()
        separate = await session.get(f"http://127.0.0.1:{port}/metrics")
        separate_text = await separate.text()
    assert om.headers["Content-Type"].startswith("application/openmetrics-text")
    assert om_text.rstrip().endswith("# EOF")
    assert separate.status == 200 and "cognitive_proxy_info" in separate_text


async def test_a_provider_failure_is_an_outcome_not_a_reject(
    proxy: RunningProxy, fake_upstream: FakeUpstream
) -> None:
    """Every provider down (E4001, 503): no model answered, so nothing was decided (#29.7)."""
    for model in ("cheap", "backup", "strong"):
        fake_upstream.script(model, Fault.http(503, retry_after=20))
    assert await module_call(proxy) == 503
    m = await scrape(proxy)
    assert m.value("cognitive_decisions_total", module="code-reviewer") == 0
    assert (
        m.value("cognitive_requests_total", module="code-reviewer", status="503", outcome="unanswered") == 1
    )


def test_remembered_children_count_as_prometheus_client_does() -> None:
    """``Metrics.child`` (and the request, upstream and usage children) skip prometheus-client's
    per-call checks: the exposition is the one ``inc`` and ``observe`` write, on a bound and past
    the last."""
    from prometheus_client import generate_latest

    from proxy.observability.metrics import Metrics

    ours, theirs = Metrics(), Metrics()
    amounts = [0.0, 0.001, 0.005, 0.0051, 0.25, 1.0, 7.5, 1e9, float("inf"), float("nan")]
    for amount in amounts:
        ours.child(ours.upstream_latency, "up", "m").observe(amount)
        theirs.upstream_latency.labels("up", "m").observe(amount)
        ours.observe_request("/v1/chat/completions", "none", 200, "none", amount)
        theirs.requests.labels("/v1/chat/completions", "none", "200", "none").inc()
        theirs.overhead.labels("/v1/chat/completions").observe(amount)
        ours.observe_upstream("up", "m", "ok", amount)
        theirs.upstream_requests.labels("up", "m", "ok").inc()
        theirs.upstream_latency.labels("up", "m").observe(amount)
        ours.usage_children("up", "m")(3, 0, amount)  # no completion tokens: the speed is still counted
        theirs.tokens.labels("up", "m", "prompt").inc(3)
        if amount:
            theirs.output_tps.labels("up", "m").observe(amount)
    ours.usage_children("up", "m")(0, 7, 0.0)  # no speed, no prompt tokens: neither is counted
    theirs.tokens.labels("up", "m", "completion").inc(7)
    ours.child(ours.tokens, "up", "m", "prompt").inc(12)
    theirs.tokens.labels("up", "m", "prompt").inc(12)

    def samples(metrics: Metrics) -> list[bytes]:  # but the times the series were created
        return [line for line in generate_latest(metrics.registry).splitlines() if b"_created" not in line]

    assert samples(ours) == samples(theirs)
