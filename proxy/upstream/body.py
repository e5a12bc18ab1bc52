"""An upstream answer's body as the relays read it (``relay.first_chunk``, ``relay.copy``).

``read`` gives the next bytes as they arrive, b"" at the end. For an answer relayed as the
upstream sent it, ``read`` is the response's own ``readany``: no generator between the socket's
reads and the copy (each layer is a coroutine resumed per chunk). A provider that translates
(Anthropic, offline) hands its generator over (``of_chunks``).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from functools import partial

import aiohttp
from yarl import URL

from proxy.upstream.base import ProviderError
from proxy.upstream.http import transport_error

__all__ = ["READ_ERRORS", "Body"]

READ_ERRORS = (TimeoutError, aiohttp.ClientError)
"""What a response's own ``readany`` raises when the answer breaks (``Body.failure`` types it)."""


async def _no_close() -> None:
    return None


@dataclass(frozen=True, slots=True)
class Body:
    """``read()``: the next bytes, b"" at the end (a source never gives an empty chunk before it).
    A read that breaks raises a ``ProviderError``, or, for a response read directly, one of
    ``READ_ERRORS``, which ``failure`` types. ``close()`` lets the answer's connection go."""

    read: Callable[[], Awaitable[bytes]]
    close: Callable[[], Awaitable[None]] = _no_close
    url: URL | None = None
    """The response read directly (named in a broken read's message)."""

    @classmethod
    def of_response(cls, resp: aiohttp.ClientResponse, *, wait_for_close: bool = True) -> Body:
        """``resp``'s body, read with its ``readany``; ``close`` releases it (and, by default,
        waits for the request's sending to end, as leaving ``session.post``'s block does)."""

        async def close() -> None:
            resp.release()
            if wait_for_close:
                await resp.wait_for_close()

        return cls(resp.content.readany, close, resp.url)

    @classmethod
    def of_chunks(cls, chunks: AsyncIterator[bytes]) -> Body:
        """A generator's chunks (its errors already ``ProviderError``); ``close`` closes it."""
        aclose: Callable[[], Awaitable[None]] | None = getattr(chunks, "aclose", None)
        return cls(partial(anext, chunks, b""), aclose or _no_close)

    def failure(self, exc: BaseException) -> ProviderError:
        """One of ``READ_ERRORS`` of a direct read as the typed error a broken answer is."""
        return transport_error(exc, self.url or URL(), 0.0)
