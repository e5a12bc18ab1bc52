"""An upstream whose 200 answer is JSON of the wrong shape is a provider failure (502, failover),
never a 500 from the proxy's translation of it.

The Anthropic translation read ``usage``, ``message`` and ``delta`` as objects and token counts as
integers: ``"usage": "x"`` or ``"input_tokens": "a"`` made every Anthropic chat call a 500, and a
stream event of the wrong shape broke the handler.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import orjson
import yaml
from aiohttp import web

from tests.fake_upstream import FakeUpstream
from tests.proxy_server import UPSTREAM_KEY, UPSTREAM_KEY_ENV, proxy_process
from tests.security.conftest import security_policy
from tests.security.harness import raw_http, request_bytes

TEXT = [{"type": "text", "text": "hi"}]
BAD_MESSAGES: list[Any] = [
    {"content": TEXT, "usage": "x"},
    {"content": TEXT, "usage": {"input_tokens": "a", "output_tokens": 1}},
    {"content": TEXT, "usage": {"input_tokens": 1, "output_tokens": [2]}},
]
BAD_EVENTS: list[Any] = [
    {"type": "message_start", "message": "x"},
    {"type": "message_start", "message": {"usage": "x"}},
    {"type": "content_block_start", "index": "a", "content_block": {"type": "text", "text": "x"}},
    {"type": "content_block_delta", "index": 0, "delta": "x"},
    {"type": "error", "error": "x"},
    ["not", "an", "object"],
]


@asynccontextmanager
async def anthropic_like(answers: list[Any]) -> AsyncIterator[str]:
    """A ``/v1/messages`` that answers each request with the next of ``answers``: a JSON body,
    or for a streamed request an SSE stream of that one event."""
    queue = list(answers)

    async def messages(request: web.Request) -> web.StreamResponse:
        body = await request.json()
        answer = queue.pop(0)
        if not body.get("stream"):
            return web.json_response(answer)
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        name = answer.get("type", "message") if isinstance(answer, dict) else "message_start"
        await response.write(f"event: {name}\ndata: ".encode() + orjson.dumps(answer) + b"\n\n")
        await response.write_eof()
        return response

    app = web.Application()
    app.router.add_post("/v1/messages", messages)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    try:
        await web.TCPSite(runner, "127.0.0.1", 0).start()
        yield f"http://127.0.0.1:{runner.addresses[0][1]}"
    finally:
        await runner.cleanup()


def chat(stream: bool) -> bytes:
    body = {"model": "claude", "stream": stream, "messages": [{"role": "user", "content": "hi"}]}
    return request_bytes(
        "POST", "/v1/chat/completions", headers={"Content-Type": "application/json"}, body=orjson.dumps(body)
    )


async def test_an_anthropic_answer_of_the_wrong_shape_is_a_502(
    fake_upstream: FakeUpstream, tmp_path: Path
) -> None:
    async with anthropic_like(BAD_MESSAGES + BAD_EVENTS) as base:
        policy = security_policy(
            fake_upstream, failover={"retries": 0, "timeout": {"per_try_s": 5, "total_s": 10}}
        )
        policy["providers"]["anth"]["base_url"] = base
        path = tmp_path / "policy.yaml"
        path.write_text(yaml.safe_dump(policy))
        async with proxy_process("--policy", str(path), env={UPSTREAM_KEY_ENV: UPSTREAM_KEY}) as served:
            port = int(served.url.rsplit(":", 1)[1])
            for stream, cases in ((False, BAD_MESSAGES), (True, BAD_EVENTS)):
                for case in cases:
                    answer = await raw_http("127.0.0.1", port, chat(stream))
                    assert answer.status == 502, (case, answer)
                    assert orjson.loads(answer.body)["error"]["code"] == "upstream_error", case
    assert "proxy.internal_error" not in served.output[1]
