"""Traces end to end into Arize Phoenix, a real OTLP trace store: a `cogproxy serve` process
exports to Phoenix's OTLP/HTTP receiver, and each test reads its trace back over Phoenix's REST
API: an escalated module call, a composite, a streamed answer and a chat failover. The tree
(parent ids), the span names and the attributes are asserted as Phoenix stored them.

Phoenix runs from the venv ``make phoenix`` builds (``tests/support/phoenix.py``); the tests are
skipped, saying so, only where it could not be installed. docs/observability.md, *Phoenix*, cites
this file."""

from __future__ import annotations

import json
import secrets
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import openai
import pytest
import yaml

from tests.api.test_routing import REVIEW_INPUT, answer, routing_policy
from tests.compose.harness import composition_policy
from tests.compose.test_code_review_pipeline import CODE, STEPS, STYLE, _analysis
from tests.fake_upstream import FakeUpstream, Fault
from tests.proxy_server import UPSTREAM_KEY, UPSTREAM_KEY_ENV, ServedProcess, proxy_process
from tests.support.phoenix import EXECUTABLE, Phoenix, PhoenixSpan, phoenix_server

pytestmark = [  # slow: tests/conftest.py SLOW_FILES
    pytest.mark.skipif(
        not EXECUTABLE.exists(), reason="arize-phoenix is not installed: `make phoenix` could not install it"
    ),
]

PROJECT = "cognitive-proxy-e2e"
"""Phoenix's project, named by the resource attribute it reads (``openinference.project.name``)."""
INCOMING_PARENT = "00f067aa0ba902b7"


@pytest.fixture(scope="module")
def phoenix(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Phoenix]:
    with phoenix_server(tmp_path_factory.mktemp("phoenix")) as served:
        yield served


def _policy(fake: FakeUpstream) -> dict[str, Any]:
    """The routing ladder (fast: cheap then backup; strong) and, after it, one rung per step of
    the code-review pipeline, each step starting on its own: every scenario with one policy."""
    policy = routing_policy(fake)
    composite = composition_policy(fake, STEPS)
    policy["ladder"] += composite["ladder"]
    policy["modules"] = composite["modules"]
    policy["tiers"] = composite["tiers"]
    return policy


@pytest.fixture
async def served(
    phoenix: Phoenix, fake_upstream: FakeUpstream, tmp_path: Path
) -> AsyncIterator[ServedProcess]:
    path = tmp_path / "policy.yaml"
    path.write_text(yaml.safe_dump(_policy(fake_upstream)))
    env = {
        UPSTREAM_KEY_ENV: UPSTREAM_KEY,
        "OTEL_BSP_SCHEDULE_DELAY": "50",
        "OTEL_RESOURCE_ATTRIBUTES": f"openinference.project.name={PROJECT}",
    }
    async with proxy_process("--policy", str(path), "--otlp-endpoint", phoenix.url, env=env) as proc:
        yield proc


def _traceparent() -> tuple[str, str]:
    """A new trace id and the ``traceparent`` that starts it at the client."""
    trace_id = secrets.token_hex(16)
    return trace_id, f"00-{trace_id}-{INCOMING_PARENT}-01"


def _named(spans: list[PhoenixSpan], name: str) -> PhoenixSpan:
    found = [s for s in spans if s.name == name]
    assert len(found) == 1, sorted(s.name for s in spans)
    return found[0]


def _tree(spans: list[PhoenixSpan]) -> list[tuple[str, str]]:
    """Each span's name and its parent's (the incoming ``traceparent``'s span: ``client``)."""
    names = {s.span_id: s.name for s in spans}
    names[INCOMING_PARENT] = "client"
    return sorted((s.name, names.get(s.parent_id or "", f"missing {s.parent_id}")) for s in spans)


MODULE_STEPS = ("chat", "context.load", "context.store", "contract_check")
"""A module call's children when its first answer is accepted (the chat span's name ends in the model)."""


def _module_call(module: str, model: str, parent: str) -> list[tuple[str, str]]:
    """The subtree of a module call answered at once by ``model``."""
    call = f"module_call {module}"
    steps = [(f"chat {model}" if step == "chat" else step, call) for step in MODULE_STEPS]
    return [(call, parent), *steps]


async def _execute(url: str, module: str, value: Any, traceparent: str) -> dict[str, Any]:
    async with (
        aiohttp.ClientSession() as session,
        session.post(
            f"{url}/v1/modules/{module}/execute", json={"input": value}, headers={"traceparent": traceparent}
        ) as resp,
    ):
        assert resp.status == 200
        reply: dict[str, Any] = await resp.json()
        return reply


