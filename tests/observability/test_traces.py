"""OpenTelemetry traces end to end: a real `cogproxy serve` process exports OTLP/HTTP protobuf to a
real receiver on loopback (tests/support/otlp_receiver.py), driven by the official openai SDK;
the fake upstream records the ``traceparent`` each provider call carried."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import aiohttp
import openai
import pytest
import yaml
from aiohttp import web

from proxy.observability.tracing import SCHEMA_URL
from tests.api.test_routing import REVIEW_INPUT, answer, routing_policy
from tests.compose.harness import composed
from tests.compose.harness import execute as execute_in_process
from tests.compose.test_code_review_pipeline import CODE, STEPS, STYLE, _analysis
from tests.conftest import MODULES
from tests.fake_upstream import FakeUpstream, Fault
from tests.media import samples
from tests.media.test_module_media import ANSWER as MEDIA_ANSWER
from tests.proxy_server import (
    UPSTREAM_KEY,
    UPSTREAM_KEY_ENV,
    free_port,
    proxy_process,
    running_proxy,
    upstream_policy,
)
from tests.support.otlp_receiver import Span, otlp_receiver
from tests.support.polling import eventually

pytestmark = pytest.mark.slow

INCOMING_TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
INCOMING_PARENT = "00f067aa0ba902b7"
TRACEPARENT = f"00-{INCOMING_TRACE}-{INCOMING_PARENT}-01"
SECRET_IN_PROMPT = "sk-prompt-secret-abcdefgh1234"


def _policy_file(tmp_path: Path, fake: FakeUpstream) -> Path:
    path = tmp_path / "policy.yaml"
    path.write_text(yaml.safe_dump(routing_policy(fake)))
    return path


def _env(**extra: str) -> dict[str, str]:
    # A short batch delay: the spans reach the receiver within the test's polling, not 5 s later.
    return {UPSTREAM_KEY_ENV: UPSTREAM_KEY, "OTEL_BSP_SCHEDULE_DELAY": "50", **extra}


def _by_name(spans: list[Span], prefix: str) -> list[Span]:
    return [s for s in spans if s.name.startswith(prefix)]


def _one(spans: list[Span], prefix: str) -> Span:
    found = _by_name(spans, prefix)
    assert len(found) == 1, [s.name for s in spans]
    return found[0]


async def _execute(
    url: str, body: dict[str, Any], headers: dict[str, str], module: str = "code-reviewer"
) -> tuple[int, dict[str, Any]]:
    async with (
        aiohttp.ClientSession() as session,
        session.post(f"{url}/v1/modules/{module}/execute", json=body, headers=headers) as resp,
    ):
        return resp.status, await resp.json()


async def test_an_escalated_module_call_is_one_trace_from_the_client_to_the_upstream(
    fake_upstream: FakeUpstream, tmp_path: Path
) -> None:
    """Server span parented on the incoming traceparent; module-call span with the decision and
    what it rested on; one client span per attempt whose id is the traceparent the upstream got."""
    fake_upstream.script("cheap", answer(0.3))
    fake_upstream.script("strong", answer(0.93))
    async with otlp_receiver() as rx:
        policy = _policy_file(tmp_path, fake_upstream)
        async with proxy_process("--policy", str(policy), "--otlp-endpoint", rx.url, env=_env()) as served:
            status, reply = await _execute(
                served.url,
                {"input": {**REVIEW_INPUT, "note": SECRET_IN_PROMPT}},
                {"traceparent": TRACEPARENT},
            )
            assert status == 200 and reply["ok"] is True
            await rx.wait_for("the module call's spans", lambda s: len(_by_name(s, "chat ")) == 2)
    spans = rx.trace(INCOMING_TRACE)
    server = _one(spans, "POST /v1/modules/{name}/execute")
    assert (server.kind, server.parent_id) == ("server", INCOMING_PARENT)
    assert server.attributes["http.route"] == "/v1/modules/{name}/execute"
    assert server.attributes["http.response.status_code"] == 200
    assert server.resource["service.name"] == "cognitive-proxy"
    assert server.scope_schema == SCHEMA_URL
    call = _one(spans, "module_call code-reviewer")
    assert call.parent_id == server.span_id
    assert call.attributes == {
        **call.attributes,
        "cognitive.module": "code-reviewer",
        "cognitive.decision": "escalated",
        "cognitive.confidence": 0.93,
        "cognitive.risk": "low",
        "cognitive.rung": "strong",
        "cognitive.escalations": 1,
        "cognitive.reasks": 0,
        "cognitive.attempts": 2,
    }
    cheap, strong = sorted(_by_name(spans, "chat "), key=lambda s: s.name)
    for client, model in ((cheap, "cheap"), (strong, "strong")):
        assert (client.kind, client.parent_id) == ("client", call.span_id)
        assert client.attributes == {
            **client.attributes,
            "gen_ai.operation.name": "chat",
            "gen_ai.provider.name": "openai",
            "gen_ai.request.model": model,
            "cognitive.retry": 0,
            "cognitive.breaker.state": "closed",
        }
        assert client.attributes["gen_ai.usage.input_tokens"] > 0
        assert client.attributes["gen_ai.usage.output_tokens"] > 0
        assert client.attributes["gen_ai.response.finish_reasons"] == ["stop"]
    sent = [r.headers["traceparent"] for r in fake_upstream.requests if r.path == "/v1/chat/completions"]
    assert sent == [f"00-{INCOMING_TRACE}-{cheap.span_id}-01", f"00-{INCOMING_TRACE}-{strong.span_id}-01"]
    assert {s.name for s in _by_name(spans, "contract_check")} == {"contract_check"}
    assert [s.parent_id for s in _by_name(spans, "contract")] == [call.span_id, call.span_id]
    # No content by default: neither the prompt nor the answer is in any attribute.
    dumped = json.dumps([s.attributes for s in rx.spans])
    assert "gen_ai.input.messages" not in dumped and SECRET_IN_PROMPT not in dumped
    assert "rationale" not in dumped


async def test_content_is_recorded_only_when_asked_and_then_redacted(
    fake_upstream: FakeUpstream, tmp_path: Path
) -> None:
    fake_upstream.script("cheap", answer(0.95))
    async with otlp_receiver() as rx:
        policy = _policy_file(tmp_path, fake_upstream)
        args = ("--policy", str(policy), "--otlp-endpoint", rx.url, "--otel-content")
        async with proxy_process(*args, env=_env()) as served:
            status, _ = await _execute(served.url, {"input": {**REVIEW_INPUT, "note": SECRET_IN_PROMPT}}, {})
            assert status == 200
            await rx.wait_for("the client span", lambda s: bool(_by_name(s, "chat cheap")))
    client = _one(rx.spans, "chat cheap")
    sent = client.attributes["gen_ai.input.messages"]
    assert "[REDACTED]" in sent and SECRET_IN_PROMPT not in sent
    assert "def f(x)" in sent  # the prompt is there, only its secret masked
    assert "approve" in client.attributes["gen_ai.output.messages"]


async def test_a_streamed_module_answer_has_a_first_token_event_on_its_client_span(
    fake_upstream: FakeUpstream, tmp_path: Path
) -> None:
    """A module answer streamed to the openai SDK: its attempt's client span holds one
    ``gen_ai.first_token`` event with the time to the first chunk."""
    fake_upstream.script("cheap", answer(0.95))
    async with otlp_receiver() as rx:
        policy = _policy_file(tmp_path, fake_upstream)
        async with proxy_process("--policy", str(policy), "--otlp-endpoint", rx.url, env=_env()) as served:
            client = openai.AsyncOpenAI(base_url=served.url + "/v1", api_key="k", max_retries=0)
            try:
                stream = await client.chat.completions.create(
                    model="module:code-reviewer",
                    messages=[{"role": "user", "content": json.dumps(REVIEW_INPUT)}],
                    stream=True,
                )
                chunks = [c async for c in stream]
                assert chunks
            finally:
                await client.close()
            await rx.wait_for("the streamed call's client span", lambda s: bool(_by_name(s, "chat cheap")))
    streamed = _one(rx.spans, "chat cheap")
    assert [name for name, _ in streamed.events] == ["gen_ai.first_token"]
    assert streamed.events[0][1]["gen_ai.response.time_to_first_chunk"] >= 0


async def test_a_chat_passthrough_failover_is_a_client_span_per_attempt_with_the_answers_attributes(
    fake_upstream: FakeUpstream, tmp_path: Path
) -> None:
    """Chat passthrough through the openai SDK: the first target's 500 is a failed client span
    (its error.type), the fail-over a second one carrying the request's parameters and what the
    answer says of itself: model, id, finish reasons and the usage the client was billed."""
    fake_upstream.script("cheap", Fault.http(500))
    fake_upstream.script("backup", "hello there")
    async with otlp_receiver() as rx:
        policy = _policy_file(tmp_path, fake_upstream)
        async with proxy_process("--policy", str(policy), "--otlp-endpoint", rx.url, env=_env()) as served:
            client = openai.AsyncOpenAI(base_url=served.url + "/v1", api_key="k", max_retries=0)
            try:
                reply = await client.chat.completions.create(
                    model="fast",
                    messages=[{"role": "user", "content": "hi"}],
                    temperature=0.25,
                    max_tokens=64,
                )
            finally:
                await client.close()
            await rx.wait_for("both attempts", lambda s: len(_by_name(s, "chat ")) == 2)
    server = _one(rx.spans, "POST /v1/chat/completions")
    failed, answered = _one(rx.spans, "chat cheap"), _one(rx.spans, "chat backup")
    assert (failed.parent_id, answered.parent_id) == (server.span_id, server.span_id)
    assert failed.attributes["error.type"] == "server_error" and failed.status_code == 2  # ERROR
    assert "gen_ai.response.id" not in failed.attributes
    assert reply.usage is not None and reply.choices[0].finish_reason == "stop"
    assert answered.attributes == {
        **answered.attributes,
        "gen_ai.operation.name": "chat",
        "gen_ai.request.model": "backup",
        "gen_ai.request.temperature": 0.25,
        "gen_ai.request.max_tokens": 64,
        "gen_ai.response.model": reply.model,
        "gen_ai.response.id": reply.id,
        "gen_ai.response.finish_reasons": ["stop"],
        "gen_ai.usage.input_tokens": reply.usage.prompt_tokens,
        "gen_ai.usage.output_tokens": reply.usage.completion_tokens,
    }
    assert "error.type" not in answered.attributes


async def test_a_streamed_chat_passthrough_client_span_lasts_the_stream_and_carries_the_answers_attributes(
    fake_upstream: FakeUpstream, tmp_path: Path
) -> None:
    """A streamed chat passthrough through the openai SDK: its client span stays open to the
    stream's end, so it carries what only the end knows - the finish reasons and the usage the
    client was billed - beside the model and id of the first chunk (it used to end at the first
    chunk with none of them)."""
    fake_upstream.script("cheap", "hello there, streamed")
    async with otlp_receiver() as rx:
        policy = _policy_file(tmp_path, fake_upstream)
        async with proxy_process("--policy", str(policy), "--otlp-endpoint", rx.url, env=_env()) as served:
            client = openai.AsyncOpenAI(base_url=served.url + "/v1", api_key="k", max_retries=0)
            try:
                stream = await client.chat.completions.create(
                    model="fast",
                    messages=[{"role": "user", "content": "hi"}],
                    temperature=0.5,
                    stream=True,
                    stream_options={"include_usage": True},
                )
                chunks = [c async for c in stream]
            finally:
                await client.close()
            await rx.wait_for("the streamed attempt", lambda s: bool(_by_name(s, "chat cheap")))
    usage = next(c.usage for c in chunks if c.usage is not None)
    finishes = [choice.finish_reason for c in chunks for choice in c.choices if choice.finish_reason]
    streamed = _one(rx.spans, "chat cheap")
    assert streamed.attributes == {
        **streamed.attributes,
        "gen_ai.operation.name": "chat",
        "gen_ai.request.temperature": 0.5,
        "gen_ai.response.model": chunks[0].model,
        "gen_ai.response.id": chunks[0].id,
        "gen_ai.response.finish_reasons": finishes,
        "gen_ai.usage.input_tokens": usage.prompt_tokens,
        "gen_ai.usage.output_tokens": usage.completion_tokens,
    }
    assert finishes == ["stop"] and "error.type" not in streamed.attributes
    assert streamed.status_code != 2  # not ERROR


async def test_a_streamed_chat_passthrough_cut_short_ends_its_client_span_as_an_error(
    fake_upstream: FakeUpstream, tmp_path: Path
) -> None:
    """A stream that ends without its end marker after its first chunk (the client got the SSE
    error event): the held client span ends with ``error.type`` the reason, status ERROR."""
    fake_upstream.script("cheap", Fault.truncate(2))
    async with otlp_receiver() as rx:
        policy = _policy_file(tmp_path, fake_upstream)
        async with proxy_process("--policy", str(policy), "--otlp-endpoint", rx.url, env=_env()) as served:
            async with (
                aiohttp.ClientSession() as session,
                session.post(
                    served.url + "/v1/chat/completions",
                    json={"model": "fast", "messages": [{"role": "user", "content": "hi"}], "stream": True},
                ) as resp,
            ):
                text = await resp.text()
            assert resp.status == 200 and "truncated" in text
            await rx.wait_for("the streamed attempt", lambda s: bool(_by_name(s, "chat cheap")))
    streamed = _one(rx.spans, "chat cheap")
    assert streamed.attributes["error.type"] == "truncated" and streamed.status_code == 2
    assert streamed.attributes["gen_ai.response.model"] == "cheap"


async def test_passthrough_gets_a_server_span_and_a_client_span_per_attempt(
    fake_upstream: FakeUpstream, tmp_path: Path
) -> None:
    fake_upstream.script("text-embedding-3-small", Fault.http(500))
    async with otlp_receiver() as rx:
        doc = routing_policy(fake_upstream, retries=1)
        doc["passthrough"] = {"provider": "up"}
        policy = tmp_path / "policy.yaml"
        policy.write_text(yaml.safe_dump(doc))
        async with proxy_process("--policy", str(policy), "--otlp-endpoint", rx.url, env=_env()) as served:
            client = openai.AsyncOpenAI(base_url=served.url + "/v1", api_key="k", max_retries=0)
            try:
                result = await client.embeddings.create(model="text-embedding-3-small", input="hi")
            finally:
                await client.close()
            assert result.data
            await rx.wait_for("two attempts", lambda s: len(_by_name(s, "POST /v1/embeddings")) == 3)
    server = next(s for s in _by_name(rx.spans, "POST /v1/embeddings") if s.kind == "server")
    attempts = sorted(
        (s for s in rx.spans if s.kind == "client" and s.parent_id == server.span_id),
        key=lambda s: s.attributes["cognitive.retry"],
    )
    assert [a.attributes.get("error.type") for a in attempts] == ["server_error", None]
    assert [a.attributes["http.response.status_code"] for a in attempts] == [500, 200]
    assert attempts[0].attributes["gen_ai.operation.name"] == "embeddings"
    sent = [r.headers["traceparent"] for r in fake_upstream.requests if r.path == "/v1/embeddings"]
    assert sent == [f"00-{server.trace_id}-{a.span_id}-01" for a in attempts]


async def _dropped(url: str, reason: str = "") -> float:
    """``cognitive_trace_spans_dropped_total`` for ``reason`` (empty: every reason)."""
    async with aiohttp.ClientSession() as session, session.get(url + "/metrics") as resp:
        page = await resp.text()
    series = f'cognitive_trace_spans_dropped_total{{reason="{reason}"}}' if reason else ""
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in page.splitlines()
        if line.startswith(series or "cognitive_trace_spans_dropped_total{")
    )


async def test_an_unreachable_collector_fails_no_request_and_its_spans_are_counted_dropped(
    fake_upstream: FakeUpstream, tmp_path: Path
) -> None:
    fake_upstream.set_default_reply("cheap", answer(0.95))
    nobody = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    policy = _policy_file(tmp_path, fake_upstream)
    env = _env(OTEL_EXPORTER_OTLP_TIMEOUT="1")
    async with proxy_process(
        "--policy", str(policy), env={**env, "OTEL_EXPORTER_OTLP_ENDPOINT": nobody}
    ) as served:
        for _ in range(3):
            status, reply = await _execute(served.url, {"input": REVIEW_INPUT}, {})
            assert status == 200 and reply["ok"] is True
        await eventually(lambda: _dropped(served.url), "dropped spans counted", ready=lambda n: n > 0)


async def test_the_standard_otel_variables_name_the_service_tag_the_resource_and_authenticate_export(
    fake_upstream: FakeUpstream, tmp_path: Path
) -> None:
    """No flag: ``OTEL_EXPORTER_OTLP_ENDPOINT`` turns export on; ``OTEL_SERVICE_NAME`` and
    ``OTEL_RESOURCE_ATTRIBUTES`` describe the resource; ``OTEL_EXPORTER_OTLP_HEADERS`` reach the
    collector with every export request."""
    fake_upstream.script("cheap", answer(0.95))
    policy = _policy_file(tmp_path, fake_upstream)
    async with otlp_receiver() as rx:
        env = _env(
            OTEL_EXPORTER_OTLP_ENDPOINT=rx.url,
            OTEL_SERVICE_NAME="billing-proxy",
            OTEL_RESOURCE_ATTRIBUTES="deployment.environment.name=staging,team=payments",
            OTEL_EXPORTER_OTLP_HEADERS="x-collector-token=abc123",
        )
        async with proxy_process("--policy", str(policy), env=env) as served:
            status, _ = await _execute(served.url, {"input": REVIEW_INPUT}, {})
            assert status == 200
            await rx.wait_for("the module call's span", lambda s: bool(_by_name(s, "module_call ")))
    call = _one(rx.spans, "module_call ")
    assert call.resource == {
        **call.resource,
        "service.name": "billing-proxy",
        "deployment.environment.name": "staging",
        "team": "payments",
    }
    assert rx.headers and all(h.get("x-collector-token") == "abc123" for h in rx.headers)


async def test_a_trace_id_ratio_of_zero_exports_nothing_and_tells_the_upstream_it_is_not_sampled(
    fake_upstream: FakeUpstream, tmp_path: Path
) -> None:
    """``OTEL_TRACES_SAMPLER=traceidratio`` with ratio 0: not one span reaches the collector, not
    even when the proxy stops (its queue flushed), and the provider call's traceparent says
    "not sampled" (flags 00)."""
    fake_upstream.script("cheap", answer(0.95))
    policy = _policy_file(tmp_path, fake_upstream)
    env = _env(OTEL_TRACES_SAMPLER="traceidratio", OTEL_TRACES_SAMPLER_ARG="0")
    async with otlp_receiver() as rx:
        async with proxy_process("--policy", str(policy), "--otlp-endpoint", rx.url, env=env) as served:
            status, _ = await _execute(served.url, {"input": REVIEW_INPUT}, {})
            assert status == 200
            stopped = await served.stop()  # SIGTERM: the app's cleanup flushes the span queue
        assert "proxy.tracing" in stopped[0] + stopped[1]  # export was on, the sampler said no
        assert rx.requests == 0 and rx.spans == []
    (sent,) = [r.headers["traceparent"] for r in fake_upstream.requests if r.path == "/v1/chat/completions"]
    assert sent.endswith("-00")


async def test_spans_a_full_export_queue_turns_away_are_counted_queue_full(
    fake_upstream: FakeUpstream, tmp_path: Path
) -> None:
    """A stalled collector and a queue of one span: the module call still answers, and the spans
    the SDK's batch processor drops are counted with reason queue_full. End to end through the
    SDK's own processor: it fails if the SDK stops reporting drops where the proxy listens
    (``proxy.observability.otlp``, its processed-spans counter)."""
    fake_upstream.set_default_reply("cheap", answer(0.95))
    policy = _policy_file(tmp_path, fake_upstream)
    env = _env(
        OTEL_BSP_MAX_QUEUE_SIZE="1", OTEL_BSP_MAX_EXPORT_BATCH_SIZE="1", OTEL_EXPORTER_OTLP_TIMEOUT="2"
    )
    async with otlp_receiver() as rx:
        rx.hold()
        async with proxy_process("--policy", str(policy), "--otlp-endpoint", rx.url, env=env) as served:
            status, reply = await _execute(served.url, {"input": REVIEW_INPUT}, {})
            assert status == 200 and reply["ok"] is True
            full = await eventually(
                lambda: _dropped(served.url, "queue_full"),
                "spans dropped on a full queue",
                ready=lambda n: n > 0,
            )
            rx.release()
    assert full >= 1
    assert rx.requests >= 1  # the one span the processor took was sent to the stalled collector


async def test_composition_steps_are_child_module_call_spans(
    tmp_path: Path, fake_upstream: FakeUpstream, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The composite's module-call span holds one module-call span per step it ran."""
    fake_upstream.script("m-code-analyzer", _analysis(0.9, "none"))
    fake_upstream.script("m-style-checker", STYLE)
    async with otlp_receiver() as rx:
        monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "50")
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", rx.url)
        async with composed(tmp_path, fake_upstream, MODULES, STEPS) as proxy:
            status, _, _ = await execute_in_process(proxy, "code-review-pipeline", CODE)
            assert status == 200
            await rx.wait_for("the steps' spans", lambda s: len(_by_name(s, "module_call ")) >= 3)
    top = next(s for s in rx.spans if s.name == "module_call code-review-pipeline" and s.parent_id)
    server = next(s for s in rx.spans if s.span_id == top.parent_id)
    assert server.kind == "server"
    children = {s.name for s in rx.spans if s.parent_id == top.span_id and s.name.startswith("module_call ")}
    assert {"module_call code-analyzer", "module_call style-checker"} <= children


