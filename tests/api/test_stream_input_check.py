"""A streamed module call checks its input once (#35): before the stream opens, so that a bad
input keeps its 400; the pipeline behind the stream does not check it again. Counted on the
schema validator the input check runs (the real one, wrapped), not timed."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import aiohttp
import pytest

from proxy.json_schema import check
from tests.api.test_modules import REVIEW_INPUT, envelope
from tests.fake_upstream import FakeUpstream
from tests.proxy_server import RunningProxy
from tests.stream.client import read_sse

SSE = {"Accept": "text/event-stream"}


@pytest.fixture
def input_checks(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """The inputs the module input schema was checked against, in order."""
    seen: list[Any] = []
    real: Callable[..., Any] = check

    def counted(validator: Any, value: Any, where: str) -> Any:
        if where == "input":
            seen.append(value)
        return real(validator, value, where)

    monkeypatch.setattr("proxy.contract.inputs.check", counted)  # the name the input check calls
    return seen


async def execute(px: RunningProxy, body: dict[str, Any], headers: dict[str, str]) -> tuple[int, bytes]:
    async with aiohttp.ClientSession() as session:
        resp = await session.post(f"{px.base}/modules/code-reviewer/execute", json=body, headers=headers)
        if resp.content_type == "text/event-stream":
            events = await read_sse(resp)
            return resp.status, repr(events[-1]).encode()
        return resp.status, await resp.read()


async def test_a_streamed_module_call_checks_its_input_once(
    proxy: RunningProxy, fake_upstream: FakeUpstream, input_checks: list[Any]
) -> None:
    fake_upstream.script("cheap", envelope(0.92, rationale="Nothing to change."))
    status, final = await execute(proxy, {"input": REVIEW_INPUT}, SSE)
    assert status == 200 and b"accept" in final
    assert input_checks == [REVIEW_INPUT]


async def test_a_plain_module_call_checks_its_input_once(
    proxy: RunningProxy, fake_upstream: FakeUpstream, input_checks: list[Any]
) -> None:
    fake_upstream.script("cheap", envelope(0.92, rationale="Nothing to change."))
    status, _ = await execute(proxy, {"input": REVIEW_INPUT}, {})
    assert status == 200
    assert input_checks == [REVIEW_INPUT]


async def test_a_bad_streamed_input_is_still_a_400_before_the_stream(
    proxy: RunningProxy, fake_upstream: FakeUpstream, input_checks: list[Any]
) -> None:
    status, body = await execute(proxy, {"input": {"language": "python"}}, SSE)
    assert status == 400 and b"E1002" in body
    assert fake_upstream.requests == []
