"""OpenAI chat completions <-> Anthropic Messages translation, both ways, requests, answers and streams."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from proxy.upstream.anthropic_wire import (
    StreamError,
    StreamTranslator,
    from_messages_response,
    map_error,
    to_messages_request,
)
from proxy.upstream.sse import parse_sse

MODEL = "claude-sonnet-4-5"
USER_HI: dict[str, Any] = {"role": "user", "content": "hi"}


def translate(*messages: dict[str, Any], **fields: Any) -> dict[str, Any]:
    return to_messages_request({"model": "gpt-4o", "messages": list(messages), **fields}, MODEL)


# --------------------------------------------------------------------------- requests: messages


@pytest.mark.parametrize(
    ("messages", "system"),
    [
        ([{"role": "system", "content": "Be terse."}], "Be terse."),
        ([{"role": "developer", "content": "Be terse."}], "Be terse."),
        (
            [{"role": "system", "content": [{"type": "text", "text": "A"}, {"type": "text", "text": "B"}]}],
            "A\n\nB",
        ),
        ([{"role": "system", "content": "A"}, {"role": "developer", "content": "B"}], "A\n\nB"),
    ],
    ids=["system-string", "developer-string", "system-text-parts", "several-system-messages"],
)
def test_system_and_developer_messages_become_the_system_field(
    messages: list[dict[str, Any]], system: str
) -> None:
    out = translate(*messages, USER_HI)
    assert out["system"] == system
    assert out["messages"] == [{"role": "user", "content": "hi"}]


def test_system_messages_anywhere_in_the_conversation_are_extracted() -> None:
    out = translate(
        USER_HI,
        {"role": "system", "content": "late rule"},
        {"role": "assistant", "content": "hello"},
    )
    assert out["system"] == "late rule"
    assert [m["role"] for m in out["messages"]] == ["user", "assistant"]


def test_no_system_message_means_no_system_field() -> None:
    assert "system" not in translate(USER_HI)


def test_string_content_stays_a_string() -> None:
    out = translate(USER_HI, {"role": "assistant", "content": "hello"}, {"role": "user", "content": "bye"})
    assert out["messages"] == [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "hello"},
        {"role": "user", "content": "bye"},
    ]


@pytest.mark.parametrize(
    ("messages", "expected"),
    [
        (
            [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}],
            [{"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}],
        ),
        (
            [
                USER_HI,
                {"role": "assistant", "content": "x"},
                {"role": "assistant", "content": [{"type": "text", "text": "y"}]},
            ],
            [
                {"role": "user", "content": "hi"},
                {
                    "role": "assistant",
                    "content": [{"type": "text", "text": "x"}, {"type": "text", "text": "y"}],
                },
            ],
        ),
        (
            [
                {"role": "user", "content": "a"},
                {"role": "system", "content": "s"},
                {"role": "user", "content": "b"},
            ],
            [{"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}],
        ),
        (
            [
                {"role": "user", "content": "a"},
                {"role": "assistant", "content": None},
                {"role": "user", "content": "b"},
            ],
            [{"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}],
        ),
    ],
    ids=["two-users", "two-assistants", "users-around-a-system", "users-around-an-empty-assistant"],
)
def test_consecutive_same_role_messages_are_merged(
    messages: list[dict[str, Any]], expected: list[dict[str, Any]]
) -> None:
    assert translate(*messages)["messages"] == expected


@pytest.mark.parametrize(
    ("part", "block"),
    [
        ({"type": "text", "text": "look"}, {"type": "text", "text": "look"}),
        (
            {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}},
            {
                "type": "image",
                "source": {"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="},
            },
        ),
        (
            {"type": "image_url", "image_url": {"url": "data:image/jpeg;base64,/9j/4AAQ", "detail": "high"}},
            {"type": "image", "source": {"type": "base64", "media_type": "image/jpeg", "data": "/9j/4AAQ"}},
        ),
        (
            {"type": "image_url", "image_url": {"url": "https://example.com/cat.png"}},
            {"type": "image", "source": {"type": "url", "url": "https://example.com/cat.png"}},
        ),
        (
            {"type": "image_url", "image_url": {"url": "http://example.com/cat.png"}},
            {"type": "image", "source": {"type": "url", "url": "http://example.com/cat.png"}},
        ),
    ],
    ids=["text", "png-data-url", "jpeg-data-url-with-detail", "https-url", "http-url"],
)
def test_user_content_parts_become_anthropic_blocks(part: dict[str, Any], block: dict[str, Any]) -> None:
    out = translate({"role": "user", "content": [part]})
    assert out["messages"] == [{"role": "user", "content": [block]}]


@pytest.mark.parametrize(
    "part",
    [
        {"type": "image_url", "image_url": {"url": "ftp://example.com/cat.png"}},
        {"type": "image_url", "image_url": {"url": "data:image/png,notbase64"}},
        {"type": "input_audio", "input_audio": {"data": "xx", "format": "wav"}},
    ],
    ids=["ftp-url", "data-url-without-base64", "audio-part"],
)
def test_untranslatable_content_parts_are_rejected(part: dict[str, Any]) -> None:
    with pytest.raises(ValueError, match=r"messages\[0\]"):
        translate({"role": "user", "content": [part]})


@pytest.mark.parametrize(
    "messages",
    [[], [{"role": "system", "content": "only rules"}], [{"role": "user", "content": ""}]],
    ids=["no-messages", "system-only", "empty-user"],
)
def test_a_request_without_user_or_assistant_message_is_rejected(messages: list[dict[str, Any]]) -> None:
    with pytest.raises(ValueError, match="no user or assistant message"):
        translate(*messages)


@pytest.mark.parametrize(
    "body",
    [{}, {"messages": "hi"}, {"messages": [{"role": "function", "content": "x"}]}],
    ids=["missing-messages", "messages-not-a-list", "unsupported-role"],
)
def test_malformed_requests_raise_value_error(body: dict[str, Any]) -> None:
    with pytest.raises(ValueError):
        to_messages_request(body, MODEL)


# --------------------------------------------------------------------------- requests: tools

WEATHER_CALL: dict[str, Any] = {
    "id": "call_1",
    "type": "function",
    "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
}
TIME_CALL: dict[str, Any] = {
    "id": "call_2",
    "type": "function",
    "function": {"name": "get_time", "arguments": ""},
}


def test_assistant_tool_calls_become_tool_use_blocks_after_the_text() -> None:
    out = translate(
        USER_HI, {"role": "assistant", "content": "Checking.", "tool_calls": [WEATHER_CALL, TIME_CALL]}
    )
    assert out["messages"][1] == {
        "role": "assistant",
        "content": [
            {"type": "text", "text": "Checking."},
            {"type": "tool_use", "id": "call_1", "name": "get_weather", "input": {"city": "Paris"}},
            {"type": "tool_use", "id": "call_2", "name": "get_time", "input": {}},
        ],
    }


def test_tool_messages_become_one_user_message_of_tool_results() -> None:
    out = translate(
        USER_HI,
        {"role": "assistant", "content": None, "tool_calls": [WEATHER_CALL, TIME_CALL]},
        {"role": "tool", "tool_call_id": "call_1", "content": "18C"},
        {"role": "tool", "tool_call_id": "call_2", "content": [{"type": "text", "text": "noon"}]},
        {"role": "user", "content": "thanks"},
    )
    assert [m["role"] for m in out["messages"]] == ["user", "assistant", "user"]
    assert out["messages"][1]["content"][0]["type"] == "tool_use"
    assert out["messages"][2] == {
        "role": "user",
        "content": [
            {"type": "tool_result", "tool_use_id": "call_1", "content": "18C"},
            {"type": "tool_result", "tool_use_id": "call_2", "content": [{"type": "text", "text": "noon"}]},
            {"type": "text", "text": "thanks"},
        ],
    }


@pytest.mark.parametrize(
    ("message", "match"),
    [
        ({"role": "tool", "content": "18C"}, "tool_call_id"),
        (
            {
                "role": "assistant",
                "tool_calls": [{**WEATHER_CALL, "function": {"name": "f", "arguments": "{"}}],
            },
            "not valid JSON",
        ),
        (
            {
                "role": "assistant",
                "tool_calls": [{**WEATHER_CALL, "function": {"name": "f", "arguments": "[1]"}}],
            },
            "JSON object",
        ),
    ],
    ids=["tool-without-call-id", "arguments-not-json", "arguments-not-an-object"],
)
def test_malformed_tool_messages_are_rejected(message: dict[str, Any], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        translate(USER_HI, message)


def test_function_tools_become_anthropic_tools() -> None:
    params = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
    tools = [
        {
            "type": "function",
            "function": {"name": "get_weather", "description": "Weather", "parameters": params},
        },
        {"type": "function", "function": {"name": "get_time"}},
    ]
    assert translate(USER_HI, tools=tools)["tools"] == [
        {"name": "get_weather", "description": "Weather", "input_schema": params},
        {"name": "get_time", "input_schema": {"type": "object", "properties": {}}},
    ]


def test_non_function_tools_are_rejected() -> None:
    with pytest.raises(ValueError, match="function tools"):
        translate(USER_HI, tools=[{"type": "custom", "custom": {"name": "x"}}])


@pytest.mark.parametrize(
    ("choice", "expected"),
    [
        ("auto", {"type": "auto"}),
        ("required", {"type": "any"}),
        ("none", {"type": "none"}),
        ({"type": "function", "function": {"name": "get_weather"}}, {"type": "tool", "name": "get_weather"}),
    ],
    ids=["auto", "required", "none", "named-function"],
)
def test_tool_choice_is_mapped(choice: Any, expected: dict[str, Any]) -> None:
    assert translate(USER_HI, tool_choice=choice)["tool_choice"] == expected


@pytest.mark.parametrize(
    "choice", ["sometimes", {"type": "function"}, 3], ids=["unknown", "no-name", "number"]
)
def test_unknown_tool_choice_is_rejected(choice: Any) -> None:
    with pytest.raises(ValueError, match="tool_choice"):
        translate(USER_HI, tool_choice=choice)


def test_parallel_tool_calls_false_disables_parallel_tool_use() -> None:
    tools = [{"type": "function", "function": {"name": "f"}}]
    out = translate(USER_HI, tools=tools, parallel_tool_calls=False)
    assert out["tool_choice"] == {"type": "auto", "disable_parallel_tool_use": True}


# --------------------------------------------------------------------------- requests: parameters


@pytest.mark.parametrize(
    ("fields", "max_tokens"),
    [
        ({"max_tokens": 100}, 100),
        ({"max_completion_tokens": 200}, 200),
        ({"max_tokens": None}, 4096),
        ({}, 4096),
    ],
    ids=["max_tokens", "max_completion_tokens", "null", "absent-uses-default"],
)
def test_max_tokens_comes_from_either_field_or_the_default(fields: dict[str, Any], max_tokens: int) -> None:
    assert translate(USER_HI, **fields)["max_tokens"] == max_tokens


def test_default_max_tokens_is_configurable() -> None:
    body = {"messages": [USER_HI]}
    assert to_messages_request(body, MODEL, default_max_tokens=512)["max_tokens"] == 512


@pytest.mark.parametrize(
    ("stop", "expected"),
    [("END", ["END"]), (["a", "b"], ["a", "b"])],
    ids=["string", "list"],
)
def test_stop_becomes_a_stop_sequences_list(stop: Any, expected: list[str]) -> None:
    assert translate(USER_HI, stop=stop)["stop_sequences"] == expected


@pytest.mark.parametrize(
    ("fields", "expected"),
    [
        ({"temperature": 0.2}, {"temperature": 0.2}),
        ({"top_p": 0.9}, {"top_p": 0.9}),
        ({"stream": True}, {"stream": True}),
        ({"user": "u-42"}, {"metadata": {"user_id": "u-42"}}),
    ],
    ids=["temperature", "top_p", "stream", "user-to-metadata"],
)
def test_sampling_stream_and_user_fields_are_forwarded(
    fields: dict[str, Any], expected: dict[str, Any]
) -> None:
    out = translate(USER_HI, **fields)
    assert {k: out[k] for k in expected} == expected


def test_model_is_the_given_upstream_model() -> None:
    assert translate(USER_HI)["model"] == MODEL


@pytest.mark.parametrize(
    "field",
    [
        ("response_format", {"type": "json_object"}),
        ("n", 2),
        ("logprobs", True),
        ("top_logprobs", 3),
        ("seed", 7),
        ("stream_options", {"include_usage": True}),
        ("presence_penalty", 0.5),
        ("frequency_penalty", 0.5),
        ("logit_bias", {"50256": -100}),
    ],
    ids=lambda f: f[0],
)
def test_openai_only_fields_are_dropped(field: tuple[str, Any]) -> None:
    name, value = field
    out = translate(USER_HI, **{name: value})
    assert set(out) == {"model", "messages", "max_tokens"}


def test_the_input_body_is_not_modified() -> None:
    body: dict[str, Any] = {
        "messages": [USER_HI, {"role": "user", "content": "again"}],
        "tools": [{"type": "function", "function": {"name": "f"}}],
        "stop": ["x"],
    }
    snapshot = orjson.dumps(body)
    to_messages_request(body, MODEL)
    assert orjson.dumps(body) == snapshot


# --------------------------------------------------------------------------- responses


def anthropic_message(
    content: list[dict[str, Any]], stop_reason: str = "end_turn", usage: dict[str, Any] | None = None
) -> dict[str, Any]:
    return {
        "id": "msg_013Zva2CMHLNnXjNJJKqJ2EF",
        "type": "message",
        "role": "assistant",
        "model": "claude-sonnet-4-5-20250929",
        "content": content,
        "stop_reason": stop_reason,
        "stop_sequence": None,
        "usage": usage or {"input_tokens": 10, "output_tokens": 5},
    }


def test_a_text_message_becomes_a_chat_completion() -> None:
    out = from_messages_response(
        anthropic_message([{"type": "text", "text": "Hello"}, {"type": "text", "text": " world"}]), "my-model"
    )
    assert out["id"] == "chatcmpl-msg_013Zva2CMHLNnXjNJJKqJ2EF"
    assert out["object"] == "chat.completion"
    assert isinstance(out["created"], int)
    assert out["model"] == "my-model"
    assert out["choices"] == [
        {
            "index": 0,
            "message": {"role": "assistant", "content": "Hello world"},
            "finish_reason": "stop",
            "logprobs": None,
        }
    ]


def test_tool_use_blocks_become_tool_calls_with_json_string_arguments() -> None:
    content: list[dict[str, Any]] = [
        {"type": "text", "text": "Let me check."},
        {"type": "tool_use", "id": "toolu_01", "name": "get_weather", "input": {"city": "Paris"}},
        {"type": "tool_use", "id": "toolu_02", "name": "get_time", "input": {}},
    ]
    message = from_messages_response(anthropic_message(content, "tool_use"), MODEL)["choices"][0]["message"]
    assert message["content"] == "Let me check."
    assert message["tool_calls"] == [
        {
            "id": "toolu_01",
            "type": "function",
            "function": {"name": "get_weather", "arguments": '{"city":"Paris"}'},
        },
        {"id": "toolu_02", "type": "function", "function": {"name": "get_time", "arguments": "{}"}},
    ]
    assert orjson.loads(message["tool_calls"][0]["function"]["arguments"]) == {"city": "Paris"}


def test_a_message_with_only_tool_use_has_null_content() -> None:
    content = [{"type": "tool_use", "id": "toolu_01", "name": "f", "input": {}}]
    message = from_messages_response(anthropic_message(content, "tool_use"), MODEL)["choices"][0]["message"]
    assert message["content"] is None


def test_thinking_blocks_are_not_part_of_the_content() -> None:
    content = [{"type": "thinking", "thinking": "hmm", "signature": "sig"}, {"type": "text", "text": "42"}]
    assert (
        from_messages_response(anthropic_message(content), MODEL)["choices"][0]["message"]["content"] == "42"
    )


@pytest.mark.parametrize(
    ("stop_reason", "finish_reason"),
    [
        ("end_turn", "stop"),
        ("stop_sequence", "stop"),
        ("max_tokens", "length"),
        ("tool_use", "tool_calls"),
        ("pause_turn", "stop"),
        ("refusal", "content_filter"),
        ("something_new", "stop"),
    ],
)
def test_stop_reason_maps_to_finish_reason(stop_reason: str, finish_reason: str) -> None:
    out = from_messages_response(anthropic_message([{"type": "text", "text": "x"}], stop_reason), MODEL)
    assert out["choices"][0]["finish_reason"] == finish_reason


@pytest.mark.parametrize(
    ("usage", "expected"),
    [
        (
            {"input_tokens": 10, "output_tokens": 5},
            {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15},
        ),
        (
            {
                "input_tokens": 10,
                "cache_read_input_tokens": 100,
                "cache_creation_input_tokens": 20,
                "output_tokens": 5,
            },
            {"prompt_tokens": 130, "completion_tokens": 5, "total_tokens": 135},
        ),
        (
            {"input_tokens": 10, "cache_read_input_tokens": None, "output_tokens": 0},
            {"prompt_tokens": 10, "completion_tokens": 0, "total_tokens": 10},
        ),
    ],
    ids=["plain", "with-cache", "null-cache-field"],
)
def test_usage_counts_cached_input_as_prompt_tokens(usage: dict[str, Any], expected: dict[str, int]) -> None:
    out = from_messages_response(anthropic_message([{"type": "text", "text": "x"}], usage=usage), MODEL)
    assert out["usage"] == expected


# --------------------------------------------------------------------------- streams

TEXT = "Hello! Voilà — 日本語 works 🎉."
TEXT_PIECES = ["Hello", "! Voilà", " — 日本語", " works 🎉", "."]


def sse(event: str, data: dict[str, Any]) -> bytes:
    return b"event: " + event.encode() + b"\ndata: " + orjson.dumps(data) + b"\n\n"


def text_stream() -> bytes:
    """The shape of Anthropic's documented streaming example for a text answer."""
    events = [
        sse(
            "message_start",
            {
                "type": "message_start",
                "message": {
                    "id": "msg_1nZdL29xx5MUA1yADyHTEsnR8uuvGzszyY",
                    "type": "message",
                    "role": "assistant",
                    "content": [],
                    "model": "claude-sonnet-4-5-20250929",
                    "stop_reason": None,
                    "stop_sequence": None,
                    "usage": {
                        "input_tokens": 25,
                        "cache_creation_input_tokens": 0,
                        "cache_read_input_tokens": 5,
                        "output_tokens": 1,
                    },
                },
            },
        ),
        sse(
            "content_block_start",
            {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}},
        ),
        sse("ping", {"type": "ping"}),
        *(
            sse(
                "content_block_delta",
                {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": piece}},
            )
            for piece in TEXT_PIECES
        ),
        sse("content_block_stop", {"type": "content_block_stop", "index": 0}),
        sse(
            "message_delta",
            {
                "type": "message_delta",
                "delta": {"stop_reason": "end_turn", "stop_sequence": None},
                "usage": {"output_tokens": 15},
            },
        ),
        sse("message_stop", {"type": "message_stop"}),
    ]
    return b"".join(events)


