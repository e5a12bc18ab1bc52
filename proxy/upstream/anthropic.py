"""``kind: anthropic``: the Messages API, translated to and from OpenAI's chat format."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import orjson
from yarl import URL

from proxy.jsonshape import as_dict
from proxy.policy.model import ProviderConfig
from proxy.upstream.anthropic_wire import (
    StreamError,
    StreamTranslator,
    from_messages_response,
    to_messages_request,
)
from proxy.upstream.base import CallInfo, ProviderError, Relayed, relay_from_complete
from proxy.upstream.body import Body
from proxy.upstream.http import auth_headers, post, read_json
from proxy.upstream.sse import parse_sse
from proxy.wire import DONE, sse_frame

DEFAULT_VERSION = "2023-06-01"
SHAPE_ERRORS = (AttributeError, TypeError, ValueError, KeyError, IndexError)
"""What translating an answer of the wrong shape raises (``"usage": "x"``, a string token count,
an event that is not an object): the provider's fault, ``malformed``, never the proxy's 500."""


class AnthropicProvider:
    def __init__(self, config: ProviderConfig, session: aiohttp.ClientSession) -> None:
        self.config = config
        self._session = session
        self._url = URL(f"{config.base_url}/v1/messages")
        self._version = str(config.options.get("anthropic_version", DEFAULT_VERSION))
        self._max_tokens = int(config.options.get("max_tokens", 4096))

    def _headers(self, ctx: CallInfo) -> dict[str, str]:
        headers = {
            "Content-Type": "application/json",
            "anthropic-version": self._version,
            **self.config.headers,
        }
        headers.update(auth_headers(self.config, ctx))
        return headers

    def _request(self, body: dict[str, Any], model: str, stream: bool) -> dict[str, Any]:
        try:
            payload = to_messages_request(
                {**body, "stream": stream}, model, default_max_tokens=self._max_tokens
            )
        except ValueError as exc:
            raise ProviderError(
                "client_error", f"cannot translate the request for Anthropic: {exc}", status=400
            ) from exc
        return payload

    async def complete(
        self, body: dict[str, Any], model: str, ctx: CallInfo, timeout: float
    ) -> dict[str, Any]:
        payload = self._request(body, model, stream=False)
        async with post(self._session, self._url, payload, self._headers(ctx), timeout, ctx.media) as resp:
            answer = await read_json(resp)
        try:
            return from_messages_response(answer, model)
        except SHAPE_ERRORS as exc:
            raise ProviderError("malformed", f"Anthropic answer of an unexpected shape: {exc}") from exc

    async def relay(self, body: dict[str, Any], model: str, ctx: CallInfo, timeout: float) -> Relayed:
        return await relay_from_complete(self, body, model, ctx, timeout)

    async def relay_stream(self, body: dict[str, Any], model: str, ctx: CallInfo, timeout: float) -> Body:
        """``stream``'s translated chunks, its reads left to the caller."""
        return Body.of_chunks(self.stream(body, model, ctx, timeout, bound_reads=False))

    async def stream(
        self, body: dict[str, Any], model: str, ctx: CallInfo, timeout: float, *, bound_reads: bool = True
    ) -> AsyncIterator[bytes]:
        """Anthropic SSE events in, OpenAI ``chat.completion.chunk`` frames out, as they arrive."""
        include_usage = bool(as_dict(body.get("stream_options")).get("include_usage"))
        translator = StreamTranslator(model, include_usage=include_usage)
        payload = self._request(body, model, stream=True)
        buffer = b""
        async with post(
            self._session, self._url, payload, self._headers(ctx), timeout, ctx.media, bound_reads=bound_reads
        ) as resp:
            async for piece in resp.content.iter_any():
                events, buffer = parse_sse(buffer + piece)
                for name, data in events:
                    try:
                        chunks = translator.feed(name, orjson.loads(data))
                    except StreamError as exc:
                        raise ProviderError("server_error", f"Anthropic stream error: {exc.message}") from exc
                    except SHAPE_ERRORS as exc:  # orjson.JSONDecodeError is a ValueError
                        raise ProviderError("malformed", f"bad Anthropic stream event {name!r}") from exc
                    for chunk in chunks:
                        yield sse_frame(chunk)
        # [DONE] only for a stream that reached message_stop: a truncated one must not look whole.
        if translator.stopped:
            yield DONE
