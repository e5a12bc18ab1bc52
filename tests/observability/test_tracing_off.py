"""Tracing off (no app of the process exports): every hook returns at the module-level switch,
handing back what it was given; nothing is wrapped, no span is made."""

from __future__ import annotations

import asyncio

import pytest

from proxy.media.cache import Fetched
from proxy.observability import tracing


@pytest.fixture(autouse=True)
def _off(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tracing, "ON", False)


async def test_a_traced_step_is_the_awaitable_itself_and_no_coroutine_of_its_own() -> None:
    step = asyncio.sleep(0, "done")
    assert tracing.traced("context.load", step) is step
    assert await step == "done"


async def test_a_media_fetch_is_handed_back_unwrapped() -> None:
    fetching = asyncio.sleep(0, Fetched("http://example.com/a.png", b"png", "image/png"))
    assert tracing.traced_fetch("http://example.com/a.png?sig=s", fetching) is fetching
    await fetching


def test_no_traceparent_is_set_and_the_headers_are_not_copied() -> None:
    headers = {"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"}
    assert tracing.with_traceparent(headers) is headers
    tracing.inject_traceparent(headers)
    assert headers == {"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"}
    assert tracing.active() is None