def tool_stream() -> bytes:
    """The shape of Anthropic's documented streaming example for a tool call."""
    fragments = ["", '{"location":', ' "San Fra', 'ncisco, CA"}']
    return b"".join(
        [
            sse(
                "message_start",
                {
                    "type": "message_start",
                    "message": {
                        "id": "msg_014p7gG3wDgGV9EUtLvnow3U",
                        "type": "message",
                        "role": "assistant",
                        "model": "claude-sonnet-4-5-20250929",
                        "stop_sequence": None,
                        "usage": {"input_tokens": 472, "output_tokens": 2},
                        "content": [],
                        "stop_reason": None,
                    },
                },
            ),
            sse(
                "content_block_start",
                {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}},
            ),
            sse(
                "content_block_delta",
                {
                    "type": "content_block_delta",
                    "index": 0,
                    "delta": {"type": "text_delta", "text": "Checking."},
                },
            ),
            sse("content_block_stop", {"type": "content_block_stop", "index": 0}),
            sse(
                "content_block_start",
                {
                    "type": "content_block_start",
                    "index": 1,
                    "content_block": {
                        "type": "tool_use",
                        "id": "toolu_01T1x1fJ34qAmk2tNTrN7Up6",
                        "name": "get_weather",
                        "input": {},
                    },
                },
            ),
            *(
                sse(
                    "content_block_delta",
                    {
                        "type": "content_block_delta",
                        "index": 1,
                        "delta": {"type": "input_json_delta", "partial_json": f},
                    },
                )
                for f in fragments
            ),
            sse("content_block_stop", {"type": "content_block_stop", "index": 1}),
            sse(
                "message_delta",
                {
                    "type": "message_delta",
                    "delta": {"stop_reason": "tool_use", "stop_sequence": None},
                    "usage": {"output_tokens": 89},
                },
            ),
            sse("message_stop", {"type": "message_stop"}),
        ]
    )


