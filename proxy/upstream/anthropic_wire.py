"""Pure translation between the OpenAI chat completions API and the Anthropic Messages API.

Nothing here does I/O: the Anthropic client builds request bodies with :func:`to_messages_request`,
turns answers back with :func:`from_messages_response`, and for streams feeds the events
(split by :func:`proxy.upstream.sse.parse_sse`) to a :class:`StreamTranslator`.
"""

from __future__ import annotations

import time
import uuid
from types import MappingProxyType
from typing import Any

import orjson

__all__ = (
    "StreamError",
    "StreamTranslator",
    "from_messages_response",
    "map_error",
    "to_messages_request",
)

_TOOL_CHOICES = MappingProxyType({"auto": "auto", "required": "any", "none": "none"})

_PROMPT_TOKEN_KEYS = ("input_tokens", "cache_read_input_tokens", "cache_creation_input_tokens")

_FINISH_REASONS = MappingProxyType(
    {
        "end_turn": "stop",
        "stop_sequence": "stop",
        "max_tokens": "length",
        "model_context_window_exceeded": "length",
        "tool_use": "tool_calls",
        "pause_turn": "stop",
        "refusal": "content_filter",
    }
)

_ERROR_TYPES = MappingProxyType(
    {
        "invalid_request_error": "invalid_request_error",
        "request_too_large": "invalid_request_error",
        "authentication_error": "authentication_error",
        "permission_error": "permission_error",
        "not_found_error": "not_found_error",
        "billing_error": "insufficient_quota",
        "rate_limit_error": "rate_limit_error",
        "api_error": "api_error",
        "overloaded_error": "server_error",
        "timeout_error": "server_error",
    }
)


class StreamError(Exception):
    """An ``error`` event arrived in an Anthropic stream."""

    def __init__(self, message: str, error_type: str = "api_error") -> None:
        super().__init__(message)
        self.message = message
        self.error_type = error_type


# --------------------------------------------------------------------------- requests


def to_messages_request(
    body: dict[str, Any], model: str, *, default_max_tokens: int = 4096
) -> dict[str, Any]:
    """Translate an OpenAI chat completions request body into an Anthropic ``/v1/messages`` body.

    Raises ``ValueError`` for a body that cannot be translated (no user/assistant message,
    malformed messages, unsupported content parts or tools).
    """
    raw_messages = body.get("messages")
    if not isinstance(raw_messages, list):
        raise ValueError("'messages' must be a list")
    system_parts, turns = _system_and_turns(raw_messages)
    messages = _merge_turns(turns)
    if not messages:
        raise ValueError("the request has no user or assistant message")

    out: dict[str, Any] = {"model": model, "messages": messages}
    if system_parts:
        out["system"] = "\n\n".join(system_parts)
    out.update(_sampling(body, default_max_tokens))
    out.update(_tools_of(body))
    user = body.get("user")
    if isinstance(user, str) and user:
        out["metadata"] = {"user_id": user}
    return out


def _system_and_turns(raw_messages: list[Any]) -> tuple[list[str], list[tuple[str, Any]]]:
    """System/developer texts (Anthropic's top-level ``system``) and the conversation turns."""
    system_parts: list[str] = []
    turns: list[tuple[str, Any]] = []
    for i, msg in enumerate(raw_messages):
        if not isinstance(msg, dict):
            raise ValueError(f"messages[{i}] must be an object")
        role = msg.get("role")
        if role in ("system", "developer"):
            text = _text_parts_only(msg.get("content"), f"messages[{i}]")
            if text:
                system_parts.append(text)
        elif role == "user":
            turns.append(("user", _user_content(msg.get("content"), f"messages[{i}]")))
        elif role == "assistant":
            turns.append(("assistant", _assistant_content(msg, f"messages[{i}]")))
        elif role == "tool":
            turns.append(("user", [_tool_result(msg, f"messages[{i}]")]))
        else:
            raise ValueError(f"messages[{i}] has unsupported role {role!r}")
    return system_parts, turns


