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
    MALFORMED_FRAME,
    OPENAI_RATE_LIMIT_HEADERS,
    RATE_LIMITED,
    STREAM_BREAK,
    FakeUpstream,
    Fault,
    embedding_vector,
)
from tests.fake_upstream import fake_upstream as fake_upstream  # the fixture, re-exported
from tests.support.polling import until

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
        await until(lambda: fake_upstream.in_flight or task.done(), "the reply held", step=0.01)
        assert fake_upstream.in_flight == 1, "the reply is held for its delay"
        completion = await task
    assert completion.choices[0].message.content == "late"
    assert fake_upstream.in_flight == 0


async def test_cut_reply_reports_the_token_limit_on_both_wires(fake_upstream: FakeUpstream) -> None:
    fake_upstream.script("m", Fault.cut('{"half": '), "whole")
    fake_upstream.script("claude-x", Fault.cut("half an"))
    async with client(fake_upstream) as sdk:
        cut = await sdk.chat.completions.create(model="m", messages=MESSAGES)
        whole = await sdk.chat.completions.create(model="m", messages=MESSAGES)
    assert (cut.choices[0].message.content, cut.choices[0].finish_reason) == ('{"half": ', "length")
    assert whole.choices[0].finish_reason == "stop"
    url, body = f"{fake_upstream.url}/v1/messages", {"model": "claude-x"}
    async with aiohttp.ClientSession() as http, http.post(url, json=body, headers=ANTHROPIC_HEADERS) as resp:
        message = await resp.json()
    assert message["stop_reason"] == "max_tokens" and message["content"][0]["text"] == "half an"


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
            await sdk.post("/batches/nope", cast_to=object, body={"model": "m"})
    assert caught.value.body == {
        "message": "Unknown path POST /v1/batches/nope",
        "type": "invalid_request_error",
        "param": None,
        "code": "not_found",
    }
    url = f"{fake_upstream.openai_base}/vector_stores/vs_1/files?limit=3"
    async with aiohttp.ClientSession() as http, http.get(url) as resp:
        assert resp.status == 404
        assert resp.headers["x-ratelimit-limit-requests"] == "500"
        assert await resp.json() == {
            "error": {
                "message": "Unknown path GET /v1/vector_stores/vs_1/files",
                "type": "invalid_request_error",
                "param": None,
                "code": "not_found",
            }
        }
    assert fake_upstream.requests[-1].query == "limit=3"


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


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/messages", "/v1/responses"])
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
        await until(lambda: fake.cancelled, "the streamed reply cancelled", step=0.02)
        assert fake.cancelled == 1
        assert fake.in_flight == 0


# -- embeddings, moderations, responses, uploads ---------------------------------------------------------


async def test_embeddings_float_one_vector_per_input(fake_upstream: FakeUpstream) -> None:
    async with client(fake_upstream) as sdk:
        result = await sdk.embeddings.create(
            model="text-embedding-3-small", input=["alpha", "beta gamma"], encoding_format="float"
        )
    assert result.object == "list"
    assert result.model == "text-embedding-3-small"
    assert [(e.object, e.index) for e in result.data] == [("embedding", 0), ("embedding", 1)]
    assert result.data[0].embedding == embedding_vector("alpha")
    assert result.data[1].embedding == embedding_vector("beta gamma")
    assert len(result.data[0].embedding) == 8
    assert result.data[0].embedding != result.data[1].embedding
    assert (result.usage.prompt_tokens, result.usage.total_tokens) == (3, 3)
    assert fake_upstream.requests[0].json["encoding_format"] == "float"


async def test_embeddings_default_base64_is_decoded_by_the_sdk(fake_upstream: FakeUpstream) -> None:
    async with client(fake_upstream) as sdk:
        result = await sdk.embeddings.create(model="emb", input="hello")
    assert fake_upstream.requests[0].json["encoding_format"] == "base64"  # the SDK default
    assert result.data[0].embedding == embedding_vector("hello")
    body = {"model": "emb", "input": [[1, 2, 3], [4, 5]], "encoding_format": "base64"}
    url = f"{fake_upstream.openai_base}/embeddings"
    async with aiohttp.ClientSession() as http, http.post(url, json=body) as resp:
        raw = await resp.json()
    assert all(isinstance(e["embedding"], str) for e in raw["data"])
    assert len(raw["data"]) == 2
    assert raw["usage"] == {"prompt_tokens": 5, "total_tokens": 5}


async def test_embeddings_consume_faults_and_ignore_scripted_text(fake_upstream: FakeUpstream) -> None:
    fake_upstream.script("emb", RATE_LIMITED, "not used by embeddings")
    async with client(fake_upstream) as sdk:
        with pytest.raises(openai.RateLimitError) as caught:
            await sdk.embeddings.create(model="emb", input="x")
        assert caught.value.response.headers["retry-after"] == "1"
        result = await sdk.embeddings.create(model="emb", input="x", encoding_format="float")
        with pytest.raises(openai.BadRequestError):
            await sdk.embeddings.create(model="emb", input=[])
    assert result.data[0].embedding == embedding_vector("x")
    assert fake_upstream.next_reply("emb") == DEFAULT_CONTENT