def run_stream(raw: bytes, step: int, *, include_usage: bool) -> list[dict[str, Any]]:
    """Feed ``raw`` through parse_sse ``step`` bytes at a time and translate every event."""
    translator = StreamTranslator("my-model", include_usage=include_usage)
    chunks: list[dict[str, Any]] = []
    buffer = b""
    for start in range(0, len(raw), step):
        events, buffer = parse_sse(buffer + raw[start : start + step])
        for event, data in events:
            chunks.extend(translator.feed(event, orjson.loads(data)))
    assert buffer == b""
    return chunks


def content_of(chunks: list[dict[str, Any]]) -> str:
    return "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])


@pytest.mark.parametrize("step", [1, 7, 13, 64, 1 << 20], ids=lambda s: f"{s}-byte-reads")
def test_a_text_stream_in_any_byte_split_yields_the_text_and_stop(step: int) -> None:
    chunks = run_stream(text_stream(), step, include_usage=False)
    assert content_of(chunks) == TEXT
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert [c["choices"][0]["finish_reason"] for c in chunks if c["choices"][0]["finish_reason"]] == ["stop"]
    assert chunks[-1]["choices"][0] == {"index": 0, "delta": {}, "finish_reason": "stop", "logprobs": None}
    assert all("usage" not in c for c in chunks)


