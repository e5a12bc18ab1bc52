"""Failover under independent faults: 16 concurrent clients through a served proxy against the fake
upstream, the policy's default breaker, retries and budget. Prints the figures of issue #11 finding 4
(success rate, attempts per request, breaker transitions); run with ``-s`` to see them."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from structlog.testing import capture_logs

from tests.fake_upstream import UNAVAILABLE, FakeUpstream, FaultMix
from tests.proxy_server import UPSTREAM_KEY, UPSTREAM_KEY_ENV, running_proxy, upstream_policy

CONCURRENCY = 16
REQUESTS = 600
GOAL = 0.99
MIN_REQUESTS = 20  # the default circuit_breaker.min_requests
SEED = 11
RETRY_BUDGET_PERCENT = 100


def chaos_policy(fake: FakeUpstream) -> dict[str, Any]:
    """Two providers in one rung; retries, backoff and the breaker default. The retry budget is
    lifted: at 30% failures retries are ~40% of the attempts in flight, and the default budget (20%
    of requests in flight: its job is to stop retry storms) turns the retries it refuses into
    failures (98.5% success with it, measured; the breaker stays closed either way)."""
    policy = upstream_policy(fake)
    for name in ("a", "b"):
        policy["providers"][name] = {
            "kind": "openai",
            "base_url": fake.openai_base,
            "api_key_env": UPSTREAM_KEY_ENV,
        }
    policy["ladder"] = [{"name": "main", "targets": ["a/m-a", "b/m-b"]}]
    policy["aliases"] = {}
    policy["failover"] = {
        "timeout": {"per_try_s": 5, "total_s": 30},
        "retry_budget": {"percent": RETRY_BUDGET_PERCENT},
    }
    return policy


@dataclass
class LoadResult:
    requests: int
    ok: int
    attempts: int
    transitions: int
    statuses: dict[int, int]

    @property
    def success_rate(self) -> float:
        return self.ok / self.requests

    def report(self, label: str) -> str:
        return (
            f"{label}: {self.ok}/{self.requests} succeeded ({self.success_rate:.1%}), "
            f"{self.attempts / self.requests:.2f} attempts/request, {self.transitions} breaker transitions, "
            f"statuses {dict(sorted(self.statuses.items()))}"
        )


async def load(url: str, fake: FakeUpstream, requests: int = REQUESTS) -> LoadResult:
    """``requests`` chat completions, ``CONCURRENCY`` at a time; breaker transitions from the log."""
    statuses: dict[int, int] = {}
    queue: asyncio.Queue[int] = asyncio.Queue()
    for i in range(requests):
        queue.put_nowait(i)
    before = fake.count("/v1/chat/completions")

    async def client(session: aiohttp.ClientSession) -> None:
        while not queue.empty():
            queue.get_nowait()
            body = {"model": "main", "messages": [{"role": "user", "content": "hi"}]}
            async with session.post(url + "/v1/chat/completions", json=body) as resp:
                await resp.read()
                statuses[resp.status] = statuses.get(resp.status, 0) + 1

    with capture_logs() as logs:
        async with aiohttp.ClientSession(headers={"Authorization": "Bearer sk-client"}) as session:
            await asyncio.gather(*(client(session) for _ in range(CONCURRENCY)))
    transitions = sum(1 for e in logs if e["event"] in ("proxy.breaker_opened", "proxy.breaker_closed"))
    return LoadResult(
        requests, statuses.get(200, 0), fake.count("/v1/chat/completions") - before, transitions, statuses
    )


@pytest.fixture
async def chaos(
    fake_upstream: FakeUpstream, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[tuple[str, FakeUpstream]]:
    monkeypatch.setenv(UPSTREAM_KEY_ENV, UPSTREAM_KEY)
    async with running_proxy(tmp_path, chaos_policy(fake_upstream)) as px:
        yield px.url, fake_upstream


@pytest.mark.parametrize("rate", [0.1, 0.3])
async def test_independent_503s_on_every_provider_keep_99_percent_success(
    chaos: tuple[str, FakeUpstream], rate: float
) -> None:
    url, fake = chaos
    fake.set_fault_mix("m-a", FaultMix(((UNAVAILABLE, rate),), seed=SEED))
    fake.set_fault_mix("m-b", FaultMix(((UNAVAILABLE, rate),), seed=SEED + 1))
    result = await load(url, fake)
    print("\n" + result.report(f"{rate:.0%} independent 503s on both providers"))
    assert result.success_rate >= GOAL, result.report("")
    assert result.transitions == 0, result.report("")


async def test_a_provider_failing_every_request_is_skipped_within_min_requests_calls(
    chaos: tuple[str, FakeUpstream],
) -> None:
    url, fake = chaos
    fake.set_fault_mix("m-a", FaultMix(((UNAVAILABLE, 1.0),)))
    result = await load(url, fake)
    dead_calls = fake.count("/v1/chat/completions", model="m-a")
    print("\n" + result.report("provider a answers 503 to everything") + f"; a called {dead_calls} times")
    assert result.success_rate == 1.0, result.report("")
    # Requests already admitted when the breaker opens may still finish their try on a.
    assert dead_calls <= MIN_REQUESTS + CONCURRENCY, dead_calls
    assert result.transitions == 1, result.report("")