async def test_moderations_answer_one_unflagged_result_per_input(fake_upstream: FakeUpstream) -> None:
    async with client(fake_upstream) as sdk:
        single = await sdk.moderations.create(model="omni-moderation-latest", input="be nice")
        double = await sdk.moderations.create(input=["one", "two"])
    assert single.id.startswith("modr-")
    assert single.model == "omni-moderation-latest"
    (result,) = single.results
    assert result.flagged is False
    assert result.categories.hate is False
    assert result.categories.self_harm is False
    assert result.category_scores.violence < 0.01
    assert len(double.results) == 2
    assert fake_upstream.count("/v1/moderations") == 2


async def test_responses_non_streamed_answer_parses_with_the_sdk(fake_upstream: FakeUpstream) -> None:
    fake_upstream.script("gpt-4.1", "one two three")
    async with client(fake_upstream) as sdk:
        response = await sdk.responses.create(model="gpt-4.1", input="hi", instructions="be brief")
        default = await sdk.responses.create(model="gpt-4.1", input=[{"role": "user", "content": "hi"}])
    assert response.object == "response"
    assert response.id.startswith("resp_")
    assert response.status == "completed"
    assert response.model == "gpt-4.1"
    assert response.output_text == "one two three"
    assert response.instructions == "be brief"
    assert (response.error, response.incomplete_details, response.tools) == (None, None, [])
    message = response.output[0]
    assert message.type == "message"
    assert message.role == "assistant"
    assert message.id.startswith("msg_")
    usage = response.usage
    assert usage is not None
    assert (usage.input_tokens, usage.output_tokens, usage.total_tokens) == (3, 3, 6)
    assert usage.input_tokens_details.cached_tokens == 0
    assert usage.output_tokens_details.reasoning_tokens == 0
    assert default.output_text == DEFAULT_CONTENT


async def test_responses_stream_follows_the_real_event_sequence() -> None:
    async with FakeUpstream.start(chunk_delay=0.01) as fake, client(fake) as sdk:
        fake.script("gpt-4.1", "streamed in four words")
        stream = await sdk.responses.create(model="gpt-4.1", input="hi", stream=True)
        events = [event async for event in stream]
    types = [e.type for e in events]
    assert types == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
        *["response.output_text.delta"] * 4,
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed",
    ]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    deltas = [e.delta for e in events if e.type == "response.output_text.delta"]
    assert "".join(deltas) == "streamed in four words"
    first, last = events[0], events[-1]
    assert first.type == "response.created"
    assert first.response.status == "in_progress"
    assert last.type == "response.completed"
    assert last.response.status == "completed"
    assert last.response.output_text == "streamed in four words"
    assert last.response.id == first.response.id


async def test_responses_stream_frames_are_sse_events_written_one_by_one() -> None:
    async with FakeUpstream.start(chunk_delay=0.05) as fake, aiohttp.ClientSession() as http:
        fake.script("m", "a b")
        body = {"model": "m", "input": "hi", "stream": True}
        async with http.post(f"{fake.openai_base}/responses", json=body) as resp:
            assert resp.headers["Content-Type"].startswith("text/event-stream")
            reads = [data async for data in resp.content.iter_any()]
    frames = [f for f in b"".join(reads).split(b"\n\n") if f]
    assert len(reads) == len(frames) == 10
    for frame in frames:
        event_line, data_line = frame.decode().split("\n")
        data = json.loads(data_line.removeprefix("data: "))
        assert event_line == f"event: {data['type']}"