@pytest.mark.parametrize("step", [1, 7, 1 << 20], ids=lambda s: f"{s}-byte-reads")
def test_include_usage_adds_a_final_usage_chunk_without_choices(step: int) -> None:
    chunks = run_stream(text_stream(), step, include_usage=True)
    assert content_of(chunks) == TEXT
    *body, last = chunks
    assert last["choices"] == []
    assert last["usage"] == {"prompt_tokens": 30, "completion_tokens": 15, "total_tokens": 45}
    assert all(c["usage"] is None for c in body)
    assert body[-1]["choices"][0]["finish_reason"] == "stop"


@pytest.mark.parametrize("include_usage", [False, True])
def test_all_chunks_share_id_created_object_and_model(include_usage: bool) -> None:
    chunks = run_stream(text_stream(), 7, include_usage=include_usage)
    assert {c["id"] for c in chunks} == {"chatcmpl-msg_1nZdL29xx5MUA1yADyHTEsnR8uuvGzszyY"}
    assert len({c["created"] for c in chunks}) == 1
    assert isinstance(chunks[0]["created"], int)
    assert {c["object"] for c in chunks} == {"chat.completion.chunk"}
    assert {c["model"] for c in chunks} == {"my-model"}


def test_a_tool_use_stream_yields_tool_call_deltas_and_tool_calls_finish() -> None:
    chunks = run_stream(tool_stream(), 7, include_usage=True)
    assert content_of(chunks) == "Checking."
    calls = [call for c in chunks if c["choices"] for call in c["choices"][0]["delta"].get("tool_calls", [])]
    assert calls[0] == {
        "index": 0,
        "id": "toolu_01T1x1fJ34qAmk2tNTrN7Up6",
        "type": "function",
        "function": {"name": "get_weather", "arguments": ""},
    }
    assert all(call["index"] == 0 and set(call) == {"index", "function"} for call in calls[1:])
    arguments = "".join(call["function"]["arguments"] for call in calls)
    assert orjson.loads(arguments) == {"location": "San Francisco, CA"}
    assert chunks[-2]["choices"][0]["finish_reason"] == "tool_calls"
    assert chunks[-1]["usage"] == {"prompt_tokens": 472, "completion_tokens": 89, "total_tokens": 561}


