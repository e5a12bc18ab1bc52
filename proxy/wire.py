"""OpenAI wire-format builders shared by the offline provider and the HTTP edge."""

from __future__ import annotations

import time
import uuid
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


def completion_chunks(completion_obj: dict[str, Any], *, include_usage: bool) -> list[dict[str, Any]]:
    """The ``chat.completion.chunk`` frames that stream ``completion_obj``."""
    base = {
        "id": completion_obj["id"],
        "object": "chat.completion.chunk",
        "created": completion_obj["created"],
        "model": completion_obj["model"],
    }
    message = completion_obj["choices"][0]["message"]
    finish = completion_obj["choices"][0].get("finish_reason") or "stop"
    chunks = [
        {
            **base,
            "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}],
        },
        {
            **base,
            "choices": [
                {"index": 0, "delta": {"content": message.get("content") or ""}, "finish_reason": None}
            ],
        },
        {**base, "choices": [{"index": 0, "delta": {}, "finish_reason": finish}]},
    ]
    if include_usage and "usage" in completion_obj:
        chunks.append({**base, "choices": [], "usage": completion_obj["usage"]})
    return chunks


def sse_frame(obj: dict[str, Any]) -> bytes:
    """One server-sent event carrying ``obj``."""
    return b"data: " + orjson.dumps(obj) + b"\n\n"


class UsageSniffer:
    """Finds the ``usage`` object in forwarded SSE bytes without parsing every chunk: only a
    chunk that mentions a non-null usage is split into frames and decoded."""

    def __init__(self) -> None:
        self.usage: dict[str, Any] = {}

    def feed(self, chunk: bytes) -> None:
        if b'"usage":' not in chunk and b'"usage": ' not in chunk:
            return
        for line in chunk.split(b"\n"):
            if not line.startswith(b"data: {") or b'"usage"' not in line:
                continue
            try:
                frame = orjson.loads(line[6:])
            except orjson.JSONDecodeError:
                continue  # a frame split across chunks: usage is reported in one small frame
            usage = frame.get("usage") if isinstance(frame, dict) else None
            if isinstance(usage, dict):
                self.usage = usage