def _sampling(body: dict[str, Any], default_max_tokens: int) -> dict[str, Any]:
    """``max_tokens`` (required by Anthropic), temperature, top_p, stop sequences, stream."""
    out: dict[str, Any] = {}
    max_tokens = body.get("max_completion_tokens")
    if max_tokens is None:
        max_tokens = body.get("max_tokens")
    out["max_tokens"] = default_max_tokens if max_tokens is None else max_tokens

    for key in ("temperature", "top_p"):
        if body.get(key) is not None:
            out[key] = body[key]
    stop = body.get("stop")
    if isinstance(stop, str):
        out["stop_sequences"] = [stop]
    elif isinstance(stop, list) and stop:
        out["stop_sequences"] = list(stop)
    if body.get("stream") is not None:
        out["stream"] = bool(body["stream"])
    return out


def _tools_of(body: dict[str, Any]) -> dict[str, Any]:
    """``tools`` and ``tool_choice`` (``parallel_tool_calls: false`` as ``disable_parallel_tool_use``)."""
    out: dict[str, Any] = {}
    tools = body.get("tools")
    if tools:
        out["tools"] = [_tool(t, f"tools[{i}]") for i, t in enumerate(tools)]
    tool_choice = _tool_choice(body.get("tool_choice"))
    if body.get("parallel_tool_calls") is False and tools:
        if tool_choice is None:
            tool_choice = {"type": "auto"}
        if tool_choice["type"] != "none":
            tool_choice["disable_parallel_tool_use"] = True
    if tool_choice is not None:
        out["tool_choice"] = tool_choice
    return out


