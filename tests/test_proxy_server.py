"""The test harness itself: a served process never stalls on its own output."""

from __future__ import annotations

import json

import aiohttp

from tests.conftest import ROOT
from tests.proxy_server import proxy_process

PIPE_BUFFER = 64 * 1024
"""Linux's default pipe capacity: a child writing more than this to an unread pipe blocks."""
REQUESTS = 400


async def test_a_process_that_logs_more_than_a_pipe_buffer_keeps_serving() -> None:
    policy = ROOT / "policies" / "demo.yaml"
    served_process = proxy_process("--policy", str(policy), "--log-format", "json")
    async with served_process as served, aiohttp.ClientSession() as session:
        for _ in range(REQUESTS):
            async with session.get(served.url + "/v1/models") as resp:
                assert resp.status == 200
    logged = served.output[0] + served.output[1]
    assert len(logged.encode()) > PIPE_BUFFER, "the test must log more than a pipe holds"
    lines = [json.loads(line) for line in logged.splitlines() if line.startswith("{")]
    requests = [line for line in lines if line["event"] == "proxy.request"]
    assert len(requests) == REQUESTS