async def test_an_escalated_module_call_in_phoenix(
    phoenix: Phoenix, served: ServedProcess, fake_upstream: FakeUpstream
) -> None:
    fake_upstream.script("cheap", answer(0.3))
    fake_upstream.script("strong", answer(0.93))
    trace_id, traceparent = _traceparent()
    reply = await _execute(served.url, "code-reviewer", REVIEW_INPUT, traceparent)
    assert reply["ok"] is True
    route = "POST /v1/modules/{name}/execute"
    tree = sorted(
        [
            (route, "client"),  # one trace from the client on
            *_module_call("code-reviewer", "cheap", route),
            ("chat strong", "module_call code-reviewer"),
            ("contract_check", "module_call code-reviewer"),
        ]
    )
    spans = await phoenix.trace(PROJECT, trace_id, len(tree))
    assert _tree(spans) == tree
    server = _named(spans, route)
    assert server.attributes["http.route"] == "/v1/modules/{name}/execute"
    assert server.attributes["http.response.status_code"] == 200
    call = _named(spans, "module_call code-reviewer")
    assert call.attributes == {
        **call.attributes,
        "cognitive.module": "code-reviewer",
        "cognitive.decision": "escalated",
        "cognitive.confidence": 0.93,
        "cognitive.rung": "strong",
        "cognitive.escalations": 1,
        "cognitive.attempts": 2,
    }
    strong = _named(spans, "chat strong")
    assert strong.attributes == {
        **strong.attributes,
        "gen_ai.operation.name": "chat",
        "gen_ai.provider.name": "openai",
        "gen_ai.request.model": "strong",
        "gen_ai.response.finish_reasons": ["stop"],
        "cognitive.retry": 0,
        "cognitive.breaker.state": "closed",
    }
    assert strong.attributes["gen_ai.usage.input_tokens"] > 0
    sent = [r.headers["traceparent"] for r in fake_upstream.requests if r.model == "strong"]
    assert sent == [f"00-{trace_id}-{strong.span_id}-01"]
    assert "rationale" not in json.dumps([s.attributes for s in spans])  # no content by default


async def test_a_composite_in_phoenix_is_a_module_call_span_per_step_under_its_own(
    phoenix: Phoenix, served: ServedProcess, fake_upstream: FakeUpstream
) -> None:
    fake_upstream.script("m-code-analyzer", _analysis(0.9, "none"))
    fake_upstream.script("m-style-checker", STYLE)
    trace_id, traceparent = _traceparent()
    await _execute(served.url, "code-review-pipeline", CODE, traceparent)
    route, top = "POST /v1/modules/{name}/execute", "module_call code-review-pipeline"
    tree = sorted(
        [
            (route, "client"),
            (top, route),
            *_module_call("code-analyzer", "m-code-analyzer", top),
            *_module_call("style-checker", "m-style-checker", top),
        ]
    )
    spans = await phoenix.trace(PROJECT, trace_id, len(tree))
    assert _tree(spans) == tree  # the scan skipped (risk none): no span of it
    assert _named(spans, top).attributes["cognitive.steps"] == 2
    analyzer = _named(spans, "module_call code-analyzer")
    assert analyzer.attributes["cognitive.module"] == "code-analyzer"


async def test_a_streamed_answer_in_phoenix_has_its_first_token_event(
    phoenix: Phoenix, served: ServedProcess, fake_upstream: FakeUpstream
) -> None:
    fake_upstream.script("cheap", answer(0.95))
    trace_id, traceparent = _traceparent()
    client = openai.AsyncOpenAI(base_url=served.url + "/v1", api_key="k", max_retries=0)
    try:
        stream = await client.chat.completions.create(
            model="module:code-reviewer",
            messages=[{"role": "user", "content": json.dumps(REVIEW_INPUT)}],
            stream=True,
            extra_headers={"traceparent": traceparent},
        )
        assert [c async for c in stream]
    finally:
        await client.close()
    route = "POST /v1/chat/completions"
    tree = sorted([(route, "client"), *_module_call("code-reviewer", "cheap", route)])
    spans = await phoenix.trace(PROJECT, trace_id, len(tree))
    assert _tree(spans) == tree
    streamed = _named(spans, "chat cheap")
    assert [name for name, _ in streamed.events] == ["gen_ai.first_token"]
    assert streamed.events[0][1]["gen_ai.response.time_to_first_chunk"] >= 0


async def test_a_failover_in_phoenix_is_a_failed_client_span_and_the_answering_one(
    phoenix: Phoenix, served: ServedProcess, fake_upstream: FakeUpstream
) -> None:
    fake_upstream.script("cheap", Fault.http(500))
    fake_upstream.script("backup", "hello there")
    trace_id, traceparent = _traceparent()
    client = openai.AsyncOpenAI(base_url=served.url + "/v1", api_key="k", max_retries=0)
    try:
        reply = await client.chat.completions.create(
            model="fast",
            messages=[{"role": "user", "content": "hi"}],
            temperature=0.25,
            extra_headers={"traceparent": traceparent},
        )
    finally:
        await client.close()
    route = "POST /v1/chat/completions"
    tree = sorted([(route, "client"), ("chat cheap", route), ("chat backup", route)])
    spans = await phoenix.trace(PROJECT, trace_id, len(tree))
    assert _tree(spans) == tree
    failed, answered = _named(spans, "chat cheap"), _named(spans, "chat backup")
    assert (failed.status_code, failed.attributes["error.type"]) == ("ERROR", "server_error")
    assert answered.status_code != "ERROR" and "error.type" not in answered.attributes
    assert answered.attributes == {
        **answered.attributes,
        "gen_ai.request.model": "backup",
        "gen_ai.request.temperature": 0.25,
        "gen_ai.response.id": reply.id,
        "gen_ai.response.model": reply.model,
    }