async def test_transcription_streams_a_3mb_upload_and_counts_its_bytes(fake_upstream: FakeUpstream) -> None:
    audio = bytes(range(256)) * (3 * 1024 * 1024 // 256)  # above aiohttp's 1 MiB client_max_size
    async with client(fake_upstream) as sdk:
        transcription = await sdk.audio.transcriptions.create(
            model="whisper-1", file=("a.wav", audio, "audio/wav")
        )
    assert transcription.text == f"transcribed {len(audio)} bytes"
    (recorded,) = fake_upstream.requests
    assert recorded.path == "/v1/audio/transcriptions"
    assert recorded.headers["content-type"].startswith("multipart/form-data")
    assert recorded.headers["authorization"] == "Bearer sk-test"
    assert recorded.json["file_bytes"] == len(audio) == 3 * 1024 * 1024
    assert recorded.json["filename"] == "a.wav"
    assert recorded.model == "whisper-1"
    assert fake_upstream.count(model="whisper-1") == 1


async def test_upload_aborted_by_the_client_counts_as_cancelled(fake_upstream: FakeUpstream) -> None:
    port = int(fake_upstream.url.rsplit(":", 1)[1])
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    head = (
        "POST /v1/audio/transcriptions HTTP/1.1\r\nHost: x\r\nContent-Length: 1000000\r\n"
        "Content-Type: multipart/form-data; boundary=b0\r\n\r\n"
        '--b0\r\nContent-Disposition: form-data; name="model"\r\n\r\nwhisper-1\r\n'
        '--b0\r\nContent-Disposition: form-data; name="file"; filename="a.wav"\r\n\r\n'
    )
    writer.write(head.encode() + b"x" * 5000)
    await writer.drain()
    await until(lambda: fake_upstream.in_flight, "the upload in flight", step=0.01)
    writer.close()
    await writer.wait_closed()
    await until(lambda: not fake_upstream.in_flight, "the aborted upload finished", step=0.01)
    assert (fake_upstream.in_flight, fake_upstream.cancelled) == (0, 1)
    (recorded,) = fake_upstream.requests
    assert recorded.json["aborted"] is True  # with whatever had been read when the connection was lost
    assert recorded.json.get("file_bytes", 0) <= 5000
    assert await reader.read() == b""


async def test_transcription_consumes_faults_for_its_model(fake_upstream: FakeUpstream) -> None:
    fake_upstream.script("whisper-1", Fault.http(503))
    async with client(fake_upstream) as sdk:
        with pytest.raises(openai.InternalServerError):
            await sdk.audio.transcriptions.create(model="whisper-1", file=("b.mp3", b"x" * 10, "audio/mpeg"))
        text = await sdk.audio.transcriptions.create(
            model="whisper-1", file=("b.mp3", b"x" * 10, "audio/mpeg"), response_format="text"
        )
    assert text == "transcribed 10 bytes"


async def test_files_create_then_retrieve(fake_upstream: FakeUpstream) -> None:
    data = b'{"prompt": "p"}\n' * 100_000
    async with client(fake_upstream) as sdk:
        created = await sdk.files.create(file=("batch.jsonl", data, "application/jsonl"), purpose="batch")
        fetched = await sdk.files.retrieve(created.id)
        with pytest.raises(openai.NotFoundError) as caught:
            await sdk.files.retrieve("file-unknown")
    assert created.id.startswith("file-")
    assert (created.object, created.bytes, created.filename) == ("file", len(data), "batch.jsonl")
    assert (created.purpose, created.status) == ("batch", "processed")
    assert fetched == created
    assert fake_upstream.files[created.id]["bytes"] == len(data)
    assert caught.value.code == "not_found"
    upload = fake_upstream.requests[0]
    assert upload.json == {"purpose": "batch", "file_bytes": len(data), "filename": "batch.jsonl"}
    assert fake_upstream.requests[1].path == f"/v1/files/{created.id}"


async def test_every_openai_answer_has_rate_limit_headers_and_a_request_id(
    fake_upstream: FakeUpstream,
) -> None:
    fake_upstream.script("m", RATE_LIMITED)
    request_ids: list[str] = []
    async with client(fake_upstream) as sdk:
        with pytest.raises(openai.RateLimitError) as caught:
            await sdk.chat.completions.create(model="m", messages=MESSAGES)
        answers = [
            caught.value.response,
            (await sdk.chat.completions.with_raw_response.create(model="m", messages=MESSAGES)).http_response,
            (await sdk.embeddings.with_raw_response.create(model="m", input="x")).http_response,
            (await sdk.moderations.with_raw_response.create(input="x")).http_response,
            (await sdk.responses.with_raw_response.create(model="m", input="x")).http_response,
            (await sdk.models.with_raw_response.list()).http_response,
        ]
        stream = await sdk.chat.completions.with_raw_response.create(
            model="m", messages=MESSAGES, stream=True
        )
        answers.append(stream.http_response)
        await stream.parse().close()
    assert caught.value.response.headers["retry-after"] == "1"
    for answer in answers:
        for name, value in OPENAI_RATE_LIMIT_HEADERS.items():
            assert answer.headers[name] == value
        assert answer.headers["x-request-id"].startswith("req_")
        request_ids.append(answer.headers["x-request-id"])
    assert len(set(request_ids)) == len(request_ids)
    assert answers[1].headers["x-ratelimit-reset-requests"] == "120ms"


async def test_openai_headers_and_query_are_recorded(fake_upstream: FakeUpstream) -> None:
    async with client(
        fake_upstream,
        organization="org-1",
        project="proj-1",
        default_headers={"OpenAI-Beta": "assistants=v2"},
    ) as sdk:
        await sdk.embeddings.create(
            model="emb",
            input="x",
            extra_headers={"Idempotency-Key": "idem-1"},
            extra_query={"api-version": "2024-10-21"},
        )
    (recorded,) = fake_upstream.requests
    assert recorded.headers["openai-organization"] == "org-1"
    assert recorded.headers["openai-project"] == "proj-1"
    assert recorded.headers["openai-beta"] == "assistants=v2"
    assert recorded.headers["idempotency-key"] == "idem-1"
    assert recorded.query == "api-version=2024-10-21"


async def test_api_key_is_enforced_on_the_new_openai_routes() -> None:
    async with FakeUpstream.start(api_key="sk-upstream") as fake:
        fake.script("m", "kept for later")
        async with client(fake, api_key="sk-wrong") as sdk:
            with pytest.raises(openai.AuthenticationError):
                await sdk.embeddings.create(model="m", input="x")
            with pytest.raises(openai.AuthenticationError):
                await sdk.moderations.create(model="m", input="x")
            with pytest.raises(openai.AuthenticationError):
                await sdk.responses.create(model="m", input="x")
            with pytest.raises(openai.AuthenticationError):
                await sdk.audio.transcriptions.create(
                    model="m", file=("a.wav", b"0" * 2_000_000, "audio/wav")
                )
            with pytest.raises(openai.AuthenticationError):
                await sdk.files.create(file=("f.jsonl", b"{}", "application/jsonl"), purpose="batch")
        assert fake.next_reply("m") == "kept for later"
        assert fake.files == {}
        async with client(fake, api_key="sk-upstream") as sdk:
            assert (await sdk.responses.create(model="m", input="x")).output_text == DEFAULT_CONTENT


# -- stream faults (#11) ---------------------------------------------------------------------------

STREAM_PATHS = ["/v1/chat/completions", "/v1/messages", "/v1/responses"]


async def _stream_bytes(fake: FakeUpstream, path: str) -> bytes:
    async with aiohttp.ClientSession() as http:
        body = {"model": "m", "messages": MESSAGES, "input": "hi", "stream": True}
        async with http.post(fake.url + path, json=body, headers=ANTHROPIC_HEADERS) as resp:
            assert resp.status == 200
            return await resp.read()


@pytest.mark.parametrize("path", STREAM_PATHS)
async def test_truncate_ends_cleanly_after_n_frames_without_the_end_marker(
    fake_upstream: FakeUpstream, path: str
) -> None:
    fake_upstream.script("m", Fault.truncate(2), Fault.truncate(0))
    cut = await _stream_bytes(fake_upstream, path)
    assert cut.count(b"\n\n") == 2
    for end in (b"[DONE]", b'finish_reason": "stop', b"response.completed", b"message_stop"):
        assert end not in cut
    assert await _stream_bytes(fake_upstream, path) == b""


@pytest.mark.parametrize("path", STREAM_PATHS)
async def test_malformed_chunk_is_inserted_and_the_stream_goes_on(
    fake_upstream: FakeUpstream, path: str
) -> None:
    whole = await _stream_bytes(fake_upstream, path)
    fake_upstream.script("m", Fault.malformed_chunk(1))
    body = await _stream_bytes(fake_upstream, path)
    frames = body.split(b"\n\n")
    assert frames[1] + b"\n\n" == MALFORMED_FRAME
    assert body.count(b"\n\n") == whole.count(b"\n\n") + 1


async def test_stall_pauses_after_n_frames_then_sends_the_rest(fake_upstream: FakeUpstream) -> None:
    fake_upstream.script("m", Fault.stall(1, 0.3))
    async with aiohttp.ClientSession() as http:
        body = {"model": "m", "messages": MESSAGES, "stream": True}
        async with http.post(fake_upstream.openai_base + "/chat/completions", json=body) as resp:
            first = await resp.content.readuntil(b"\n\n")
            assert b"chat.completion.chunk" in first
            with pytest.raises(asyncio.TimeoutError):
                await asyncio.wait_for(resp.content.readuntil(b"\n\n"), 0.05)
            rest = await resp.read()
    assert rest.endswith(b"data: [DONE]\n\n")


@pytest.mark.parametrize("stream", [False, True])
async def test_drip_sends_the_answer_one_byte_at_a_time(fake_upstream: FakeUpstream, stream: bool) -> None:
    fake_upstream.script("m", Fault.drip(0.001))
    reads: list[bytes] = []
    async with aiohttp.ClientSession() as http:
        body = {"model": "m", "messages": MESSAGES, "stream": stream}
        async with http.post(fake_upstream.openai_base + "/chat/completions", json=body) as resp:
            assert resp.status == 200
            async for chunk in resp.content.iter_any():
                reads.append(chunk)
    whole = b"".join(reads)
    assert whole.endswith(b"data: [DONE]\n\n") if stream else json.loads(whole)["object"] == "chat.completion"
    assert len(reads) > 10  # arrived in many small pieces, not as one body
