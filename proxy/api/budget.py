"""The in-flight request-body budget: bytes of bodies held at once, buffered and parsed,
across all requests.

One ``--max-body-bytes`` body is harmless; many at once are not: a parsed JSON value costs far
more than its bytes (see ``parse_cost``). Each request reserves what its body will cost before
reading it (``Content-Length`` when given, chunk by chunk otherwise; for a body to be parsed,
its copies included) and the cost of its values once read, before parsing;
everything is released when the handler is done. A request that does not fit waits at most
``BUDGET_WAIT_S`` for others to finish, then gets 503 with ``Retry-After``; a body that alone
costs more than the whole budget gets 413 at once. Bodies streamed through to a provider
(uploads) are never buffered and do not count.
"""

from __future__ import annotations

import asyncio
from collections import deque

from aiohttp import web

from proxy.api.errors import ApiError

BUDGET_WAIT_S = 2.0
"""How long a request waits for budget: long enough to ride out a burst of large bodies
finishing, short enough that a client is told to come back instead of hanging."""
RETRY_AFTER_S = 1
READ_COPIES = 2
"""Reading a body holds its chunks and their joined copy at once."""
PARSED_BYTES_PER_TOKEN = 128
"""Resident bytes a parsed JSON value costs per ``,`` or ``:`` in its text (each separates one
value or one key). Measured (peak RSS while orjson parses 10 MB, CPython 3.11): 87 bytes per
token for ``{"k000001": 1, ...}`` (16.6x its bytes), 85 for ``[{}, {}, ...]`` (30x), 96 for chat
messages, 113 for ``{"key_000001": "value_0001", ...}``; 128 covers each with a margin. Strings
cost their bytes: counted in ``parse_cost``'s own term."""
PARSED_COPIES = 2
"""Besides the per-token cost, a parsed body holds its strings (about its length) and is written
out again once (the upstream request or the rendered prompt). Measured: one 10 MB chat message
took 42 MB of peak RSS through passthrough (4x: 2 read + 2 parsed)."""


def values_cost(raw: bytes) -> int:
    """What the values of ``raw`` cost once parsed, beyond ``PARSED_COPIES`` of its bytes."""
    return (raw.count(b",") + raw.count(b":") + 1) * PARSED_BYTES_PER_TOKEN


class BodyBudget:
    """Bytes reserved by request bodies in flight; waiters are served first come, first served."""

    def __init__(self, capacity: int, wait_s: float = BUDGET_WAIT_S) -> None:
        if capacity <= 0:
            raise ValueError(f"the body budget must be positive, not {capacity}")
        self.capacity = capacity
        self.wait_s = wait_s
        self.in_use = 0
        self._waiters: deque[tuple[int, asyncio.Future[None]]] = deque()

    async def acquire(self, size: int) -> None:
        """Reserve ``size`` bytes: 413 if it can never fit, 503 if it does not fit in time."""
        if size > self.capacity:
            raise _too_costly(size, self.capacity)
        if not self._waiters and self.in_use + size <= self.capacity:
            self.in_use += size
            return
        granted: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        entry = (size, granted)
        self._waiters.append(entry)
        try:
            await asyncio.wait_for(asyncio.shield(granted), self.wait_s)
        except BaseException as exc:
            if granted.done():  # granted while timing out or being cancelled: give it back
                self.release(size)
            else:
                self._waiters.remove(entry)
                granted.cancel()
                self._wake()  # a big waiter leaving the head may unblock smaller ones
            if isinstance(exc, TimeoutError):
                raise ApiError(
                    503,
                    "The proxy is holding as many request bodies as its memory budget allows; retry shortly",
                    "server_error",
                    "body_budget_exhausted",
                    headers={"Retry-After": str(RETRY_AFTER_S)},
                ) from None
            raise

    def acquire_now(self, size: int) -> bool:
        """``acquire`` when ``size`` fits now and nobody waits: True; False: await ``acquire``."""
        if self._waiters or self.in_use + size > self.capacity:
            return False
        self.in_use += size
        return True

    def release(self, size: int) -> None:
        self.in_use -= size
        self._wake()

    def _wake(self) -> None:
        while self._waiters and self.in_use + self._waiters[0][0] <= self.capacity:
            size, granted = self._waiters.popleft()
            self.in_use += size
            granted.set_result(None)


def _too_costly(size: int, capacity: int) -> ApiError:
    return ApiError(
        413,
        f"Request body too costly: holding it would take about {size} bytes of memory, more "
        f"than this proxy's whole in-flight body budget ({capacity} bytes)",
        code="request_too_large",
    )


class Reservation:
    """One request's share of the budget; released whole when the request ends."""

    def __init__(self, budget: BodyBudget) -> None:
        self.budget = budget
        self.held = 0

    async def grow(self, size: int) -> None:
        """Reserve ``size`` more bytes; 413 when the request alone would exceed the budget."""
        if self.held + size > self.budget.capacity:
            raise _too_costly(self.held + size, self.budget.capacity)
        if size > 0:
            await self.budget.acquire(size)
            self.held += size

    def grow_now(self, size: int) -> bool:
        """``grow`` without awaiting when the budget has room now: True; False: await ``grow``
        (which waits its turn, or refuses)."""
        if size <= 0:
            return True
        if self.held + size > self.budget.capacity or not self.budget.acquire_now(size):
            return False
        self.held += size
        return True

    def release(self) -> None:
        held, self.held = self.held, 0
        if held:
            self.budget.release(held)


BUDGET = web.AppKey("body_budget", BodyBudget)
