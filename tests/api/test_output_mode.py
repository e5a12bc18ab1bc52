"""A module call with ``tools``/``tool_choice``/``response_format`` (issue #27 finding 2): what
instructor's TOOLS, JSON and JSON_SCHEMA modes and pydantic-ai's tool output send, on the wire.
A forced function gets the envelope as its call's arguments, streamed or not; other forced
combinations are a 400 that names the supported modes."""

from __future__ import annotations

import json
from typing import Any

import openai
import pytest
from openai.types.chat import ChatCompletionMessageParam

from tests.api.test_modules import REVIEW_INPUT, envelope
from tests.api.test_stream_contract import per_call_free
from tests.fake_upstream import FakeUpstream
from tests.proxy_server import RunningProxy

MESSAGES: list[ChatCompletionMessageParam] = [{"role": "user", "content": json.dumps(REVIEW_INPUT)}]
REVIEW_TOOL: Any = {
    "type": "function",
    "function": {"name": "Review", "description": "The review", "parameters": {"type": "object"}},
}
OTHER_TOOL: Any = {"type": "function", "function": {"name": "lookup", "parameters": {"type": "object"}}}
FORCED: Any = {"type": "function", "function": {"name": "Review"}}


async def plain_content(proxy: RunningProxy) -> str:
    reply = await proxy.client().chat.completions.create(model="module:code-reviewer", messages=MESSAGES)
    return reply.choices[0].message.content or ""


@pytest.mark.parametrize(
    ("tools", "choice"),
    [([REVIEW_TOOL], FORCED), ([REVIEW_TOOL], "required"), ([OTHER_TOOL, REVIEW_TOOL], FORCED)],
    ids=["instructor-tools", "required-one", "forced-among-two"],
)
async def test_a_forced_function_gets_the_envelope_as_its_arguments(
    proxy: RunningProxy, fake_upstream: FakeUpstream, tools: Any, choice: Any
) -> None:
    fake_upstream.set_default_reply("cheap", envelope(0.9))
    expected = await plain_content(proxy)
    reply = await proxy.client().chat.completions.create(
        model="module:code-reviewer", messages=MESSAGES, tools=tools, tool_choice=choice
    )
    message = reply.choices[0].message
    assert reply.choices[0].finish_reason == "tool_calls" and message.content is None
    assert message.tool_calls is not None and len(message.tool_calls) == 1
    call: Any = message.tool_calls[0]
    assert call.function.name == "Review"
    assert per_call_free(call.function.arguments) == per_call_free(expected)
    sent = fake_upstream.requests[-1].json
    assert "Review" not in json.dumps(sent.get("tools", []))  # the answer's shape, not a tool


async def test_a_forced_function_streams_its_arguments_after_the_decision(
    proxy: RunningProxy, fake_upstream: FakeUpstream
) -> None:
    fake_upstream.set_default_reply("cheap", envelope(0.9))
    expected = await plain_content(proxy)
    stream = await proxy.client().chat.completions.create(
        model="module:code-reviewer", messages=MESSAGES, tools=[REVIEW_TOOL], tool_choice=FORCED, stream=True
    )
    arguments, names, finishes, reasoning = "", set(), [], ""
    async for chunk in stream:
        if not chunk.choices:
            continue
        delta = chunk.choices[0].delta
        reasoning += (delta.model_extra or {}).get("reasoning_content") or ""
        for call in delta.tool_calls or ():
            arguments += call.function.arguments or "" if call.function else ""
            names.add(call.function.name if call.function else None)
        finishes.append(chunk.choices[0].finish_reason)
    assert per_call_free(arguments) == per_call_free(expected)
    assert names == {"Review"} and [f for f in finishes if f] == ["tool_calls"]
    assert reasoning == "Because."  # the live view is unchanged


@pytest.mark.parametrize(
    "fmt",
    [
        {"type": "json_object"},
        {"type": "json_schema", "json_schema": {"name": "Review", "schema": {"type": "object"}}},
        {"type": "text"},
    ],
    ids=["instructor-json", "instructor-json-schema", "text"],
)
async def test_a_response_format_gets_the_envelope_as_content(
    proxy: RunningProxy, fake_upstream: FakeUpstream, fmt: Any
) -> None:
    fake_upstream.set_default_reply("cheap", envelope(0.9))
    reply = await proxy.client().chat.completions.create(
        model="module:code-reviewer", messages=MESSAGES, response_format=fmt
    )
    assert json.loads(reply.choices[0].message.content or "")["ok"] is True
    assert fake_upstream.requests[-1].json.get("response_format") != fmt  # the module's own, if any


@pytest.mark.parametrize(
    ("extra", "param"),
    [
        ({"tools": [REVIEW_TOOL, OTHER_TOOL], "tool_choice": "required"}, "tool_choice"),
        ({"tools": [], "tool_choice": "required"}, "tool_choice"),
        ({"tools": [OTHER_TOOL], "tool_choice": FORCED}, "tool_choice"),
        (
            {"tool_choice": {"type": "allowed_tools", "allowed_tools": {"mode": "auto", "tools": []}}},
            "tool_choice",
        ),
        ({"tool_choice": 3}, "tool_choice"),
        ({"response_format": {"type": "xml"}}, "response_format"),
        ({"response_format": "json"}, "response_format"),
    ],
)
async def test_other_output_modes_are_a_400_naming_the_supported_ones(
    proxy: RunningProxy, fake_upstream: FakeUpstream, extra: dict[str, Any], param: str
) -> None:
    with pytest.raises(openai.BadRequestError) as info:
        await proxy.client().chat.completions.create(
            model="module:code-reviewer", messages=MESSAGES, extra_body=extra
        )
    body: Any = info.value.body
    assert body["code"] == "unsupported_output_mode" and body["param"] == param
    assert "forced function" in body["message"]
    assert not fake_upstream.requests  # refused before any model call