def test_several_tool_use_blocks_get_consecutive_tool_call_indexes() -> None:
    translator = StreamTranslator(MODEL)
    translator.feed("message_start", {"type": "message_start", "message": {"id": "msg_1", "usage": {}}})
    indexes = []
    for block_index, name in [(0, "a"), (1, "b")]:
        start = {"type": "tool_use", "id": f"toolu_{name}", "name": name, "input": {}}
        (chunk,) = translator.feed(
            "content_block_start",
            {"type": "content_block_start", "index": block_index, "content_block": start},
        )
        (delta,) = translator.feed(
            "content_block_delta",
            {
                "type": "content_block_delta",
                "index": block_index,
                "delta": {"type": "input_json_delta", "partial_json": "{}"},
            },
        )
        indexes.append(
            (
                chunk["choices"][0]["delta"]["tool_calls"][0]["index"],
                delta["choices"][0]["delta"]["tool_calls"][0]["index"],
            )
        )
    assert indexes == [(0, 0), (1, 1)]


@pytest.mark.parametrize(
    ("event", "data"),
    [
        ("ping", {"type": "ping"}),
        ("content_block_stop", {"type": "content_block_stop", "index": 0}),
        (
            "content_block_start",
            {
                "type": "content_block_start",
                "index": 0,
                "content_block": {"type": "thinking", "thinking": ""},
            },
        ),
        (
            "content_block_delta",
            {
                "type": "content_block_delta",
                "index": 0,
                "delta": {"type": "thinking_delta", "thinking": "hm"},
            },
        ),
        (
            "content_block_delta",
            {
                "type": "content_block_delta",
                "index": 0,
                "delta": {"type": "signature_delta", "signature": "s"},
            },
        ),
        ("message_stop", {"type": "message_stop"}),
        ("some_future_event", {"type": "some_future_event"}),
    ],
    ids=[
        "ping",
        "block-stop",
        "thinking-start",
        "thinking-delta",
        "signature-delta",
        "stop-without-usage",
        "unknown",
    ],
)
def test_events_without_an_openai_counterpart_yield_no_chunk(event: str, data: dict[str, Any]) -> None:
    assert StreamTranslator(MODEL).feed(event, data) == []


