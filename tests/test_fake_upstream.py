"""The fake upstream speaks real OpenAI (checked with the official SDK) and Anthropic wire formats."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import openai
import pytest
from openai import AsyncOpenAI
from openai.types.chat import ChatCompletionMessageParam

from tests.fake_upstream import (
    DEFAULT_CONTENT,
    DROP,
    MALFORMED,
    RATE_LIMITED,
    STREAM_BREAK,
    FakeUpstream,
    Fault,
)
from tests.fake_upstream import fake_upstream as fake_upstream  # the fixture, re-exported

ANTHROPIC_HEADERS = {"x-api-key": "sk-ant", "anthropic-version": "2023-06-01"}
MESSAGES: list[ChatCompletionMessageParam] = [{"role": "user", "content": "Say hello to the proxy"}]


def client(fake: FakeUpstream, **kwargs: Any) -> AsyncOpenAI:
    kwargs = {"api_key": "sk-test", "max_retries": 0, **kwargs}
    return AsyncOpenAI(base_url=fake.openai_base, **kwargs)


async def sse_events(resp: aiohttp.ClientResponse) -> AsyncIterator[tuple[str, Any]]:
    """Parse `event:`/`data:` frames from a raw aiohttp response."""
    event = ""
    async for raw in resp.content:
        line = raw.decode().rstrip("\n")
        if line.startswith("event: "):
            event = line.removeprefix("event: ")
        elif line.startswith("data: "):
            data = line.removeprefix("data: ")
            yield event, data if data == "[DONE]" else json.loads(data)
            event = ""


async def test_openai_sdk_non_streaming_gets_a_chat_completion_echoing_the_model(
    fake_upstream: FakeUpstream,
) -> None:
    async with client(fake_upstream) as sdk:
        completion = await sdk.chat.completions.create(model="gpt-4o-mini", messages=MESSAGES)
    assert completion.object == "chat.completion"
    assert completion.model == "gpt-4o-mini"
    assert completion.choices[0].message.role == "assistant"
    assert completion.choices[0].message.content == DEFAULT_CONTENT
    assert completion.choices[0].finish_reason == "stop"
    assert completion.usage is not None
    usage = completion.usage
    assert usage.total_tokens == usage.prompt_tokens + usage.completion_tokens


async def test_openai_sdk_streaming_chunks_join_to_the_content_and_end_with_usage(
    fake_upstream: FakeUpstream,
) -> None:
    fake_upstream.script("gpt-4o", "one two three four five")
    async with client(fake_upstream) as sdk:
        stream = await sdk.chat.completions.create(
            model="gpt-4o",
            messages=MESSAGES,
            stream=True,
            stream_options={"include_usage": True},
        )
        chunks = [chunk async for chunk in stream]
    assert chunks[0].choices[0].delta.role == "assistant"
    content_chunks = [c for c in chunks if c.choices and c.choices[0].delta.content]
    assert len(content_chunks) == 5
    assert "".join(c.choices[0].delta.content or "" for c in content_chunks) == "one two three four five"
    assert chunks[-2].choices[0].finish_reason == "stop"
    assert chunks[-1].choices == []
    assert chunks[-1].usage is not None
    assert chunks[-1].usage.completion_tokens == 5
    assert all(c.object == "chat.completion.chunk" and c.model == "gpt-4o" for c in chunks)


async def test_openai_streaming_without_include_usage_has_no_usage_chunk(fake_upstream: FakeUpstream) -> None:
    async with client(fake_upstream) as sdk:
        stream = await sdk.chat.completions.create(model="m", messages=MESSAGES, stream=True)
        chunks = [chunk async for chunk in stream]
    assert chunks[-1].choices[0].finish_reason == "stop"
    assert all(c.usage is None for c in chunks)


async def test_streamed_frames_are_written_one_at_a_time_then_done() -> None:
    async with FakeUpstream.start(chunk_delay=0.05) as fake, aiohttp.ClientSession() as http:
        fake.script("m", "a b c")
        body = {"model": "m", "messages": MESSAGES, "stream": True}
        async with http.post(f"{fake.openai_base}/chat/completions", json=body) as resp:
            assert resp.headers["Content-Type"].startswith("text/event-stream")
            reads = [data async for data in resp.content.iter_any()]
    frames = b"".join(reads).split(b"\n\n")
    assert frames[-2:] == [b"data: [DONE]", b""]
    assert len(reads) == len(frames) - 1  # role, 3 content deltas, stop, [DONE]: each its own read


async def test_429_with_retry_after_surfaces_as_rate_limit_error(fake_upstream: FakeUpstream) -> None:
    fake_upstream.script("m", RATE_LIMITED)
    async with client(fake_upstream) as sdk:
        with pytest.raises(openai.RateLimitError) as caught:
            await sdk.chat.completions.create(model="m", messages=MESSAGES)
    assert caught.value.response.headers["retry-after"] == "1"
    assert caught.value.code == "rate_limit_exceeded"


@pytest.mark.parametrize(
    ("status", "error"),
    [(500, openai.InternalServerError), (503, openai.InternalServerError), (400, openai.BadRequestError)],
)
async def test_status_faults_surface_as_the_matching_sdk_error(
    fake_upstream: FakeUpstream, status: int, error: type[openai.APIStatusError]
) -> None:
    fake_upstream.script("m", Fault.http(status))
    async with client(fake_upstream) as sdk:
        with pytest.raises(error) as caught:
            await sdk.chat.completions.create(model="m", messages=MESSAGES)
    assert caught.value.status_code == status


async def test_drop_surfaces_as_api_connection_error(fake_upstream: FakeUpstream) -> None:
    fake_upstream.script("m", DROP)
    async with client(fake_upstream) as sdk:
        with pytest.raises(openai.APIConnectionError):
            await sdk.chat.completions.create(model="m", messages=MESSAGES)
        completion = await sdk.chat.completions.create(model="m", messages=MESSAGES)
    assert completion.choices[0].message.content == DEFAULT_CONTENT


async def test_drop_surfaces_as_server_disconnected_for_raw_aiohttp(fake_upstream: FakeUpstream) -> None:
    fake_upstream.script("m", DROP)
    async with aiohttp.ClientSession() as http:
        with pytest.raises(aiohttp.ServerDisconnectedError):
            await http.post(f"{fake_upstream.openai_base}/chat/completions", json={"model": "m"})


async def test_slow_reply_with_a_short_client_timeout_surfaces_as_api_timeout_error(
    fake_upstream: FakeUpstream,
) -> None:
    fake_upstream.script("m", Fault.slow(2.0))
    async with client(fake_upstream, timeout=0.2) as sdk:
        with pytest.raises(openai.APITimeoutError):
            await sdk.chat.completions.create(model="m", messages=MESSAGES)


async def test_slow_reply_answers_normally_after_the_delay(fake_upstream: FakeUpstream) -> None:
    fake_upstream.script("m", Fault.slow(0.2, content="late"))
    async with client(fake_upstream) as sdk:
        task = asyncio.create_task(sdk.chat.completions.create(model="m", messages=MESSAGES))
        await asyncio.sleep(0.1)
        assert fake_upstream.in_flight == 1
        completion = await task
    assert completion.choices[0].message.content == "late"
    assert fake_upstream.in_flight == 0


async def test_malformed_reply_is_a_200_that_is_not_json(fake_upstream: FakeUpstream) -> None:
    fake_upstream.script("m", MALFORMED)
    url = f"{fake_upstream.openai_base}/chat/completions"
    async with aiohttp.ClientSession() as http, http.post(url, json={"model": "m"}) as resp:
        assert resp.status == 200
        with pytest.raises(json.JSONDecodeError):
            json.loads(await resp.text())


async def test_scripted_replies_are_consumed_in_order_per_model_then_the_default(
    fake_upstream: FakeUpstream,
) -> None:
    fake_upstream.script("a", "first", "second")
    fake_upstream.script("b", "other")
    fake_upstream.set_default_reply("a", {"answer": 42})
    async with client(fake_upstream) as sdk:
        contents = [
            (await sdk.chat.completions.create(model=model, messages=MESSAGES)).choices[0].message.content
            for model in ["a", "b", "a", "a", "b"]
        ]
    assert contents == ["first", "other", "second", '{"answer": 42}', DEFAULT_CONTENT]
    assert fake_upstream.default_reply("a") == '{"answer": 42}'


async def test_requests_are_recorded_with_lowercase_headers_body_and_query(
    fake_upstream: FakeUpstream,
) -> None:
    async with client(fake_upstream, default_headers={"X-Trace-Id": "t-1"}) as sdk:
        await sdk.chat.completions.create(model="gpt-4o", messages=MESSAGES)
        await sdk.models.list()
    async with aiohttp.ClientSession() as http:
        await (await http.get(f"{fake_upstream.openai_base}/models?limit=2")).read()
    chat = fake_upstream.requests[0]
    assert (chat.method, chat.path, chat.query) == ("POST", "/v1/chat/completions", "")
    assert chat.headers["authorization"] == "Bearer sk-test"
    assert chat.headers["x-trace-id"] == "t-1"
    assert chat.json == {"model": "gpt-4o", "messages": MESSAGES}
    assert fake_upstream.requests[1].json is None
    assert fake_upstream.requests[2].query == "limit=2"
    assert fake_upstream.count() == 3
    assert fake_upstream.count("/v1/models") == 2
    assert fake_upstream.count(model="gpt-4o") == 1
    fake_upstream.reset()
    assert fake_upstream.count() == 0


async def test_models_endpoint_answers_an_openai_list(fake_upstream: FakeUpstream) -> None:
    fake_upstream.script("gpt-4o", "x")
    async with client(fake_upstream) as sdk:
        ids = [model.id async for model in sdk.models.list()]
    assert "gpt-4o" in ids


async def test_unknown_v1_path_answers_openai_404(fake_upstream: FakeUpstream) -> None:
    async with client(fake_upstream) as sdk:
        with pytest.raises(openai.NotFoundError) as caught:
            await sdk.embeddings.create(model="m", input="x")
    assert caught.value.body == {
        "message": "Unknown path POST /v1/embeddings",
        "type": "invalid_request_error",
        "param": None,
        "code": "not_found",
    }


async def test_anthropic_non_streaming_message(fake_upstream: FakeUpstream) -> None:
    fake_upstream.script("claude-x", "Bonjour")
    body = {"model": "claude-x", "max_tokens": 64, "messages": MESSAGES}
    url = f"{fake_upstream.url}/v1/messages"
    async with aiohttp.ClientSession() as http, http.post(url, json=body, headers=ANTHROPIC_HEADERS) as resp:
        assert resp.status == 200
        message = await resp.json()
    assert message["type"] == "message"
    assert message["role"] == "assistant"
    assert message["model"] == "claude-x"
    assert message["content"] == [{"type": "text", "text": "Bonjour"}]
    assert (message["stop_reason"], message["stop_sequence"]) == ("end_turn", None)
    assert message["usage"] == {"input_tokens": 5, "output_tokens": 1}


async def test_anthropic_stream_follows_the_real_event_sequence(fake_upstream: FakeUpstream) -> None:
    fake_upstream.script("claude-x", "streamed three words")
    body = {"model": "claude-x", "max_tokens": 64, "messages": MESSAGES, "stream": True}
    url = f"{fake_upstream.url}/v1/messages"
    async with aiohttp.ClientSession() as http, http.post(url, json=body, headers=ANTHROPIC_HEADERS) as resp:
        assert resp.headers["Content-Type"].startswith("text/event-stream")
        events = [event async for event in sse_events(resp)]
    names = [name for name, _ in events]
    assert names == [
        "message_start",
        "content_block_start",
        "content_block_delta",
        "content_block_delta",
        "content_block_delta",
        "content_block_stop",
        "message_delta",
        "message_stop",
    ]
    assert all(data["type"] == name for name, data in events)
    assert events[0][1]["message"]["usage"]["input_tokens"] == 5
    assert events[0][1]["message"]["model"] == "claude-x"
    deltas = [data["delta"] for name, data in events if name == "content_block_delta"]
    assert all(d["type"] == "text_delta" for d in deltas)
    assert "".join(d["text"] for d in deltas) == "streamed three words"
    assert events[-2][1]["delta"]["stop_reason"] == "end_turn"
    assert events[-2][1]["usage"] == {"output_tokens": 3}


async def test_anthropic_faults_use_the_anthropic_error_format(fake_upstream: FakeUpstream) -> None:
    fake_upstream.script("claude-x", Fault.http(529, retry_after=2.5))
    url, body = f"{fake_upstream.url}/v1/messages", {"model": "claude-x"}
    async with aiohttp.ClientSession() as http, http.post(url, json=body, headers=ANTHROPIC_HEADERS) as resp:
        assert resp.status == 529
        assert resp.headers["Retry-After"] == "2.5"
        assert (await resp.json())["error"]["type"] == "overloaded_error"


@pytest.mark.parametrize("missing", ["x-api-key", "anthropic-version"])
async def test_anthropic_requires_api_key_and_version_headers(
    fake_upstream: FakeUpstream, missing: str
) -> None:
    headers = {k: v for k, v in ANTHROPIC_HEADERS.items() if k != missing}
    fake_upstream.script("claude-x", "kept for later")
    url, body = f"{fake_upstream.url}/v1/messages", {"model": "claude-x"}
    async with aiohttp.ClientSession() as http, http.post(url, json=body, headers=headers) as resp:
        assert resp.status == 401
        assert (await resp.json())["error"]["type"] == "authentication_error"
    assert fake_upstream.next_reply("claude-x") == "kept for later"  # rejected requests consume nothing


async def test_api_key_is_enforced_on_openai_and_anthropic_routes() -> None:
    async with FakeUpstream.start(api_key="sk-upstream") as fake:
        async with client(fake, api_key="sk-wrong") as sdk:
            with pytest.raises(openai.AuthenticationError):
                await sdk.chat.completions.create(model="m", messages=MESSAGES)
        async with client(fake, api_key="sk-upstream") as sdk:
            await sdk.chat.completions.create(model="m", messages=MESSAGES)
        async with aiohttp.ClientSession() as http:
            url, body = f"{fake.url}/v1/messages", {"model": "claude-x"}
            async with http.post(url, json=body, headers=ANTHROPIC_HEADERS) as resp:
                assert resp.status == 401
            headers = {**ANTHROPIC_HEADERS, "x-api-key": "sk-upstream"}
            async with http.post(url, json=body, headers=headers) as resp:
                assert resp.status == 200


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/messages"])
async def test_stream_break_sends_two_chunks_then_drops(fake_upstream: FakeUpstream, path: str) -> None:
    fake_upstream.script("m", STREAM_BREAK)
    received: list[tuple[str, Any]] = []
    async with aiohttp.ClientSession() as http:
        body = {"model": "m", "messages": MESSAGES, "stream": True}
        async with http.post(fake_upstream.url + path, json=body, headers=ANTHROPIC_HEADERS) as resp:
            assert resp.status == 200
            with pytest.raises(aiohttp.ClientPayloadError):
                async for event in sse_events(resp):
                    received.append(event)
    assert len(received) == 2


async def test_client_disconnect_mid_stream_counts_as_cancelled() -> None:
    async with FakeUpstream.start(chunk_delay=0.05) as fake, aiohttp.ClientSession() as http:
        fake.script("m", " ".join(["word"] * 50))
        body = {"model": "m", "messages": MESSAGES, "stream": True}
        async with http.post(f"{fake.openai_base}/chat/completions", json=body) as resp:
            await resp.content.readline()
            assert fake.in_flight == 1
            resp.close()
        for _ in range(100):
            if fake.cancelled:
                break
            await asyncio.sleep(0.02)
        assert fake.cancelled == 1
        assert fake.in_flight == 0
