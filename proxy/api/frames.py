"""Stream chunks -> bytes, one framer per transport (spec v2.5 chunks on ``/execute``, OpenAI wire
formats on chat completions and the Responses API).

Over the OpenAI wire formats the content is the answer and nothing else: the decided envelope,
sent after the decision, so that the content pieces concatenate to the content the same call
returns without streaming (the drop-in invariant LangChain's ``stream()``, the AI SDK's
``textStream`` and instructor's partials rely on). The live view — the primary field as the model
writes it, an escalation or re-ask, a reset — is reasoning: ``delta.reasoning_content`` over chat
(where vLLM and DeepSeek stream reasoning) and reasoning-summary events over Responses (one
summary part per answer set aside). Every frame also carries its stream chunk as
``cognitive_chunk``. Mapping and examples: docs/streaming.md.
"""

from __future__ import annotations

import time
import uuid
from typing import Any

import orjson

from proxy.jsonshape import as_dict
from proxy.stream.chunks import HEARTBEAT, Kind, without_answer
from proxy.stream.negotiate import Transport
from proxy.wire import envelope_text, response_object, sse_event

REASONING = "reasoning_content"
"""The chat delta field of the live view."""
RESET_TEXT = "\n\n"
"""The live view's text at a reset (an answer set aside): a paragraph break."""
_TERMINAL: frozenset[Kind] = frozenset({"final", "error"})


def _spec_payload(kind: Kind, payload: bytes) -> bytes:
    """The chunk as the spec defines it: a terminal chunk without the proxy's answer key."""
    if kind not in _TERMINAL:
        return payload
    chunk = orjson.loads(payload)
    without_answer(chunk)
    return orjson.dumps(chunk)


class Framer:
    """Chunks -> bytes for one transport (SSE with the chunk kind as the event name)."""

    content_type = "text/event-stream"

    def meta(self, chunk: dict[str, Any]) -> bytes:
        return b"event: meta\ndata: " + orjson.dumps(chunk) + b"\n\n"

    def event(self, kind: Kind, payload: bytes) -> bytes:
        return b"event: " + kind.encode() + b"\ndata: " + _spec_payload(kind, payload) + b"\n\n"

    def heartbeat(self) -> bytes:
        return b"event: chunk\ndata: {}\n\n"

    def end(self) -> bytes:
        return b""


class NdjsonFramer(Framer):
    content_type = "application/x-ndjson"

    def meta(self, chunk: dict[str, Any]) -> bytes:
        return orjson.dumps(chunk) + b"\n"

    def event(self, kind: Kind, payload: bytes) -> bytes:
        return _spec_payload(kind, payload) + b"\n"

    def heartbeat(self) -> bytes:
        return orjson.dumps(HEARTBEAT) + b"\n"


def framer_for(transport: Transport) -> Framer:
    return NdjsonFramer() if transport == "ndjson" else Framer()


def live_text(kind: Kind, chunk: dict[str, Any], primary: str) -> str | None:
    """The live view of one chunk as reasoning text: a delta of the ``primary`` field, a progress
    chunk's message in brackets, ``RESET_TEXT`` at a snapshot; None for anything else."""
    if kind == "progress":
        return f"\n\n[{as_dict(chunk.get('progress')).get('message', '')}]"
    inner = as_dict(chunk.get("chunk"))
    if inner.get("type") == "snapshot":
        return RESET_TEXT
    if inner.get("type") == "delta" and inner.get("field") == primary:
        delta = inner.get("delta")
        return delta if isinstance(delta, str) else None
    return None


def _sse(obj: dict[str, Any]) -> bytes:
    return b"data: " + orjson.dumps(obj) + b"\n\n"


def fingerprint(decision: Any, tier: Any, meta: dict[str, Any]) -> str:
    """The decision in ``system_fingerprint``: the one field of a completion (and of a stream's last
    chunk) that LangChain, LlamaIndex and other wrappers keep when they drop the rest.
    ``cogproxy:decision=escalated;tier=decision;confidence=0.92;risk=low``"""
    return (
        f"cogproxy:decision={decision};tier={tier};"
        f"confidence={meta.get('confidence')};risk={meta.get('risk')}"
    )