@pytest.mark.parametrize(
    ("stop_reason", "finish_reason"),
    [
        ("end_turn", "stop"),
        ("stop_sequence", "stop"),
        ("max_tokens", "length"),
        ("tool_use", "tool_calls"),
        ("refusal", "content_filter"),
    ],
)
def test_message_delta_yields_the_mapped_finish_reason(stop_reason: str, finish_reason: str) -> None:
    (chunk,) = StreamTranslator(MODEL).feed(
        "message_delta",
        {"type": "message_delta", "delta": {"stop_reason": stop_reason}, "usage": {"output_tokens": 3}},
    )
    assert chunk["choices"][0]["delta"] == {}
    assert chunk["choices"][0]["finish_reason"] == finish_reason


def test_an_error_event_raises_stream_error_with_its_message() -> None:
    translator = StreamTranslator(MODEL)
    with pytest.raises(StreamError, match="Overloaded") as info:
        translator.feed(
            "error", {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}
        )
    assert info.value.message == "Overloaded"
    assert info.value.error_type == "server_error"


# --------------------------------------------------------------------------- errors


def error_body(kind: str, message: str) -> bytes:
    return orjson.dumps({"type": "error", "error": {"type": kind, "message": message}})


@pytest.mark.parametrize(
    ("status", "body", "expected"),
    [
        (
            401,
            error_body("authentication_error", "invalid x-api-key"),
            ("authentication_error", "invalid x-api-key"),
        ),
        (403, error_body("permission_error", "no access"), ("permission_error", "no access")),
        (404, error_body("not_found_error", "no model"), ("not_found_error", "no model")),
        (400, error_body("invalid_request_error", "bad field"), ("invalid_request_error", "bad field")),
        (413, error_body("request_too_large", "too big"), ("invalid_request_error", "too big")),
        (429, error_body("rate_limit_error", "slow down"), ("rate_limit_error", "slow down")),
        (500, error_body("api_error", "oops"), ("api_error", "oops")),
        (529, error_body("overloaded_error", "Overloaded"), ("server_error", "Overloaded")),
        (418, error_body("teapot_error", "short and stout"), ("api_error", "short and stout")),
    ],
    ids=lambda v: v if isinstance(v, int) else None,
)
def test_anthropic_error_types_map_to_openai_error_types(
    status: int, body: bytes, expected: tuple[str, str]
) -> None:
    assert map_error(status, body) == expected


