"""OpenAI wire-format builders shared by the offline provider and the HTTP edge."""

from __future__ import annotations

import time
import uuid
from collections.abc import Mapping
from typing import Any

import orjson

DONE = b"data: [DONE]\n\n"


def completion(model: str, content: str, prompt_tokens: int = 0) -> dict[str, Any]:
    """A ``chat.completion`` object with one assistant message."""
    completion_tokens = max(1, len(content) // 4)
    return {
        "id": f"chatcmpl-{uuid.uuid4().hex[:24]}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [
            {"index": 0, "message": {"role": "assistant", "content": content}, "finish_reason": "stop"}
        ],
        "usage": {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
        },
    }


def _whole_delta(message: Mapping[str, Any]) -> dict[str, Any]:
    """A message's content, or its tool calls, as one delta."""
    calls = message.get("tool_calls")
    if isinstance(calls, list):
        return {"tool_calls": [{"index": i, **call} for i, call in enumerate(calls)]}
    return {"content": message.get("content") or ""}


def completion_chunks(completion_obj: dict[str, Any], *, include_usage: bool) -> list[dict[str, Any]]:
    """The ``chat.completion.chunk`` frames that stream ``completion_obj``."""
    base = {
        "id": completion_obj["id"],
        "object": "chat.completion.chunk",
        "created": completion_obj["created"],
        "model": completion_obj["model"],
    }
    if "system_fingerprint" in completion_obj:
        base["system_fingerprint"] = completion_obj["system_fingerprint"]
    message = completion_obj["choices"][0]["message"]
    finish = completion_obj["choices"][0].get("finish_reason") or "stop"
    chunks = [
        {
            **base,
            "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}],
        },
        {**base, "choices": [{"index": 0, "delta": _whole_delta(message), "finish_reason": None}]},
        {**base, "choices": [{"index": 0, "delta": {}, "finish_reason": finish}]},
    ]
    if include_usage and "usage" in completion_obj:
        chunks.append({**base, "choices": [], "usage": completion_obj["usage"]})
    return chunks


def envelope_text(envelope: Mapping[str, Any]) -> str:
    """A module envelope as the content of an OpenAI-wire answer (sync, streamed, tool call)."""
    return orjson.dumps(envelope).decode()


def sse_frame(obj: dict[str, Any]) -> bytes:
    """One server-sent event carrying ``obj``."""
    return b"data: " + orjson.dumps(obj) + b"\n\n"


SNIFF_BYTES = 16 * 1024
"""Forwarded bytes collected before the usage sniffer looks through them."""
MAX_FRAME_BYTES = 1 << 20
"""A line longer than this is no usage frame: not kept across reads."""


class UsageSniffer:
    """Finds the last ``usage`` object in forwarded SSE bytes without parsing every chunk: the
    reads are collected (a list append each) and looked through every ``SNIFF_BYTES`` and when
    ``usage`` is read; only a line that mentions ``"usage"`` is decoded."""

    def __init__(self) -> None:
        self._usage: dict[str, Any] = {}
        self._reads: list[bytes] = []
        self._size = 0
        self._partial = b""
        """The last line read so far without its end (a frame split across reads)."""

    def feed(self, chunk: bytes) -> None:
        self._reads.append(chunk)
        self._size += len(chunk)
        if self._size >= SNIFF_BYTES:
            self._look()

    @property
    def usage(self) -> dict[str, Any]:
        self._look(last=True)
        return self._usage

    def _look(self, *, last: bool = False) -> None:
        data = self._partial + b"".join(self._reads)
        self._reads.clear()
        self._size = 0
        end = len(data) if last else data.rfind(b"\n") + 1
        self._partial = data[end:] if len(data) - end <= MAX_FRAME_BYTES else b""
        if b'"usage"' not in data:
            return
        for line in data[:end].split(b"\n"):
            if not line.startswith(b"data: {") or b'"usage"' not in line:
                continue
            try:
                frame = orjson.loads(line[6:])
            except orjson.JSONDecodeError:
                continue
            usage = frame.get("usage") if isinstance(frame, dict) else None
            if isinstance(usage, dict):
                self._usage = usage


def response_object(model: str, text: str, usage: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """A Responses-API ``response`` object whose output is one assistant message of ``text``."""
    usage = usage or {}
    prompt = int(usage.get("prompt_tokens", 0) or 0)
    completion_tokens = int(usage.get("completion_tokens", 0) or 0)
    return {
        "id": f"resp_{uuid.uuid4().hex}",
        "object": "response",
        "created_at": int(time.time()),
        "status": "completed",
        "model": model,
        "output": [
            {
                "type": "message",
                "id": f"msg_{uuid.uuid4().hex}",
                "status": "completed",
                "role": "assistant",
                "content": [{"type": "output_text", "text": text, "annotations": []}],
            }
        ],
        "parallel_tool_calls": False,
        "tool_choice": "none",
        "tools": [],
        "error": None,
        "incomplete_details": None,
        "instructions": None,
        "metadata": {},
        "text": {"format": {"type": "text"}},
        "usage": {
            "input_tokens": prompt,
            "input_tokens_details": {"cached_tokens": 0},
            "output_tokens": completion_tokens,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": prompt + completion_tokens,
        },
    }


def response_events(final: dict[str, Any], pieces: int = 4) -> list[dict[str, Any]]:
    """The Responses-API SSE events that stream ``final`` (created ... completed)."""
    item = final["output"][0]
    text: str = item["content"][0]["text"]
    pending = {**final, "status": "in_progress", "output": [], "usage": None}
    size = max(1, -(-len(text) // pieces))
    part_empty = {"type": "output_text", "text": "", "annotations": []}
    events: list[dict[str, Any]] = [
        {"type": "response.created", "response": pending},
        {"type": "response.in_progress", "response": pending},
        {
            "type": "response.output_item.added",
            "output_index": 0,
            "item": {**item, "status": "in_progress", "content": []},
        },
        {
            "type": "response.content_part.added",
            "item_id": item["id"],
            "output_index": 0,
            "content_index": 0,
            "part": part_empty,
        },
    ]
    events += [
        {
            "type": "response.output_text.delta",
            "item_id": item["id"],
            "output_index": 0,
            "content_index": 0,
            "delta": text[i : i + size],
            "logprobs": [],
        }
        for i in range(0, len(text), size)
    ]
    events += [
        {
            "type": "response.output_text.done",
            "item_id": item["id"],
            "output_index": 0,
            "content_index": 0,
            "text": text,
            "logprobs": [],
        },
        {
            "type": "response.content_part.done",
            "item_id": item["id"],
            "output_index": 0,
            "content_index": 0,
            "part": item["content"][0],
        },
        {"type": "response.output_item.done", "output_index": 0, "item": item},
        {"type": "response.completed", "response": final},
    ]
    for number, event in enumerate(events):
        event["sequence_number"] = number
    return events


def sse_event(event: dict[str, Any]) -> bytes:
    """One named server-sent event (``event: <type>``), as the Responses API streams them."""
    return b"event: " + str(event["type"]).encode() + b"\ndata: " + orjson.dumps(event) + b"\n\n"
