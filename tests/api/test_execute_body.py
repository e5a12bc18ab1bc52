"""``POST /v1/modules/{name}/execute`` answers an envelope for any body, a broken one too
(found by the OpenAPI fuzz test: an empty or non-JSON body used to answer OpenAI's error body)."""

from __future__ import annotations

import aiohttp
import pytest

from tests.proxy_server import RunningProxy


@pytest.mark.parametrize(
    "body", [b"", b"not json", b"[1, 2]", b'"text"', b"null", b"{", b'{"inputs": {}}', b"\xff\xfe"]
)
async def test_a_bad_execute_body_is_an_e1001_envelope(proxy: RunningProxy, body: bytes) -> None:
    async with aiohttp.ClientSession() as session:
        answer = await session.post(
            proxy.base + "/modules/code-reviewer/execute",
            data=body,
            headers={"Content-Type": "application/json", "X-Request-Id": "trace-bad-body"},
        )
        envelope = await answer.json()
    assert answer.status == 400
    assert envelope["ok"] is False and envelope["error"]["code"] == "E1001"
    assert envelope["meta"]["confidence"] == 0.0 and envelope["meta"]["trace_id"] == "trace-bad-body"
    assert answer.headers["X-Cognitive-Decision"] == "reject"
    assert answer.headers["X-Cognitive-Trace-Id"] == "trace-bad-body"