@pytest.mark.parametrize(
    "body",
    [b"<html>Bad Gateway</html>", b"", b'{"detail": "nope"}', b"[1, 2]", b"\xff\xfe"],
    ids=["html", "empty", "other-json", "json-array", "not-utf8"],
)
def test_unparseable_errors_are_api_errors_naming_the_status(body: bytes) -> None:
    kind, message = map_error(502, body)
    assert kind == "api_error"
    assert "502" in message


def test_an_error_without_message_names_its_type_and_status() -> None:
    kind, message = map_error(429, b'{"type": "error", "error": {"type": "rate_limit_error"}}')
    assert kind == "rate_limit_error"
    assert "rate_limit_error" in message
    assert "429" in message


def test_pdf_file_parts_become_document_blocks() -> None:
    body = {
        "messages": [
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "Summarise"},
                    {
                        "type": "file",
                        "file": {
                            "filename": "input-0.pdf",
                            "file_data": "data:application/pdf;base64,JVBERi0=",
                        },
                    },
                ],
            }
        ]
    }
    (message,) = to_messages_request(body, "claude-x")["messages"]
    assert message["content"][1] == {
        "type": "document",
        "source": {"type": "base64", "media_type": "application/pdf", "data": "JVBERi0="},
        "title": "input-0.pdf",
    }


@pytest.mark.parametrize(
    "part",
    [
        {"type": "file", "file": {"file_data": "data:video/mp4;base64,AAAA"}},
        {"type": "file", "file": {"file_id": "file-abc"}},
        {"type": "input_audio", "input_audio": {"data": "AAAA", "format": "wav"}},
    ],
)
def test_parts_anthropic_cannot_take_are_refused(part: dict[str, Any]) -> None:
    with pytest.raises(ValueError):
        to_messages_request({"messages": [{"role": "user", "content": [part]}]}, "claude-x")
