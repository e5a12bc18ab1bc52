"""``X-Cognitive-Trace-Id`` is set in one place (``proxy.api.middleware.echo_trace_id``, called
on the ``on_response_prepare`` signal) and reaches every answer of the public listener: plain and streamed
passthrough, module envelopes, error bodies, including errors aiohttp raises itself (unknown route)."""

from __future__ import annotations

from typing import Any

import aiohttp
import pytest

from proxy.api.middleware import TRACE_HEADER
from tests.proxy_server import RunningProxy

CHAT = {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "x"}]}


@pytest.mark.parametrize(
    ("method", "path", "body", "status"),
    [
        ("POST", "/v1/chat/completions", CHAT, 200),
        ("POST", "/v1/chat/completions", {**CHAT, "stream": True}, 200),
        ("GET", "/v1/models", None, 200),
        ("POST", "/v1/modules/code-reviewer/execute", {"inputs": {}}, 400),
        ("POST", "/v1/modules/no-such-module/execute", {"input": {}}, 404),
        ("GET", "/no-such-route", None, 404),
        ("GET", "/healthz", None, 200),
    ],
)
async def test_every_answer_carries_the_trace_id(
    proxy: RunningProxy, method: str, path: str, body: Any, status: int
) -> None:
    async with aiohttp.ClientSession() as session:
        answer = await session.request(
            method, proxy.url + path, json=body, headers={"X-Request-Id": "trace-one-place"}
        )
        await answer.read()
    assert answer.status == status
    assert answer.headers.getall(TRACE_HEADER) == ["trace-one-place"]