async def test_each_media_url_fetch_is_a_span_of_the_media_step_naming_the_host_never_the_url(
    fake_upstream: FakeUpstream, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two image URLs: the ``media`` step's span holds one ``media.fetch`` span per fetch, with
    the host and the bytes that came back; neither the path nor the query (a signed URL's
    credential) is recorded."""
    served: list[str] = []

    async def image(request: web.Request) -> web.Response:
        served.append(request.path_qs)
        return web.Response(body=samples.PNG, content_type="image/png")

    origin = web.Application()
    origin.router.add_get("/{name}", image)
    runner = web.AppRunner(origin, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    port = runner.addresses[0][1]
    images = [
        {"type": "url", "url": f"http://localhost:{port}/{name}.png?sig=SIGNED-SECRET"} for name in "ab"
    ]
    policy = upstream_policy(fake_upstream)
    policy["media"] = {"allow_http": True, "trusted_hosts": [f"localhost:{port}"]}
    fake_upstream.script("cheap", MEDIA_ANSWER)
    monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "50")
    monkeypatch.setenv(UPSTREAM_KEY_ENV, UPSTREAM_KEY)
    try:
        async with otlp_receiver() as rx, running_proxy(tmp_path, policy, otlp_endpoint=rx.url) as proxy:
            status, reply = await _execute(
                proxy.url, {"input": {"prompt": "What is this?", "images": images}}, {}, "image-describer"
            )
            assert status == 200 and reply["ok"] is True, reply
            await rx.wait_for("the fetches' spans", lambda s: len(_by_name(s, "media.fetch")) == 2)
    finally:
        await runner.cleanup()
    assert served == ["/a.png?sig=SIGNED-SECRET", "/b.png?sig=SIGNED-SECRET"]
    (step,) = [s for s in rx.spans if s.name == "media"]
    assert step.attributes["cognitive.media.fetched"] == 2
    for fetch in _by_name(rx.spans, "media.fetch"):
        assert fetch.parent_id == step.span_id and fetch.trace_id == step.trace_id
        assert fetch.attributes == {
            "server.address": "localhost",
            "cognitive.media.bytes": len(samples.PNG),
            "cognitive.media.redirects": 0,
            "cognitive.media.served_type": "image/png",
        }
    assert "SIGNED-SECRET" not in json.dumps([s.attributes for s in rx.spans])
