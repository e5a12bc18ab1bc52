"""What every provider client offers, and the typed errors the router acts on."""

from __future__ import annotations

import asyncio
import datetime
import email.utils
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, Protocol

import orjson

from proxy.media.model import Media
from proxy.module.model import Module
from proxy.policy.model import ProviderConfig
from proxy.redact import redact_text

if TYPE_CHECKING:
    from proxy.upstream.body import Body

FailureKind = Literal[
    "connect", "timeout", "rate_limited", "client_error", "server_error", "malformed", "circuit_open"
]
"""``circuit_open``: the target was skipped by its open breaker (no request was sent)."""


class ProviderError(Exception):
    """A provider call that failed. ``kind`` is what the router retries or fails over on."""

    def __init__(
        self,
        kind: FailureKind,
        message: str,
        *,
        status: int | None = None,
        retry_after: float | None = None,
        body: bytes = b"",
        headers: dict[str, str] | None = None,
    ) -> None:
        # The message is quoted in the proxy's own answers and logs; the raw ``body`` is kept
        # verbatim for relaying an upstream's own 4xx answer.
        message = redact_text(message)
        super().__init__(message)
        self.kind: FailureKind = kind
        self.message = message
        self.status = status
        self.retry_after = retry_after
        self.body = body
        self.headers = headers or {}


@dataclass(slots=True)  # built per request: not frozen (a frozen init costs 4x)
class CallInfo:
    """What a provider may know about the call besides the OpenAI body."""

    trace_id: str = ""
    client_key: str | None = None
    module: Module | None = None
    input: Any = None
    media: tuple[Media, ...] = ()
    """The call's validated media: their bytes replace their tokens when a body is written."""


@dataclass(slots=True)  # built per request: not frozen (a frozen init costs 4x)
class Relayed:
    body: bytes
    reply: dict[str, Any]
    """``body`` as parsed (checked to be an object): its usage is accounted, and a traced attempt
    reads its model, id and finish reasons from it."""

    @property
    def usage(self) -> dict[str, Any]:
        return usage_of(self.reply)


def usage_of(reply: dict[str, Any]) -> dict[str, Any]:
    usage = reply.get("usage")
    return usage if isinstance(usage, dict) else {}


class Provider(Protocol):
    config: ProviderConfig

    async def complete(
        self, body: dict[str, Any], model: str, ctx: CallInfo, timeout: float
    ) -> dict[str, Any]:
        """One non-streamed chat completion, answered as an OpenAI ``chat.completion`` object."""
        ...

    async def relay(self, body: dict[str, Any], model: str, ctx: CallInfo, timeout: float) -> Relayed:
        """A non-streamed passthrough answer as OpenAI ``chat.completion`` JSON bytes (an
        OpenAI-wire provider hands the upstream's bytes over untouched), with its usage.

        Bounded as a whole by ``timeout`` (the body's arrival included): the router leaves the
        passthrough's attempts to it (one timer per call instead of two)."""
        ...

    def stream(
        self, body: dict[str, Any], model: str, ctx: CallInfo, timeout: float, *, bound_reads: bool = True
    ) -> AsyncIterator[bytes]:
        """A streamed chat completion as OpenAI SSE bytes (``data: {...}\\n\\n`` ... ``[DONE]``).

        ``timeout`` bounds connecting and each read; ``bound_reads=False`` bounds connecting only,
        for a caller that bounds the silence between reads itself (``relay_stream`` of a provider
        that translates)."""
        ...

    async def relay_stream(self, body: dict[str, Any], model: str, ctx: CallInfo, timeout: float) -> Body:
        """``stream`` for the passthrough's relay: its reads are left to the caller, who bounds the
        silence between them (``relay.copy``: one timer per stream, not aiohttp's ``sock_read``
        re-armed per read); ``timeout`` bounds connecting. An OpenAI-wire provider opens the
        stream and hands over the response's own reads (``Body.of_response``: a failure up to the
        answer's status raises here), one that translates its generator (failures on a read)."""
        ...


def parse_retry_after(value: str | None, now: Callable[[], float] = time.time) -> float | None:
    """Seconds from a ``Retry-After`` header: delta-seconds or an HTTP-date (RFC 9110 §10.2.3; a
    date already past is 0); None when absent or unusable."""
    if not value:
        return None
    try:
        seconds = float(value)
    except ValueError:
        return _seconds_until(value, now())
    return seconds if seconds >= 0 else None  # NaN fails the comparison too


def _seconds_until(date: str, now: float) -> float | None:
    try:
        when = email.utils.parsedate_to_datetime(date)
    except (TypeError, ValueError, IndexError):
        return None
    if when.tzinfo is None:  # the asctime form carries no zone: HTTP dates are GMT
        when = when.replace(tzinfo=datetime.UTC)
    return max(0.0, when.timestamp() - now)


def content_of(completion: dict[str, Any]) -> str:
    """The assistant text of a ``chat.completion``; raise ``ProviderError(malformed)`` if none."""
    try:
        content = completion["choices"][0]["message"]["content"]
    except (KeyError, IndexError, TypeError) as exc:
        raise ProviderError("malformed", "the provider answer has no choices[0].message") from exc
    return content if isinstance(content, str) else ""


def finish_reason_of(completion: dict[str, Any]) -> str | None:
    """``choices[0].finish_reason`` of a ``chat.completion`` ("length": cut at the token limit)."""
    try:
        reason = completion["choices"][0]["finish_reason"]
    except (KeyError, IndexError, TypeError):
        return None
    return reason if isinstance(reason, str) else None


async def relay_from_complete(
    provider: Provider, body: dict[str, Any], model: str, ctx: CallInfo, timeout: float
) -> Relayed:
    """``relay`` for providers that do not speak the OpenAI wire format natively."""
    try:
        async with asyncio.timeout(timeout):
            reply = await provider.complete(body, model, ctx, timeout)
    except TimeoutError as exc:
        raise ProviderError(
            "timeout", f"{provider.config.name}/{model} gave no full answer within {timeout:g}s"
        ) from exc
    return Relayed(orjson.dumps(reply), reply)
