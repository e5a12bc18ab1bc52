"""``edge_dispatch`` (how ``cogproxy serve`` hands the API's requests to the edge, without
aiohttp's middleware chain) answers every kind of request as aiohttp's own dispatch of the same
application does: the same status, headers and body, request by request."""

from __future__ import annotations

import json
import re
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml
from aiohttp import web

from proxy.api.app_keys import METRICS, SETTINGS
from proxy.app import build_app
from proxy.server import SERVER_OPTIONS, EdgeRunner, api_guard
from proxy.settings import Settings
from tests.fake_upstream import FakeUpstream
from tests.paths import MODULES
from tests.proxy_server import UPSTREAM_KEY, UPSTREAM_KEY_ENV, upstream_policy

CHAT = {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "x"}]}
REQUESTS: list[tuple[str, str, Any, dict[str, str]]] = [
    ("POST", "/v1/chat/completions", CHAT, {}),
    ("POST", "/v1/chat/completions", {**CHAT, "stream": True}, {}),
    ("POST", "/v1/chat/completions", CHAT, {"Expect": "100-continue"}),
    ("POST", "/v1/chat/completions", CHAT, {"Expect": "something-else"}),
    ("POST", "/v1/chat/completions", {"model": "no-such-model", "messages": []}, {}),
    ("GET", "/v1/models", None, {}),
    ("DELETE", "/v1/modules", None, {}),
    ("POST", "/v1/modules/no-such-module/execute", {"input": {}}, {}),
    ("GET", "/no-such-route", None, {"Expect": "100-continue"}),
    ("GET", "/healthz", None, {}),
    ("GET", "/v1/usage?client=x", None, {}),
]
_UPSTREAM_MADE = re.compile(rb'chatcmpl-[0-9a-f]+|"created": ?[0-9]+')
"""What the fake upstream makes anew for every answer: its id and time."""
Runner = Callable[[web.Application], web.AppRunner]
Callback = Callable[[web.Request, web.StreamResponse], Awaitable[None]]


@asynccontextmanager
async def _served(
    tmp_path: Path, policy: dict[str, Any], runner: Runner, *callbacks: Callback
) -> AsyncIterator[str]:
    path = tmp_path / "policy.yaml"
    path.write_text(yaml.safe_dump(json.loads(json.dumps(policy))))
    app = build_app(Settings(policy_path=path, module_dirs=(MODULES,), port=0))
    app.on_response_prepare.extend(callbacks)
    served = runner(app)
    await served.setup()
    await web.TCPSite(served, "127.0.0.1", 0).start()
    host, port = served.addresses[0][:2]
    try:
        yield f"http://{host}:{port}"
    finally:
        await served.cleanup()


async def _answers(url: str) -> list[tuple[int, list[tuple[str, str]], bytes]]:
    answers = []
    async with aiohttp.ClientSession() as session:
        for number, (method, path, body, headers) in enumerate(REQUESTS):
            sent = {"X-Request-Id": f"request-{number}", **headers}
            async with session.request(method, url + path, json=body, headers=sent) as answer:
                kept = [(k, v) for k, v in answer.headers.items() if k not in ("Date", "Content-Length")]
                answers.append((answer.status, kept, _UPSTREAM_MADE.sub(b"", await answer.read())))
    return answers


def _aiohttps(app: web.Application) -> web.AppRunner:
    return web.AppRunner(app, handler_cancellation=True, access_log=None, **SERVER_OPTIONS)


def _edges(app: web.Application) -> web.AppRunner:
    guard = api_guard(app[SETTINGS], app[METRICS])
    return EdgeRunner(app, guard, handler_cancellation=True, access_log=None, **SERVER_OPTIONS)


async def test_the_edge_dispatch_answers_as_aiohttps_own(
    fake_upstream: FakeUpstream, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(UPSTREAM_KEY_ENV, UPSTREAM_KEY)
    policy = upstream_policy(fake_upstream)
    async with _served(tmp_path, policy, _aiohttps) as url:
        theirs = await _answers(url)
    async with _served(tmp_path, policy, _edges) as url:
        ours = await _answers(url)
    assert [status for status, _, _ in ours] == [200, 200, 200, 417, 404, 200, 405, 404, 404, 200, 401]
    for request, mine, expected in zip(REQUESTS, ours, theirs, strict=True):
        assert mine == expected, request


@pytest.mark.parametrize("limited", [False, True])
async def test_the_edge_sets_the_answer_headers_as_aiohttps_signal_does(
    fake_upstream: FakeUpstream, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, limited: bool
) -> None:
    """The edge's request class sets the trace id and rate-limit headers without the signal; an
    app with a callback of another's still runs every callback, its own included."""
    monkeypatch.setenv(UPSTREAM_KEY_ENV, UPSTREAM_KEY)
    policy = upstream_policy(fake_upstream)
    if limited:
        policy["limits"] = {"clients": {"default": {"rpm": 100}}}

    async def another(request: web.Request, response: web.StreamResponse) -> None:
        response.headers["X-Another"] = type(request).__name__

    for callbacks in [(), (another,)]:
        async with _served(tmp_path, policy, _edges, *callbacks) as url, aiohttp.ClientSession() as session:
            sent = {"X-Request-Id": "request-1"}
            async with session.post(url + "/v1/chat/completions", json=CHAT, headers=sent) as answer:
                assert answer.status == 200
                assert answer.headers["X-Cognitive-Trace-Id"] == "request-1"
                assert ("x-ratelimit-limit-requests" in answer.headers) is limited
                assert answer.headers.get("X-Another") == ("Request" if callbacks else None)
