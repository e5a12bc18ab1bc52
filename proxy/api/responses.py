"""``POST /v1/responses``: modules over the Responses API; everything else passes through."""

from __future__ import annotations

from typing import Any

from aiohttp import web

from proxy.api import calls
from proxy.api.app_keys import runtime_of
from proxy.api.body import read_json
from proxy.api.chat import MODULE_PREFIX, module_history, module_input
from proxy.api.envelopes import answer_headers, answer_response, answer_status
from proxy.api.errors import json_response
from proxy.api.limits import count_request
from proxy.api.modules import module_not_found
from proxy.api.passthrough import forward
from proxy.api.stream_response import HeldHeadResponse
from proxy.api.streaming import stream_module_response
from proxy.jsonshape import as_dict, as_list
from proxy.wire import envelope_text, response_events, response_object, sse_event


def chat_messages(body: dict[str, Any]) -> dict[str, Any]:
    """The Responses ``input`` (a string or a list of input items) as chat-style messages."""
    value = body.get("input")
    if isinstance(value, str):
        return {"messages": [{"role": "user", "content": value}]}
    messages = []
    for item in as_list(value):
        entry = as_dict(item)
        if entry.get("type") == "reasoning":
            continue  # a streamed answer's live view, handed back with the output: not a message
        content = entry.get("content")
        if isinstance(content, list):
            content = [
                {"type": "text", "text": as_dict(p).get("text", "")}
                for p in content
                if as_dict(p).get("type") in ("input_text", "text", "output_text")
            ]
        messages.append({"role": entry.get("role", "user"), "content": content})
    return {"messages": messages}


async def create_response(request: web.Request) -> web.StreamResponse:
    """A module named by ``model: "module:<name>"`` (or ``X-Cognitive-Module``) runs like it does
    over chat completions and answers a Responses object whose output text is the envelope."""
    raw, body = await read_json(request)
    model = body.get("model") if isinstance(body, dict) else None
    name = request.headers.get("X-Cognitive-Module", "").strip() or (
        model[len(MODULE_PREFIX) :] if isinstance(model, str) and model.startswith(MODULE_PREFIX) else ""
    )
    if not name:
        await count_request(request)
        return await forward(request, body=raw)
    runtime = runtime_of(request)
    module = runtime.registry.get(name)
    if module is None:
        return module_not_found(name, runtime, request)
    messages = chat_messages(body)
    value, check = module_input(messages)
    history = module_history(messages)
    if body.get("stream") is True and module.response_mode != "sync":
        return await stream_module_response(request, runtime, module, value, check, history)
    answer = await calls.answer(request, runtime, module, value, check_input=check, history=history)
    if answer_status(answer) != 200:
        return answer_response(answer)
    final = response_object(f"{MODULE_PREFIX}{name}", envelope_text(answer.envelope), answer.usage)
    final["cognitive"] = answer.cognitive()
    headers = answer_headers(answer)
    if body.get("stream") is not True:
        return json_response(final, headers=headers)
    response = HeldHeadResponse(
        headers={**headers, "Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
    )
    await response.prepare(request)
    for event in response_events(final):
        await response.write(sse_event(event))
    await response.write_eof()
    return response