def _text_parts_only(content: Any, where: str) -> str:
    """The text of a string content or a list of text parts."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts: list[str] = []
        for part in content:
            if not isinstance(part, dict) or part.get("type") != "text":
                raise ValueError(f"{where}: only text content parts are allowed here")
            texts.append(str(part.get("text", "")))
        return "\n\n".join(t for t in texts if t)
    raise ValueError(f"{where}: content must be a string or a list of parts")


def _user_content(content: Any, where: str) -> str | list[dict[str, Any]]:
    if content is None or isinstance(content, str):
        return content or ""
    if not isinstance(content, list):
        raise ValueError(f"{where}: content must be a string or a list of parts")
    blocks = [_user_part(part, f"{where}.content[{j}]") for j, part in enumerate(content)]
    return [b for b in blocks if b["type"] != "text" or b["text"]]  # Anthropic rejects empty text


def _user_part(part: Any, where: str) -> dict[str, Any]:
    if not isinstance(part, dict):
        raise ValueError(f"{where} must be an object")
    kind = part.get("type")
    if kind == "text":
        return {"type": "text", "text": str(part.get("text", ""))}
    if kind == "image_url":
        image = part.get("image_url")
        url = image.get("url") if isinstance(image, dict) else image
        if not isinstance(url, str):
            raise ValueError(f"{where}: image_url.url must be a string")
        return {"type": "image", "source": _image_source(url, where)}
    if kind == "file":
        return _document(part.get("file"), where)
    raise ValueError(f"{where}: unsupported content part type {kind!r}")


def _document(file: Any, where: str) -> dict[str, Any]:
    """An OpenAI ``file`` part carrying a PDF data URL as an Anthropic ``document`` block."""
    data_url = file.get("file_data") if isinstance(file, dict) else None
    if not isinstance(data_url, str) or not data_url.startswith("data:"):
        raise ValueError(f"{where}: file parts need file.file_data as a data: URL")
    source = _image_source(data_url, where)
    if source["media_type"] != "application/pdf":
        raise ValueError(f"{where}: Anthropic documents are PDFs, not {source['media_type']}")
    block: dict[str, Any] = {"type": "document", "source": source}
    if isinstance(file.get("filename"), str):
        block["title"] = file["filename"]
    return block


def _image_source(url: str, where: str) -> dict[str, Any]:
    if url.startswith("data:"):
        header, sep, data = url[5:].partition(",")
        media_type, _, encoding = header.partition(";")
        if not sep or encoding != "base64" or not media_type:
            raise ValueError(f"{where}: image data URLs must look like data:<media type>;base64,<data>")
        return {"type": "base64", "media_type": media_type, "data": data}
    if url.startswith(("https://", "http://")):
        return {"type": "url", "url": url}
    raise ValueError(f"{where}: image URL must be a data: URL or an http(s) URL")


def _assistant_content(msg: dict[str, Any], where: str) -> str | list[dict[str, Any]]:
    content = msg.get("content")
    tool_calls = msg.get("tool_calls") or []
    if not tool_calls and (content is None or isinstance(content, str)):
        return content or ""
    blocks: list[dict[str, Any]] = []
    if isinstance(content, str):
        if content:
            blocks.append({"type": "text", "text": content})
    elif isinstance(content, list):
        for j, part in enumerate(content):
            if not isinstance(part, dict) or part.get("type") not in ("text", "refusal"):
                raise ValueError(f"{where}.content[{j}]: assistant parts must be text or refusal")
            text = part.get("text") if part.get("type") == "text" else part.get("refusal")
            if text:
                blocks.append({"type": "text", "text": str(text)})
    elif content is not None:
        raise ValueError(f"{where}: content must be a string or a list of parts")
    for j, call in enumerate(tool_calls):
        blocks.append(_tool_use(call, f"{where}.tool_calls[{j}]"))
    return blocks


def _tool_use(call: Any, where: str) -> dict[str, Any]:
    if not isinstance(call, dict) or not isinstance(call.get("function"), dict):
        raise ValueError(f"{where} must be a function tool call")
    fn = call["function"]
    arguments = fn.get("arguments") or "{}"
    try:
        tool_input = orjson.loads(arguments) if isinstance(arguments, str) else arguments
    except orjson.JSONDecodeError as exc:
        raise ValueError(f"{where}: function.arguments is not valid JSON") from exc
    if not isinstance(tool_input, dict):
        raise ValueError(f"{where}: function.arguments must be a JSON object")
    return {"type": "tool_use", "id": call.get("id"), "name": fn.get("name"), "input": tool_input}


def _tool_result(msg: dict[str, Any], where: str) -> dict[str, Any]:
    call_id = msg.get("tool_call_id")
    if not isinstance(call_id, str) or not call_id:
        raise ValueError(f"{where}: tool messages need a tool_call_id")
    content = msg.get("content")
    result: Any
    if content is None or isinstance(content, str):
        result = content or ""
    else:
        _text_parts_only(content, where)  # validates: text parts only
        result = [{"type": "text", "text": str(p.get("text", ""))} for p in content]
    return {"type": "tool_result", "tool_use_id": call_id, "content": result}


def _blocks(content: str | list[dict[str, Any]]) -> list[dict[str, Any]]:
    if isinstance(content, str):
        return [{"type": "text", "text": content}] if content else []
    return content


def _merge_turns(turns: list[tuple[str, Any]]) -> list[dict[str, Any]]:
    """Drop empty turns and merge consecutive turns of one role (Anthropic requires alternation)."""
    merged: list[dict[str, Any]] = []
    for role, content in turns:
        if not content:
            continue
        if merged and merged[-1]["role"] == role:
            last = merged[-1]
            last["content"] = _blocks(last["content"]) + _blocks(content)
        else:
            merged.append({"role": role, "content": content})
    for msg in merged:  # tool_result blocks must open a user message
        content = msg["content"]
        if msg["role"] == "user" and isinstance(content, list):
            results = [b for b in content if b.get("type") == "tool_result"]
            msg["content"] = results + [b for b in content if b.get("type") != "tool_result"]
    return merged


def _tool(tool: Any, where: str) -> dict[str, Any]:
    fn = tool.get("function") if isinstance(tool, dict) and tool.get("type") == "function" else None
    if not isinstance(fn, dict):
        raise ValueError(f"{where}: only function tools are supported")
    if not isinstance(fn.get("name"), str):
        raise ValueError(f"{where}: function.name must be a string")
    out: dict[str, Any] = {"name": fn["name"]}
    if fn.get("description"):
        out["description"] = fn["description"]
    out["input_schema"] = fn.get("parameters") or {"type": "object", "properties": {}}
    return out


def _tool_choice(choice: Any) -> dict[str, Any] | None:
    if choice is None:
        return None
    if isinstance(choice, str):
        if choice not in _TOOL_CHOICES:
            raise ValueError(f"unsupported tool_choice {choice!r}")
        return {"type": _TOOL_CHOICES[choice]}
    if isinstance(choice, dict) and choice.get("type") == "function":
        fn = choice.get("function")
        if isinstance(fn, dict) and isinstance(fn.get("name"), str):
            return {"type": "tool", "name": fn["name"]}
    raise ValueError("tool_choice must be 'auto', 'required', 'none' or a function choice")


# --------------------------------------------------------------------------- responses


def _finish_reason(stop_reason: Any) -> str | None:
    if stop_reason is None:
        return None
    return _FINISH_REASONS.get(str(stop_reason), "stop")


def _prompt_tokens(usage: dict[str, Any]) -> int:
    return sum(int(usage.get(key) or 0) for key in _PROMPT_TOKEN_KEYS)


def _usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }


def from_messages_response(resp: dict[str, Any], model: str) -> dict[str, Any]:
    """Translate an Anthropic message into an OpenAI ``chat.completion`` object."""
    texts: list[str] = []
    tool_calls: list[dict[str, Any]] = []
    for block in resp.get("content") or []:
        if not isinstance(block, dict):
            continue
        if block.get("type") == "text":
            texts.append(str(block.get("text", "")))
        elif block.get("type") == "tool_use":
            tool_calls.append(
                {
                    "id": block.get("id"),
                    "type": "function",
                    "function": {
                        "name": block.get("name"),
                        "arguments": orjson.dumps(block.get("input") or {}).decode(),
                    },
                }
            )
    message: dict[str, Any] = {"role": "assistant", "content": "".join(texts) if texts else None}
    if tool_calls:
        message["tool_calls"] = tool_calls
    usage = resp.get("usage") or {}
    return {
        "id": f"chatcmpl-{resp.get('id', uuid.uuid4().hex)}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [
            {
                "index": 0,
                "message": message,
                "finish_reason": _finish_reason(resp.get("stop_reason")) or "stop",
                "logprobs": None,
            }
        ],
        "usage": _usage(_prompt_tokens(usage), int(usage.get("output_tokens") or 0)),
    }


# --------------------------------------------------------------------------- streams


class StreamTranslator:
    """Turns Anthropic streaming events into OpenAI ``chat.completion.chunk`` dicts, one event at a time."""

    def __init__(self, model: str, *, include_usage: bool = False) -> None:
        self.model = model
        self.include_usage = include_usage
        self.id = f"chatcmpl-{uuid.uuid4().hex}"
        self.created = int(time.time())
        self._started = False
        self._tool_index: dict[int, int] = {}  # Anthropic content block index -> OpenAI tool call index
        self._prompt_tokens = 0
        self._completion_tokens = 0
        self.stopped = False
        """``message_stop`` arrived: the Anthropic stream ended as it should."""

    def _chunk(self, delta: dict[str, Any], finish_reason: str | None = None) -> dict[str, Any]:
        self._started = True
        chunk: dict[str, Any] = {
            "id": self.id,
            "object": "chat.completion.chunk",
            "created": self.created,
            "model": self.model,
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish_reason, "logprobs": None}],
        }
        if self.include_usage:
            chunk["usage"] = None
        return chunk

    def feed(self, event: str, data: dict[str, Any]) -> list[dict[str, Any]]:
        """The chunks (possibly none) for one SSE event; raises :class:`StreamError` on an ``error`` event."""
        kind = data.get("type", event) if event == "message" else event
        if kind == "message_start":
            message = data.get("message") or {}
            if not self._started and message.get("id"):
                self.id = f"chatcmpl-{message['id']}"
            self._update_usage(message.get("usage") or {})
            return [self._chunk({"role": "assistant", "content": ""})]
        if kind == "content_block_start":
            return self._block_start(int(data.get("index", 0)), data.get("content_block") or {})
        if kind == "content_block_delta":
            return self._block_delta(int(data.get("index", 0)), data.get("delta") or {})
        if kind == "message_delta":
            self._update_usage(data.get("usage") or {})
            reason = _finish_reason((data.get("delta") or {}).get("stop_reason"))
            return [self._chunk({}, reason)] if reason else []
        if kind == "message_stop":
            self.stopped = True
            if not self.include_usage:
                return []
            return [
                {
                    "id": self.id,
                    "object": "chat.completion.chunk",
                    "created": self.created,
                    "model": self.model,
                    "choices": [],
                    "usage": _usage(self._prompt_tokens, self._completion_tokens),
                }
            ]
        if kind == "error":
            error = data.get("error") or {}
            raise StreamError(
                str(error.get("message") or "the upstream stream failed"),
                _ERROR_TYPES.get(str(error.get("type")), "api_error"),
            )
        return []  # ping, content_block_stop, and event types added later

    def _update_usage(self, usage: dict[str, Any]) -> None:
        if any(key in usage for key in _PROMPT_TOKEN_KEYS):
            self._prompt_tokens = _prompt_tokens(usage)
        if usage.get("output_tokens") is not None:
            self._completion_tokens = int(usage["output_tokens"])

    def _block_start(self, index: int, block: dict[str, Any]) -> list[dict[str, Any]]:
        if block.get("type") == "text" and block.get("text"):
            return [self._chunk({"content": block["text"]})]
        if block.get("type") != "tool_use":
            return []
        tool_index = self._tool_index[index] = len(self._tool_index)
        call = {
            "index": tool_index,
            "id": block.get("id"),
            "type": "function",
            "function": {"name": block.get("name"), "arguments": ""},
        }
        return [self._chunk({"tool_calls": [call]})]

    def _block_delta(self, index: int, delta: dict[str, Any]) -> list[dict[str, Any]]:
        if delta.get("type") == "text_delta" and delta.get("text"):
            return [self._chunk({"content": delta["text"]})]
        fragment = delta.get("partial_json") if delta.get("type") == "input_json_delta" else None
        if fragment and index in self._tool_index:
            call = {"index": self._tool_index[index], "function": {"arguments": fragment}}
            return [self._chunk({"tool_calls": [call]})]
        return []  # thinking, signature and citation deltas have no OpenAI counterpart


# --------------------------------------------------------------------------- errors


def map_error(status: int, body: bytes) -> tuple[str, str]:
    """The OpenAI ``(error type, message)`` for an Anthropic error response."""
    try:
        parsed: Any = orjson.loads(body)
    except orjson.JSONDecodeError:
        parsed = None
    error = parsed.get("error") if isinstance(parsed, dict) else None
    if isinstance(error, dict) and isinstance(error.get("type"), str):
        kind = error["type"]
        message = error.get("message")
        if not isinstance(message, str) or not message:
            message = f"Anthropic API error {kind} (HTTP {status})"
        return _ERROR_TYPES.get(kind, "api_error"), message
    snippet = body[:200].decode("utf-8", errors="replace").strip()
    suffix = f": {snippet}" if snippet else ""
    return "api_error", f"Anthropic API returned HTTP {status}{suffix}"
