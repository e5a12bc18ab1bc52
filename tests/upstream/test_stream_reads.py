"""``Provider.relay_stream``: connecting is bounded, the silence between reads is left to the caller
(the passthrough's ``relay.copy``), so aiohttp re-arms no timer per read (#35); ``Provider.stream``
bounds each read."""

from __future__ import annotations

from collections.abc import AsyncIterator

import aiohttp
import pytest

from proxy.policy.model import ProviderConfig
from proxy.upstream.anthropic import AnthropicProvider
from proxy.upstream.base import CallInfo, Provider, ProviderError
from proxy.upstream.body import Body
from proxy.upstream.openai import OpenAIProvider
from tests.fake_upstream import FakeUpstream, Fault

TIMEOUT_S = 0.2
PAUSE_S = 3 * TIMEOUT_S
"""The upstream's pause after its first frame: past ``TIMEOUT_S``."""
KEY_ENV = "TEST_STREAM_READS_KEY"
BODY = {"messages": [{"role": "user", "content": "hi"}]}


@pytest.fixture(autouse=True)
def key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(KEY_ENV, "sk-upstream")


def provider(kind: str, fake: FakeUpstream, session: aiohttp.ClientSession) -> Provider:
    if kind == "openai":
        return OpenAIProvider(ProviderConfig("up", "openai", fake.openai_base, KEY_ENV), session)
    return AnthropicProvider(ProviderConfig("anth", "anthropic", fake.url, KEY_ENV), session)


async def joined(chunks: AsyncIterator[bytes]) -> bytes:
    return b"".join([chunk async for chunk in chunks])


async def read_whole(body: Body) -> bytes:
    pieces = []
    try:
        while chunk := await body.read():
            pieces.append(chunk)
    finally:
        await body.close()
    return b"".join(pieces)


@pytest.mark.parametrize("kind", ["openai", "anthropic"])
async def test_a_relayed_stream_outlasts_a_pause_longer_than_its_timeout(
    fake_upstream: FakeUpstream, kind: str
) -> None:
    fake_upstream.script("m", Fault.stall(1, PAUSE_S))
    async with aiohttp.ClientSession() as session:
        body = await provider(kind, fake_upstream, session).relay_stream(BODY, "m", CallInfo(), TIMEOUT_S)
        answer = await read_whole(body)
    assert answer.endswith(b"data: [DONE]\n\n")


@pytest.mark.parametrize("kind", ["openai", "anthropic"])
async def test_a_stream_with_bounded_reads_fails_on_a_pause_longer_than_its_timeout(
    fake_upstream: FakeUpstream, kind: str
) -> None:
    fake_upstream.script("m", Fault.stall(1, PAUSE_S))
    async with aiohttp.ClientSession() as session:
        chunks = provider(kind, fake_upstream, session).stream(BODY, "m", CallInfo(), TIMEOUT_S)
        with pytest.raises(ProviderError) as failed:
            await joined(chunks)
    assert failed.value.kind == "timeout"
