"""Passthrough chat through the proxy with the official openai SDK against the fake upstream."""

from __future__ import annotations

import aiohttp
import openai
import pytest
from openai.types.chat import ChatCompletionFunctionToolParam

from tests.conftest import ProxyWith
from tests.fake_upstream import DROP, RATE_LIMITED, STREAM_BREAK, FakeUpstream, Fault
from tests.proxy_server import (
    UPSTREAM_KEY,
    UPSTREAM_KEY_ENV,
    RunningProxy,
    record_router_sleeps,
    upstream_policy,
)
from tests.support.polling import until


async def test_plain_chat_is_proxied_with_the_provider_key(
    proxy: RunningProxy, fake_upstream: FakeUpstream
) -> None:
    fake_upstream.script("cheap", "Paris.")
    reply = await proxy.client(api_key="sk-client-own").chat.completions.create(
        model="gpt-4o-mini", messages=[{"role": "user", "content": "Capital of France?"}]
    )
    assert reply.choices[0].message.content == "Paris."
    (sent,) = fake_upstream.requests
    assert sent.json["model"] == "cheap"  # alias -> rung fast -> up/cheap
    assert sent.headers["authorization"] == f"Bearer {UPSTREAM_KEY}"
    assert "sk-client-own" not in str(sent.headers)


async def test_provider_slash_model_names_resolve(proxy: RunningProxy, fake_upstream: FakeUpstream) -> None:
    """``provider/model`` the policy names; others only on ``allow_any_model`` providers
    (tests/security/test_models.py)."""
    await proxy.client().chat.completions.create(
        model="up/strong", messages=[{"role": "user", "content": "x"}]
    )
    assert fake_upstream.requests[0].json["model"] == "strong"


