"""The drop-in invariant of a streamed module answer (issue #27 finding 1): the content pieces
concatenate to the envelope the sync call returns, byte for byte but for the per-call fields;
the live view (the rationale as it is written, escalations) rides in the reasoning channel."""

from __future__ import annotations

import json
import re

from openai.types.chat import ChatCompletionMessageParam

from tests.api.test_modules import REVIEW_INPUT, envelope
from tests.fake_upstream import STREAM_BREAK, FakeUpstream
from tests.proxy_server import RunningProxy, cognitive_of

PER_CALL = re.compile(r'"(trace_id)":"[^"]*"|"(latency_ms)":[0-9.eE+-]+')


def per_call_free(text: str) -> str:
    """``text`` with the values of the per-call fields (``trace_id``, ``latency_ms``) blanked."""
    return PER_CALL.sub(lambda m: f'"{m.group(1) or m.group(2)}":_', text)


def answer(confidence: float, rationale: str) -> str:
    return envelope(confidence, rationale=rationale)


MESSAGES: list[ChatCompletionMessageParam] = [{"role": "user", "content": json.dumps(REVIEW_INPUT)}]


def script_escalation(upstream: FakeUpstream) -> None:
    upstream.script("cheap", answer(0.3, "A weak first guess at the answer."))
    upstream.script("strong", answer(0.95, "The strong rung's careful answer."))


async def sync_content(proxy: RunningProxy) -> str:
    reply = await proxy.client().chat.completions.create(model="module:code-reviewer", messages=MESSAGES)
    return reply.choices[0].message.content or ""


async def test_chat_stream_content_concatenates_to_the_sync_envelope_after_an_escalation(
    proxy: RunningProxy, fake_upstream: FakeUpstream
) -> None:
    script_escalation(fake_upstream)
    expected = await sync_content(proxy)
    script_escalation(fake_upstream)
    stream = await proxy.client().chat.completions.create(
        model="module:code-reviewer",
        messages=MESSAGES,
        stream=True,
    )
    content, reasoning, finishes, resets = "", "", [], 0
    async for chunk in stream:
        if not chunk.choices:
            continue
        delta = chunk.choices[0].delta
        content += delta.content or ""
        reasoning += (delta.model_extra or {}).get("reasoning_content") or ""
        finishes.append(chunk.choices[0].finish_reason)
        inner = (chunk.model_extra or {}).get("cognitive_chunk", {}).get("chunk", {})
        resets += inner.get("type") == "snapshot"
    assert per_call_free(content) == per_call_free(expected)
    assert json.loads(content)["data"]["rationale"] == "The strong rung's careful answer."
    # the live view: both rungs' rationale and the escalation, in the reasoning channel
    first, second = reasoning.index("A weak first guess"), reasoning.index("The strong rung's careful")
    assert first < reasoning.index("escalating to strong") < second
    assert resets == 1 and [f for f in finishes if f] == ["stop"]


async def test_chat_stream_after_a_broken_provider_stream_still_concatenates(
    proxy: RunningProxy, fake_upstream: FakeUpstream
) -> None:
    fake_upstream.set_default_reply("cheap", answer(0.92, "Fine as it is."))
    expected = await sync_content(proxy)
    fake_upstream.script("cheap", STREAM_BREAK)
    stream = await proxy.client().chat.completions.create(
        model="module:code-reviewer",
        messages=MESSAGES,
        stream=True,
    )
    content = "".join([c.choices[0].delta.content or "" async for c in stream if c.choices])
    assert per_call_free(content) == per_call_free(expected)


async def test_chat_stream_of_a_contract_failure_concatenates_to_the_failure_envelope(
    proxy: RunningProxy, fake_upstream: FakeUpstream
) -> None:
    """A 200 ``ok: false`` answer is content over sync, so it is content over a stream too."""
    for _ in range(2):
        fake_upstream.script("cheap", "not json")
        fake_upstream.script("strong", "still not json")
    expected = await sync_content(proxy)
    stream = await proxy.client().chat.completions.create(
        model="module:code-reviewer",
        messages=MESSAGES,
        stream=True,
    )
    content = "".join([c.choices[0].delta.content or "" async for c in stream if c.choices])
    assert json.loads(content)["ok"] is False
    assert per_call_free(content) == per_call_free(expected)


async def test_responses_stream_text_concatenates_to_the_completed_envelope(
    proxy: RunningProxy, fake_upstream: FakeUpstream
) -> None:
    script_escalation(fake_upstream)
    sync = await proxy.client().responses.create(model="module:code-reviewer", input=json.dumps(REVIEW_INPUT))
    script_escalation(fake_upstream)
    stream = await proxy.client().responses.create(
        model="module:code-reviewer", input=json.dumps(REVIEW_INPUT), stream=True
    )
    text, summary, completed = "", "", None
    kinds: list[str] = []
    async for event in stream:
        kinds.append(event.type)
        if event.type == "response.output_text.delta":
            text += event.delta
        if event.type == "response.reasoning_summary_text.delta":
            summary += event.delta
        if event.type == "response.completed":
            completed = event.response
    assert completed is not None
    assert text == completed.output_text
    assert per_call_free(text) == per_call_free(sync.output_text)
    assert "A weak first guess" in summary and "escalating to strong" in summary
    assert kinds.index("response.reasoning_summary_text.delta") < kinds.index("response.output_text.delta")
    assert cognitive_of(completed)["decision"] == "escalated"
    reasoning = [item for item in completed.output if item.type == "reasoning"]
    assert len(reasoning) == 1 and len(reasoning[0].summary) == 2  # one summary part per rung
