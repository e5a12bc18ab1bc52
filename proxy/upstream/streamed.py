"""A streamed chat completion gathered into a ``chat.completion``, its text seen as it arrives.

Module calls that stream to the client ask the provider for an OpenAI SSE stream (every provider
client offers one) and hand each text piece to ``on_text``; the pieces are then joined into the
same ``chat.completion`` object ``Provider.complete`` answers, so the contract and the decision
run on it exactly as for a call that did not stream.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

import orjson

from proxy.observability.tracing import first_token
from proxy.upstream.base import CallInfo, Provider, ProviderError
from proxy.upstream.sse import parse_sse
from proxy.wire import completion

DONE_DATA = "[DONE]"


def _frame(data: str) -> dict[str, Any]:
    try:
        frame = orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        raise ProviderError("malformed", "a streamed chunk is not JSON") from exc
    if not isinstance(frame, dict):
        raise ProviderError("malformed", "a streamed chunk is not a JSON object")
    if isinstance(frame.get("error"), dict):
        message = str(frame["error"].get("message", "stream error"))
        raise ProviderError("server_error", f"the provider stream failed: {message}"[:300])
    return frame


async def stream_completion(
    provider: Provider,
    body: dict[str, Any],
    model: str,
    ctx: CallInfo,
    timeout: float,
    on_text: Callable[[str], bool],
) -> dict[str, Any]:
    """``provider.stream`` joined into a ``chat.completion``; ``on_text`` gets each content piece
    and says whether it became a delta the caller sees (after the first, the loop turns once).

    A stream that ends without ``[DONE]`` or a finish reason is a failure (``malformed``): the
    router may fail it over like any other, and the text seen so far is not an answer.
    """
    payload = {**body, "stream_options": {"include_usage": True}}
    started = time.perf_counter()
    pieces: list[str] = []
    finish: str | None = None
    usage: dict[str, Any] | None = None
    done = False
    delivered = False
    buffer = b""
    chunks = provider.stream(payload, model, ctx, timeout)
    try:
        async for raw in chunks:
            events, buffer = parse_sse(buffer + raw)
            for _, data in events:
                if data.strip() == DONE_DATA:
                    done = True
                    continue
                frame = _frame(data)
                if isinstance(frame.get("usage"), dict):
                    usage = frame["usage"]
                for choice in frame.get("choices") or ():
                    if not isinstance(choice, dict) or choice.get("index", 0) != 0:
                        continue
                    delta = choice.get("delta")
                    text = delta.get("content") if isinstance(delta, dict) else None
                    if isinstance(text, str) and text:
                        if not pieces:
                            first_token(time.perf_counter() - started)
                        pieces.append(text)
                        if on_text(text) and not delivered:
                            # One turn of the loop: the stream's follower writes the first delta
                            # now, not once the rest of this read is parsed (#35: a read often
                            # holds several frames).
                            delivered = True
                            await asyncio.sleep(0)
                    if isinstance(choice.get("finish_reason"), str):
                        finish = choice["finish_reason"]
    finally:
        aclose = getattr(chunks, "aclose", None)
        if aclose is not None:
            await aclose()
    if not done and finish is None:
        raise ProviderError("malformed", "the provider stream ended before its last chunk")
    reply = completion(model, "".join(pieces))
    reply["choices"][0]["finish_reason"] = finish or "stop"
    if usage is not None:
        reply["usage"] = usage
    return reply