async def test_fields_pass_through_untouched(proxy: RunningProxy, fake_upstream: FakeUpstream) -> None:
    tools: list[ChatCompletionFunctionToolParam] = [
        {"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {}}}}
    ]
    await proxy.client().chat.completions.create(
        model="gpt-4o",
        messages=[{"role": "user", "content": "x"}],
        tools=tools,
        temperature=0.2,
        response_format={"type": "json_object"},
        seed=7,
        extra_body={"vendor_field": {"a": 1}},
    )
    body = fake_upstream.requests[0].json
    assert body["tools"] == tools and body["temperature"] == 0.2 and body["seed"] == 7
    assert body["response_format"] == {"type": "json_object"} and body["vendor_field"] == {"a": 1}


async def test_unknown_model_is_404_listing_what_exists(proxy: RunningProxy) -> None:
    with pytest.raises(openai.NotFoundError) as info:
        await proxy.client().chat.completions.create(
            model="gpt-9", messages=[{"role": "user", "content": "x"}]
        )
    message = info.value.body["message"]  # type: ignore[index]
    assert "gpt-9" in message and "gpt-4o-mini" in message and "module:code-simplifier" in message
    assert info.value.body["code"] == "model_not_found"  # type: ignore[index]


async def test_streaming_is_forwarded_with_usage(proxy: RunningProxy, fake_upstream: FakeUpstream) -> None:
    fake_upstream.script("cheap", "one two three four five")
    stream = await proxy.client().chat.completions.create(
        model="gpt-4o-mini",
        messages=[{"role": "user", "content": "count"}],
        stream=True,
        stream_options={"include_usage": True},
    )
    pieces, usage = [], None
    async for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content:
            pieces.append(chunk.choices[0].delta.content)
        if chunk.usage:
            usage = chunk.usage
    assert "".join(pieces) == "one two three four five"
    assert len(pieces) > 1
    assert usage is not None and usage.total_tokens > 0


async def test_stream_chunks_arrive_before_the_upstream_finishes(proxy_with: ProxyWith) -> None:
    """No buffering: the first chunk reaches the client while the upstream is still streaming."""
    async with (
        FakeUpstream.start(chunk_delay=0.3) as fake,
        proxy_with(upstream_policy(fake)) as px,
    ):
        fake.script("cheap", "a b c d e f")
        stream = await px.client().chat.completions.create(
            model="gpt-4o-mini", messages=[{"role": "user", "content": "x"}], stream=True
        )
        first = await anext(aiter(stream))
        assert first.choices[0].delta.role == "assistant"
        assert fake.in_flight == 1, "the upstream is still sending when the client has the first chunk"
        async for _ in stream:
            pass


async def test_client_disconnect_cancels_the_upstream_stream(proxy_with: ProxyWith) -> None:
    async with (
        FakeUpstream.start(chunk_delay=0.2) as fake,
        proxy_with(upstream_policy(fake)) as px,
    ):
        fake.script("cheap", " ".join(["word"] * 40))
        async with aiohttp.ClientSession() as session:
            resp = await session.post(
                px.base + "/chat/completions",
                json={"model": "gpt-4o-mini", "stream": True, "messages": [{"role": "user", "content": "x"}]},
            )
            await resp.content.readline()
            resp.close()  # hang up mid-stream
        await until(lambda: fake.cancelled, "the upstream call cancelled", step=0.1)
        assert fake.cancelled == 1
        assert fake.in_flight == 0


async def test_stream_that_breaks_after_first_byte_ends_with_an_error_event(
    proxy: RunningProxy, fake_upstream: FakeUpstream
) -> None:
    fake_upstream.script("cheap", "a b c d e f g h", STREAM_BREAK)
    fake_upstream.script("cheap", STREAM_BREAK)
    async with aiohttp.ClientSession() as session:
        resp = await session.post(
            proxy.base + "/chat/completions",
            json={"model": "gpt-4o-mini", "stream": True, "messages": [{"role": "user", "content": "x"}]},
        )
        await proxy.client().models.list()  # unrelated call still works
        text = await resp.text()
    assert resp.status == 200
    assert "data: [DONE]" in text  # the first (healthy) stream
    async with aiohttp.ClientSession() as session:
        resp = await session.post(
            proxy.base + "/chat/completions",
            json={"model": "gpt-4o-mini", "stream": True, "messages": [{"role": "user", "content": "x"}]},
        )
        text = await resp.text()
    assert '"code":"upstream_stream_error"' in text
    assert fake_upstream.count("/v1/chat/completions") == 2  # never retried after the first byte


async def test_upstream_rate_limit_reaches_the_client_with_retry_after(
    proxy: RunningProxy, fake_upstream: FakeUpstream, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each retry waits at least the Retry-After; when retries run out the 429 reaches the client."""
    fake_upstream.script("cheap", RATE_LIMITED, RATE_LIMITED, RATE_LIMITED)
    sleeps = record_router_sleeps(proxy, monkeypatch)
    with pytest.raises(openai.RateLimitError) as info:
        await proxy.client().chat.completions.create(
            model="gpt-4o-mini", messages=[{"role": "user", "content": "x"}]
        )
    # two retries, each Retry-After: 1 plus jitter of up to min(1 s, backoff.max_ms), never below it
    assert len(sleeps.waits) == 2 and all(1.0 <= wait <= 2.0 for wait in sleeps.waits), sleeps.waits
    assert fake_upstream.count("/v1/chat/completions") == 3
    assert info.value.response.headers["retry-after"] == "1"


async def test_upstream_4xx_body_passes_through(proxy: RunningProxy, fake_upstream: FakeUpstream) -> None:
    fake_upstream.script(
        "cheap", Fault.http(400, body='{"error": {"message": "bad thing", "type": "x", "code": "c"}}')
    )
    with pytest.raises(openai.BadRequestError) as info:
        await proxy.client().chat.completions.create(
            model="gpt-4o-mini", messages=[{"role": "user", "content": "x"}]
        )
    assert info.value.body == {"message": "bad thing", "type": "x", "code": "c"}


@pytest.mark.parametrize(
    ("fault", "status"),
    [(DROP, 502), (Fault.http(500), 502), (Fault.http(503), 503), (Fault.malformed(), 502)],
)
async def test_upstream_failures_are_openai_errors(
    proxy: RunningProxy, fake_upstream: FakeUpstream, fault: Fault, status: int
) -> None:
    fake_upstream.script("cheap", fault, fault, fault)  # the first try and both retries fail
    with pytest.raises(openai.APIStatusError) as info:
        await proxy.client().chat.completions.create(
            model="gpt-4o-mini", messages=[{"role": "user", "content": "x"}]
        )
    assert info.value.status_code == status
    assert info.value.body["type"] == "server_error"  # type: ignore[index]


async def test_anthropic_provider_both_ways(proxy: RunningProxy, fake_upstream: FakeUpstream) -> None:
    fake_upstream.script("claude-x", "Bonjour.", "Salut tout le monde")
    reply = await proxy.client().chat.completions.create(
        model="claude",
        messages=[{"role": "system", "content": "Be French."}, {"role": "user", "content": "Hi"}],
    )
    assert reply.choices[0].message.content == "Bonjour."
    assert reply.choices[0].finish_reason == "stop"
    sent = fake_upstream.requests[0]
    assert sent.path == "/v1/messages" and sent.json["system"] == "Be French."
    assert sent.headers["x-api-key"] == UPSTREAM_KEY and "authorization" not in sent.headers
    stream = await proxy.client().chat.completions.create(
        model="claude", messages=[{"role": "user", "content": "Hi"}], stream=True
    )
    text = "".join([c.choices[0].delta.content or "" async for c in stream if c.choices])
    assert text == "Salut tout le monde"


async def test_azure_style_provider_gets_query_and_api_key_header(
    fake_upstream: FakeUpstream, proxy_with: ProxyWith, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(UPSTREAM_KEY_ENV, "azure-key-1")
    policy = upstream_policy(fake_upstream)
    policy["providers"]["up"]["options"] = {"auth_header": "api-key", "query": {"api-version": "2024-10-21"}}
    async with proxy_with(policy) as px:
        await px.client().chat.completions.create(
            model="gpt-4o-mini", messages=[{"role": "user", "content": "x"}]
        )
    sent = fake_upstream.requests[0]
    assert sent.query == "api-version=2024-10-21"
    assert sent.headers["api-key"] == "azure-key-1" and "authorization" not in sent.headers
