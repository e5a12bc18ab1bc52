"""``POST /v1/modules/{name}/execute`` answers an envelope for any body, a broken one too
(found by the OpenAPI fuzz test: an empty or non-JSON body used to answer OpenAI's error body)."""

from __future__ import annotations

import aiohttp
import pytest

from tests.proxy_server import RunningProxy


@pytest.mark.parametrize(
    ("body", "code"),
    [
        (b"", "E1000"),
        (b"not json", "E1000"),
        (b"[1, 2]", "E1000"),
        (b'"text"', "E1000"),
        (b"null", "E1000"),
        (b"{", "E1000"),
        (b"\xff\xfe", "E1000"),
        (b'{"inputs": {}}', "E1001"),
    ],
)
async def test_a_bad_execute_body_is_an_envelope(proxy: RunningProxy, body: bytes, code: str) -> None:
    """Not one JSON object: E1000 (the caller's parse error); no ``input`` field: E1001. Both 400."""
    async with aiohttp.ClientSession() as session:
        answer = await session.post(
            proxy.base + "/modules/code-reviewer/execute",
            data=body,
            headers={"Content-Type": "application/json", "X-Request-Id": "trace-bad-body"},
        )
        envelope = await answer.json()
    assert answer.status == 400
    assert envelope["ok"] is False and envelope["error"]["code"] == code
    assert envelope["meta"]["confidence"] == 0.0 and envelope["meta"]["trace_id"] == "trace-bad-body"
    assert answer.headers["X-Cognitive-Decision"] == "reject"
    assert answer.headers["X-Cognitive-Trace-Id"] == "trace-bad-body"
