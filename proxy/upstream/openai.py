"""``kind: openai``: any OpenAI-compatible chat completions API (OpenAI, vLLM, Ollama, LM Studio)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import aiohttp
from yarl import URL

from proxy.policy.model import ProviderConfig
from proxy.upstream.base import CallInfo, ProviderError, Relayed
from proxy.upstream.body import Body
from proxy.upstream.http import auth_headers, check_json_object, open_stream, post, post_for_bytes, read_json

# Structured output, strongest first; a provider that refuses one (HTTP 400) gets the next.
_FORMATS = ("json_schema", "json_object", None)


def response_format(kind: str | None, ctx: CallInfo) -> dict[str, Any] | None:
    """The ``response_format`` asking for the module's envelope, or None."""
    if kind is None or ctx.module is None:
        return None
    if kind == "json_object":
        return {"type": "json_object"}
    schema = {
        "type": "object",
        "required": ["ok", "meta"],
        "properties": {
            "ok": {"type": "boolean"},
            "meta": ctx.module.schema.get("meta") or {"type": "object"},
            "data": ctx.module.data_schema or {"type": "object"},
            "error": {"type": "object"},
            "partial_data": {"type": "object"},
        },
    }
    defs = {k: ctx.module.schema[k] for k in ("$defs", "definitions") if k in ctx.module.schema}
    return {
        "type": "json_schema",
        "json_schema": {
            "name": ctx.module.name.replace(".", "_"),
            "strict": False,
            "schema": {**schema, **defs},
        },
    }


def _with_format(payload: dict[str, Any], level: int, ctx: CallInfo) -> dict[str, Any]:
    """``payload`` asking for the structured-output form at ``level`` of ``_FORMATS`` (if any)."""
    fmt = response_format(_FORMATS[level], ctx)
    return {**payload, "response_format": fmt} if fmt else payload


class OpenAIProvider:
    """Talks the OpenAI wire format; the proxy's own retry loop is the only one (no retries here)."""

    def __init__(self, config: ProviderConfig, session: aiohttp.ClientSession) -> None:
        self.config = config
        self._session = session
        # Parsed once, not per request. ``options.query`` serves Azure-style deployments
        # (base_url .../openai/deployments/<name>, query {api-version: ...}).
        query = {str(k): str(v) for k, v in dict(config.options.get("query", {})).items()}
        self._url = URL(f"{config.base_url}/chat/completions").update_query(query)
        self._static_headers = {"Content-Type": "application/json", **config.headers}
        # Which structured-output form each model accepted last (learned from 400s, per process).
        self._format_level: dict[str, int] = {}

    def _headers(self, ctx: CallInfo) -> dict[str, str]:
        headers = self._static_headers.copy()
        headers.update(auth_headers(self.config, ctx))
        if ctx.trace_id:
            headers["X-Request-Id"] = ctx.trace_id
        return headers

    def _first_format(self, body: dict[str, Any], model: str, ctx: CallInfo) -> int:
        """Where in ``_FORMATS`` a call starts: module calls at the strongest form this model took
        last; other calls (or a client's own ``response_format``) ask for none."""
        wants_format = (
            ctx.module is not None and ctx.module.runtime.structured_output and "response_format" not in body
        )
        return self._format_level.get(model, 0) if wants_format else len(_FORMATS) - 1

    def _step_down(self, exc: ProviderError, model: str, level: int) -> int | None:
        """The next form after a refusal (HTTP 400) of ``level``'s, remembered; None: no next."""
        if exc.status != 400 or _FORMATS[level] is None or level + 1 >= len(_FORMATS):
            return None
        self._format_level[model] = level + 1
        return level + 1

    async def complete(
        self, body: dict[str, Any], model: str, ctx: CallInfo, timeout: float
    ) -> dict[str, Any]:
        """One chat completion. Module calls ask for structured output and step down on refusal."""
        payload = {**body, "model": model, "stream": False}
        level = self._first_format(body, model, ctx)
        while True:
            attempt = _with_format(payload, level, ctx)
            try:
                async with post(
                    self._session, self._url, attempt, self._headers(ctx), timeout, ctx.media
                ) as resp:
                    return await read_json(resp)
            except ProviderError as exc:
                lower = self._step_down(exc, model, level)
                if lower is None:
                    raise
                level = lower

    async def relay(self, body: dict[str, Any], model: str, ctx: CallInfo, timeout: float) -> Relayed:
        """The upstream's answer bytes, untouched (checked to be a JSON object, never re-encoded)."""
        payload = {**body, "model": model, "stream": False}
        raw = await post_for_bytes(self._session, self._url, payload, self._headers(ctx), timeout)
        return Relayed(raw, check_json_object(raw))

    async def relay_stream(self, body: dict[str, Any], model: str, ctx: CallInfo, timeout: float) -> Body:
        """The upstream's SSE answer, its body read with the response's own ``readany`` (no
        generator per chunk); structured output for module calls as ``stream`` asks for it."""
        payload = {**body, "model": model, "stream": True}
        level = self._first_format(body, model, ctx)
        while True:
            attempt = _with_format(payload, level, ctx)
            try:
                resp = await open_stream(
                    self._session, self._url, attempt, self._headers(ctx), timeout, ctx.media
                )
            except ProviderError as exc:
                lower = self._step_down(exc, model, level)
                if lower is None:
                    raise
                level = lower
            else:
                return Body.of_response(resp)

    async def stream(
        self, body: dict[str, Any], model: str, ctx: CallInfo, timeout: float, *, bound_reads: bool = True
    ) -> AsyncIterator[bytes]:
        """Forward the upstream SSE bytes as they arrive; nothing is buffered or re-encoded. Module
        calls ask for structured output as ``complete`` does; a refusal comes before any byte."""
        payload = {**body, "model": model, "stream": True}
        level = self._first_format(body, model, ctx)
        sent = False
        while True:
            attempt = _with_format(payload, level, ctx)
            try:
                async with post(
                    self._session,
                    self._url,
                    attempt,
                    self._headers(ctx),
                    timeout,
                    ctx.media,
                    bound_reads=bound_reads,
                ) as resp:
                    async for chunk in resp.content.iter_any():
                        sent = True
                        yield chunk
                    return
            except ProviderError as exc:
                lower = None if sent else self._step_down(exc, model, level)
                if lower is None:
                    raise
                level = lower