class ChatFramer(Framer):
    """``chat.completion.chunk`` frames: the live view as ``delta.reasoning_content``; after the
    decision the envelope as ``delta.content`` (or, with ``tool``, as the arguments of that forced
    tool call), then a frame with ``finish_reason`` carrying ``envelope``, ``cognitive`` and the
    decision in ``system_fingerprint``. An answer the sync call would refuse with an error status
    ends with an ``error`` frame instead (the OpenAI SDK raises ``APIError``)."""

    def __init__(self, model: str, primary: str, include_usage: bool, tool: str | None = None) -> None:
        self._base = {
            "id": f"chatcmpl-{uuid.uuid4().hex[:24]}",
            "object": "chat.completion.chunk",
            "created": int(time.time()),
            "model": model,
        }
        self._primary = primary
        self._include_usage = include_usage
        self._tool = tool

    def _frame(
        self, delta: dict[str, Any], chunk: dict[str, Any] | None, finish: str | None = None
    ) -> dict[str, Any]:
        frame = {**self._base, "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}
        if chunk is not None:
            frame["cognitive_chunk"] = chunk
        return frame

    def meta(self, chunk: dict[str, Any]) -> bytes:
        return _sse(self._frame({"role": "assistant", "content": ""}, chunk))

    def event(self, kind: Kind, payload: bytes) -> bytes:
        chunk = orjson.loads(payload)
        if kind not in _TERMINAL:
            text = live_text(kind, chunk, self._primary)
            return _sse(self._frame({REASONING: text} if text else {}, chunk))
        answer = without_answer(chunk)
        cognitive = chunk.pop("cognitive", None)
        if answer is None or answer.get("status") != 200:
            return self._error(chunk, cognitive, answer)
        envelope = as_dict(answer.get("envelope"))
        text = envelope_text(envelope)
        if self._tool is None:
            out, finish = _sse(self._frame({"content": text}, None)), "stop"
        else:
            out, finish = (
                _sse(self._frame({"tool_calls": [tool_call_delta(self._tool, text)]}, None)),
                "tool_calls",
            )
        frame = self._frame({}, chunk, finish)
        decision = as_dict(cognitive)
        frame.update(
            envelope=envelope,
            cognitive=cognitive,
            system_fingerprint=fingerprint(
                decision.get("decision"), decision.get("tier"), as_dict(envelope.get("meta"))
            ),
        )
        out += _sse(frame)
        if self._include_usage:
            usage = as_dict(chunk.get("usage"))
            given, made = int(usage.get("input_tokens", 0)), int(usage.get("output_tokens", 0))
            counts = {"prompt_tokens": given, "completion_tokens": made, "total_tokens": given + made}
            out += _sse({**self._base, "choices": [], "usage": counts})
        return out

    def _error(self, chunk: dict[str, Any], cognitive: Any, answer: dict[str, Any] | None) -> bytes:
        error = as_dict(chunk.get("error"))
        envelope = (
            as_dict(answer.get("envelope"))
            if answer is not None
            else {k: chunk[k] for k in ("ok", "meta", "error", "partial_data") if k in chunk}
        )
        body = {
            "message": str(error.get("message", "")),
            "type": "cognitive_module_error",
            "code": error.get("code"),
        }
        return _sse(
            {
                **self._base,
                "error": body,
                "envelope": envelope,
                "cognitive": cognitive,
                "cognitive_chunk": chunk,
            }
        )

    def heartbeat(self) -> bytes:
        return b": keep-alive\n\n"

    def end(self) -> bytes:
        return b"data: [DONE]\n\n"


def tool_call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


def tool_call_delta(name: str, arguments: str) -> dict[str, Any]:
    """The one streamed piece of a forced tool call: id, name and all its arguments."""
    return {
        "index": 0,
        "id": tool_call_id(),
        "type": "function",
        "function": {"name": name, "arguments": arguments},
    }


class ResponsesFramer(Framer):
    """Responses API events: the live view as a reasoning item's summary (``response.reasoning_
    summary_text.delta``; a reset closes the summary part and the next answer opens another);
    after the decision a message item whose ``response.output_text.delta`` is the envelope, then
    ``response.completed`` (output: the reasoning item and the message, ``cognitive``). An answer
    the sync call refuses with an error status ends with ``response.failed``. Other chunks ride on
    ``response.in_progress`` events as ``cognitive_chunk``."""

    def __init__(self, model: str, primary: str) -> None:
        self._model = model
        self._primary = primary
        self._number = 0
        self._shell = response_object(model, "")
        self._message_id = self._shell["output"][0]["id"]
        self._reasoning_id = f"rs_{uuid.uuid4().hex}"
        self._parts: list[str] = []
        self._part_open = False

    def _event(self, event: dict[str, Any]) -> bytes:
        event["sequence_number"] = self._number
        self._number += 1
        return sse_event(event)

    def _pending(self) -> dict[str, Any]:
        return {**self._shell, "status": "in_progress", "output": [], "usage": None}

    def meta(self, chunk: dict[str, Any]) -> bytes:
        return self._event(
            {"type": "response.created", "response": self._pending(), "cognitive_chunk": chunk}
        ) + self._event({"type": "response.in_progress", "response": self._pending()})

    def _reasoning_item(self, status: str) -> dict[str, Any]:
        summary = [{"type": "summary_text", "text": text} for text in self._parts]
        return {"type": "reasoning", "id": self._reasoning_id, "summary": summary, "status": status}

    def _summary_ids(self) -> dict[str, Any]:
        return {"item_id": self._reasoning_id, "output_index": 0, "summary_index": len(self._parts) - 1}

    def _reason(self, text: str, chunk: dict[str, Any]) -> bytes:
        out = b""
        if not self._parts:
            item = {**self._reasoning_item("in_progress"), "summary": []}
            out += self._event({"type": "response.output_item.added", "output_index": 0, "item": item})
        if not self._part_open:
            self._parts.append("")
            self._part_open = True
            part = {"type": "summary_text", "text": ""}
            out += self._event(
                {"type": "response.reasoning_summary_part.added", **self._summary_ids(), "part": part}
            )
        self._parts[-1] += text
        delta = {"type": "response.reasoning_summary_text.delta", **self._summary_ids(), "delta": text}
        return out + self._event({**delta, "cognitive_chunk": chunk})

    def _close_part(self) -> bytes:
        if not self._part_open:
            return b""
        self._part_open = False
        ids, text = self._summary_ids(), self._parts[-1]
        part = {"type": "summary_text", "text": text}
        return self._event(
            {"type": "response.reasoning_summary_text.done", **ids, "text": text}
        ) + self._event({"type": "response.reasoning_summary_part.done", **ids, "part": part})

    def event(self, kind: Kind, payload: bytes) -> bytes:
        chunk = orjson.loads(payload)
        if kind not in _TERMINAL:
            text = live_text(kind, chunk, self._primary)
            if text == RESET_TEXT:  # a reset: the next answer's summary is a part of its own
                closed = self._close_part()
                return closed + self._event(
                    {"type": "response.in_progress", "response": self._pending(), "cognitive_chunk": chunk}
                )
            if text:
                return self._reason(text, chunk)
            return self._event(
                {"type": "response.in_progress", "response": self._pending(), "cognitive_chunk": chunk}
            )
        answer = without_answer(chunk)
        cognitive = chunk.pop("cognitive", None)
        if answer is None or answer.get("status") != 200:
            return self._failed(chunk, cognitive, answer)
        return self._completed(chunk, cognitive, as_dict(answer.get("envelope")))

    def _completed(self, chunk: dict[str, Any], cognitive: Any, envelope: dict[str, Any]) -> bytes:
        text = envelope_text(envelope)
        out = self._close_part()
        output: list[dict[str, Any]] = []
        if self._parts:
            output.append(self._reasoning_item("completed"))
            out += self._event({"type": "response.output_item.done", "output_index": 0, "item": output[0]})
        index = len(output)
        usage = as_dict(chunk.get("usage"))
        counts = {
            "prompt_tokens": usage.get("input_tokens", 0),
            "completion_tokens": usage.get("output_tokens", 0),
        }
        final = response_object(self._model, text, counts)
        item = {**final["output"][0], "id": self._message_id}
        ids = {"item_id": self._message_id, "output_index": index, "content_index": 0}
        empty = {"type": "output_text", "text": "", "annotations": []}
        started = {**item, "status": "in_progress", "content": []}
        out += (
            self._event({"type": "response.output_item.added", "output_index": index, "item": started})
            + self._event({"type": "response.content_part.added", **ids, "part": empty})
            + self._event({"type": "response.output_text.delta", **ids, "delta": text, "logprobs": []})
            + self._event({"type": "response.output_text.done", **ids, "text": text, "logprobs": []})
            + self._event({"type": "response.content_part.done", **ids, "part": item["content"][0]})
            + self._event({"type": "response.output_item.done", "output_index": index, "item": item})
        )
        final.update(
            id=self._shell["id"],
            created_at=self._shell["created_at"],
            cognitive=cognitive,
            output=[*output, item],
        )
        return out + self._event({"type": "response.completed", "response": final, "cognitive_chunk": chunk})

    def _failed(self, chunk: dict[str, Any], cognitive: Any, answer: dict[str, Any] | None) -> bytes:
        error = as_dict(chunk.get("error"))
        envelope = (
            as_dict(answer.get("envelope"))
            if answer is not None
            else {k: chunk[k] for k in ("ok", "meta", "error", "partial_data") if k in chunk}
        )
        failed = {
            **self._pending(),
            "status": "failed",
            "error": {"code": str(error.get("code")), "message": str(error.get("message", ""))},
            "cognitive": cognitive,
            "envelope": envelope,
        }
        return self._event({"type": "response.failed", "response": failed, "cognitive_chunk": chunk})

    def heartbeat(self) -> bytes:
        return b": keep-alive\n\n"
