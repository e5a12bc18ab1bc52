"""A streamed module call's ``proxy.request`` line carries its decision: the stream's producer
reports it as data (``proxy.service``), copied into the request's record before the line is
written, never written into the request after it finished."""

from __future__ import annotations

import json
from collections.abc import MutableMapping
from typing import Any

from structlog.testing import capture_logs

from tests.api.test_modules import REVIEW_INPUT
from tests.api.test_streaming import SSE, answer, execute
from tests.fake_upstream import FakeUpstream
from tests.proxy_server import RunningProxy
from tests.stream.client import read_sse
from tests.support.polling import until


def _request_lines(logs: list[MutableMapping[str, Any]]) -> list[MutableMapping[str, Any]]:
    return [e for e in logs if e["event"] == "proxy.request" and e.get("module") == "code-reviewer"]


async def test_a_streamed_calls_request_line_carries_its_decision(
    proxy: RunningProxy, fake_upstream: FakeUpstream
) -> None:
    fake_upstream.script("cheap", answer(0.3))
    fake_upstream.script("strong", answer(0.93))
    with capture_logs() as logs:
        session, response = await execute(proxy, SSE)
        async with session, response:
            events = await read_sse(response)
        lines = await until(lambda: _request_lines(logs), "the request line of the streamed call")
    assert events[-1][0] == "final", events[-1]
    line = lines[0]
    assert line["decision"] == "escalated" and line["confidence"] == 0.93 and line["risk"] == "low"
    assert line["attempts"] == 2 and line["target"] and line["tier"]
    assert line["upstream_ms"] > 0


async def test_a_streamed_chat_calls_request_line_carries_its_decision(
    proxy: RunningProxy, fake_upstream: FakeUpstream
) -> None:
    fake_upstream.script("cheap", answer(0.95))
    with capture_logs() as logs:
        stream = await proxy.client().chat.completions.create(
            model="module:code-reviewer",
            messages=[{"role": "user", "content": json.dumps(REVIEW_INPUT)}],
            stream=True,
        )
        async for _ in stream:
            pass
        lines = await until(lambda: _request_lines(logs), "the request line of the streamed chat call")
    assert lines[0]["decision"] == "accept" and lines[0]["confidence"] == 0.95
