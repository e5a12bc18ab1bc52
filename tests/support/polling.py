"""Waiting for something another task, process or server does in its own time: the suite's one
polling helper, in three forms.

* :func:`eventually` polls an async probe (a scrape, a Redis read, an HTTP call);
* :func:`until` polls a plain callable from async code (a counter on a fake, a file);
* :func:`wait_sync` polls a plain callable from sync code, blocking (a port, a subprocess);
* :func:`settled` polls like :func:`eventually` but hands back the last value at the deadline,
  for a caller whose own assertion explains more.

Each stops when ``ready(value)`` holds (truthiness by default) and returns that value; past the
deadline it fails with ``what`` and the last value seen (or the last error a probe raised that
``ignore`` names). A probe error not in ``ignore`` fails the test at once. The deadline is a
bound on a condition, never a measurement: the tests assert what happened, not how fast.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Container
from typing import Any, TypeVar

T = TypeVar("T")

DEFAULT_TIMEOUT_S = 5.0
DEFAULT_STEP_S = 0.05
SHOWN_CHARS = 300
"""How much of the last value a failure quotes (a scraped /metrics page is long)."""


def _truthy(value: object) -> bool:
    return bool(value)


def has(item: object) -> Callable[[Container[Any]], bool]:
    """``ready=has("brand-new")``: the value (a list, a scraped page) contains ``item``."""
    return lambda value: item in value


class _Last:
    """The last value (or ignored error) a probe gave, for the failure message."""

    def __init__(self) -> None:
        self.text = "nothing: the probe never answered"

    def saw(self, value: object) -> None:
        self.text = repr(value)[:SHOWN_CHARS]

    def failed(self, error: BaseException) -> None:
        self.text = f"{type(error).__name__}: {error}"[:SHOWN_CHARS]

    def check(self, what: str, timeout: float, late: bool, reason: str | None) -> None:
        """Fail naming ``what`` and the last value when waiting is over."""
        if reason is not None:
            raise AssertionError(f"{what}: {reason}; last seen: {self.text}")
        if late:
            raise AssertionError(f"{what}: not within {timeout} s; last seen: {self.text}")


async def eventually(
    probe: Callable[[], Awaitable[T]],
    what: str,
    *,
    ready: Callable[[T], bool] = _truthy,
    timeout: float = DEFAULT_TIMEOUT_S,
    step: float = DEFAULT_STEP_S,
    ignore: tuple[type[BaseException], ...] = (),
) -> T:
    """Await ``probe()`` every ``step`` seconds until ``ready`` holds for its value; return it.
    To stop waiting at once (the process being waited for exited), let ``probe`` raise."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    last = _Last()
    while True:
        try:
            value = await probe()
        except ignore as error:
            last.failed(error)
        else:
            if ready(value):
                return value
            last.saw(value)
        last.check(what, timeout, loop.time() >= deadline, None)
        await asyncio.sleep(step)


async def settled(
    probe: Callable[[], Awaitable[T]],
    *,
    ready: Callable[[T], bool] = _truthy,
    timeout: float = DEFAULT_TIMEOUT_S,
    step: float = DEFAULT_STEP_S,
) -> T:
    """The first value of ``probe()`` that is ``ready``, or the last one at the deadline: for a
    caller whose own assertion on it says more than "not within N s"."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not ready(value := await probe()) and loop.time() < deadline:
        await asyncio.sleep(step)
    return value


async def until(
    condition: Callable[[], T],
    what: str,
    *,
    ready: Callable[[T], bool] = _truthy,
    timeout: float = DEFAULT_TIMEOUT_S,
    step: float = DEFAULT_STEP_S,
) -> T:
    """:func:`eventually` for a plain callable, read between sleeps of the event loop."""

    async def probe() -> T:
        return condition()

    return await eventually(probe, what, ready=ready, timeout=timeout, step=step)


def wait_sync(
    probe: Callable[[], T],
    what: str,
    *,
    ready: Callable[[T], bool] = _truthy,
    timeout: float = DEFAULT_TIMEOUT_S,
    step: float = DEFAULT_STEP_S,
    ignore: tuple[type[BaseException], ...] = (),
    give_up: Callable[[], str | None] = lambda: None,
) -> T:
    """Call ``probe()`` every ``step`` seconds (blocking) until ``ready`` holds; return the value.
    ``give_up``: a reason to stop waiting at once (the process being waited for exited)."""
    deadline = time.monotonic() + timeout
    last = _Last()
    while True:
        try:
            value = probe()
        except ignore as error:
            last.failed(error)
        else:
            if ready(value):
                return value
            last.saw(value)
        last.check(what, timeout, time.monotonic() >= deadline, give_up())
        time.sleep(step)
