"""The suite's polling helper (tests/support/polling.py): it returns the first ready value, and a
wait that ends says what was awaited and the last value seen."""

from __future__ import annotations

import itertools

import pytest

from tests.support.polling import eventually, has, settled, until, wait_sync


async def test_eventually_returns_the_first_ready_value() -> None:
    counter = itertools.count()

    async def probe() -> int:
        return next(counter)

    assert await eventually(probe, "three", ready=lambda n: n >= 3, step=0) == 3


async def test_a_wait_that_ends_names_what_was_awaited_and_the_last_value() -> None:
    async def probe() -> list[str]:
        return ["a", "b"]

    with pytest.raises(AssertionError, match=r"the alias served: not within 0.01 s; last seen: \['a', 'b'\]"):
        await eventually(probe, "the alias served", ready=has("c"), timeout=0.01, step=0)


async def test_ignored_errors_are_retried_and_shown_others_fail_at_once() -> None:
    async def refused() -> bool:
        raise ConnectionRefusedError("nobody listens")

    with pytest.raises(AssertionError, match="last seen: ConnectionRefusedError: nobody listens"):
        await eventually(refused, "ready", timeout=0.01, step=0, ignore=(ConnectionError,))
    with pytest.raises(ConnectionRefusedError):
        await eventually(refused, "ready", timeout=10, ignore=(TimeoutError,))


async def test_until_polls_a_plain_callable() -> None:
    seen = iter([0, 0, 2])
    assert await until(lambda: next(seen), "a count", step=0) == 2


async def test_settled_hands_back_the_last_value_at_the_deadline() -> None:
    async def probe() -> int:
        return 1

    assert await settled(probe, ready=lambda n: n > 1, timeout=0.01, step=0) == 1


def test_wait_sync_returns_the_value_or_gives_up_at_once_with_the_reason() -> None:
    values = iter([None, "up"])
    assert wait_sync(lambda: next(values), "up", step=0) == "up"
    with pytest.raises(AssertionError, match="the server: it exited 1; last seen: False"):
        wait_sync(lambda: False, "the server", timeout=60, give_up=lambda: "it exited 1")
