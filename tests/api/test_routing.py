"""The router end to end: failover, retries, breakers, deadlines, re-ask, escalation causes."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from proxy.api.app_keys import ROUTER
from tests.conftest import ProxyWith
from tests.fake_upstream import DROP, FakeUpstream, Fault
from tests.proxy_server import (
    RunningProxy,
    cognitive_of,
    record_router_sleeps,
    running_proxy,
    upstream_policy,
)

REVIEW_INPUT = {"code": "def f(x):\n    return x\n", "language": "python"}


def answer(confidence: float = 0.9, risk: str = "low") -> str:
    return json.dumps(
        {
            "ok": True,
            "meta": {"confidence": confidence, "risk": risk, "explain": "e"},
            "data": {"issues": [], "summary": "s", "verdict": "approve", "rationale": "r"},
        }
    )


def routing_policy(fake: FakeUpstream, **failover: Any) -> dict[str, Any]:
    policy = upstream_policy(fake)
    policy["ladder"] = [
        {"name": "fast", "targets": ["up/cheap", "up/backup"]},
        {"name": "strong", "targets": ["up/strong"]},
    ]
    policy["failover"] = {
        "retries": 0,
        "backoff": {"base_ms": 1, "max_ms": 5},
        "timeout": {"per_try_s": 2, "total_s": 10},
        "circuit_breaker": {"consecutive_failures": 2, "window_s": 10, "open_s": 1},
        **failover,
    }
    return policy


@pytest.fixture
def policy(fake_upstream: FakeUpstream) -> dict[str, Any]:
    """What the ``proxy`` fixture serves here: two targets in the first rung, a strong second rung."""
    return routing_policy(fake_upstream)


async def execute(
    px: RunningProxy, module: str = "code-reviewer"
) -> tuple[int, dict[str, Any], dict[str, Any]]:
    async with aiohttp.ClientSession() as session:
        resp = await session.post(px.base + f"/modules/{module}/execute", json={"input": REVIEW_INPUT})
        body = await resp.json()
        return resp.status, dict(resp.headers), body


async def attempts_of(px: RunningProxy) -> tuple[list[tuple[str, str]], dict[str, str]]:
    raw = await px.client().chat.completions.with_raw_response.create(
        model="module:code-reviewer", messages=[{"role": "user", "content": json.dumps(REVIEW_INPUT)}]
    )
    cognitive = cognitive_of(raw.parse())
    return [(a["target"], a["outcome"]) for a in cognitive["attempts"]], dict(raw.headers)


@pytest.mark.parametrize(
    "fault", [Fault.http(500), Fault.http(503), DROP, Fault.slow(5)], ids=["500", "503", "dropped", "timeout"]
)
async def test_provider_failure_fails_over_to_the_next_target_in_the_rung(
    fake_upstream: FakeUpstream, tmp_path: Path, fault: Fault
) -> None:
    policy = routing_policy(fake_upstream, timeout={"per_try_s": 0.5, "total_s": 10})
    fake_upstream.script("cheap", fault)
    fake_upstream.script("backup", answer())
    async with running_proxy(tmp_path, policy) as px:
        attempts, headers = await attempts_of(px)
    kind = {"500": "server_error", "503": "server_error", "drop": "connect", "slow": "timeout"}[
        fault.kind if fault.kind != "status" else str(fault.status)
    ]
    assert attempts == [("up/cheap", f"provider_error:{kind}"), ("up/backup", "accept")]
    assert headers["x-cognitive-decision"] == "accept"  # still the first rung: not an escalation
    assert headers["x-cognitive-model"] == "up/backup"


async def test_retries_on_the_same_target_with_retry_after(
    fake_upstream: FakeUpstream, proxy_with: ProxyWith, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake_upstream.script("cheap", Fault.http(429, retry_after=1), answer())
    async with proxy_with(routing_policy(fake_upstream, retries=2)) as px:
        sleeps = record_router_sleeps(px, monkeypatch)
        attempts, _ = await attempts_of(px)
    assert attempts == [("up/cheap", "provider_error:rate_limited"), ("up/cheap", "accept")]
    # Retry-After (longer than the 5 ms backoff), plus jitter of up to max_ms (5 ms), never less
    assert len(sleeps.waits) == 1 and 1.0 <= sleeps.waits[0] <= 1.005
    assert fake_upstream.count(model="backup") == 0


async def test_retry_after_longer_than_the_deadline_fails_over_instead_of_waiting(
    fake_upstream: FakeUpstream, proxy_with: ProxyWith, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake_upstream.script("cheap", Fault.http(429, retry_after=30))
    fake_upstream.script("backup", answer())
    async with proxy_with(routing_policy(fake_upstream, retries=2)) as px:
        sleeps = record_router_sleeps(px, monkeypatch)
        attempts, _ = await attempts_of(px)
    assert sleeps.waits == []
    assert attempts == [("up/cheap", "provider_error:rate_limited"), ("up/backup", "accept")]


TRY_BUDGET = re.compile(r"within ([0-9.]+)s$")


def try_budget(error: str) -> float:
    """The seconds the router granted a try that timed out, as its attempt's error reports them."""
    found = TRY_BUDGET.search(error)
    assert found, error
    return float(found[1])


async def test_total_deadline_is_never_exceeded(fake_upstream: FakeUpstream, proxy_with: ProxyWith) -> None:
    for model in ("cheap", "backup", "strong"):
        fake_upstream.script(model, Fault.slow(5))
    per_try_s, total_s = 0.6, 1.0
    policy = routing_policy(fake_upstream, retries=3, timeout={"per_try_s": per_try_s, "total_s": total_s})
    async with proxy_with(policy) as px:
        raw = await px.client().chat.completions.with_raw_response.create(
            model="module:code-reviewer", messages=[{"role": "user", "content": json.dumps(REVIEW_INPUT)}]
        )
    cognitive = cognitive_of(raw.parse())
    envelope = json.loads(raw.parse().choices[0].message.content or "")
    # The deadline ran out while a target was still answering: E2002, an outcome (not E4001/503).
    assert raw.status_code == 200 and envelope["error"]["code"] == "E2002"
    assert "retry-after" not in raw.headers
    timeouts = [a for a in cognitive["attempts"] if a["outcome"] == "provider_error:timeout"]
    # What the router granted the tries, as each attempt reports it: never past the total deadline.
    budgets = [try_budget(a["error"]) for a in timeouts]
    assert (timeouts[0]["target"], budgets[0]) == ("up/cheap", per_try_s)
    assert all(b <= per_try_s for b in budgets) and sum(budgets) <= total_s, budgets


class FrozenClock:
    """The breakers' clock, injected: stands still until the test moves it."""

    def __init__(self) -> None:
        self.now = time.time()

    def __call__(self) -> float:
        return self.now


async def test_breaker_opens_skips_the_target_and_recovers(
    proxy: RunningProxy, fake_upstream: FakeUpstream, monkeypatch: pytest.MonkeyPatch
) -> None:
    clock = FrozenClock()
    opened_at = clock.now
    monkeypatch.setattr(proxy.app[ROUTER].breakers, "_clock", clock)
    fake_upstream.script("cheap", Fault.http(500), Fault.http(500))
    fake_upstream.set_default_reply("backup", json.loads(answer()))
    fake_upstream.set_default_reply("cheap", json.loads(answer()))
    for _ in range(2):  # two failures in the window open cheap's breaker
        attempts, _ = await attempts_of(proxy)
        assert attempts[0] == ("up/cheap", "provider_error:server_error")
    attempts, _ = await attempts_of(proxy)
    assert attempts == [("up/cheap", "circuit_open"), ("up/backup", "accept")]
    assert fake_upstream.count(model="cheap") == 2
    clock.now = opened_at + 0.999  # open_s (1) has not passed: still open
    attempts, _ = await attempts_of(proxy)
    assert attempts == [("up/cheap", "circuit_open"), ("up/backup", "accept")]
    clock.now = opened_at + 1.0  # open_s passed -> half-open: one trial goes through and closes it
    attempts, _ = await attempts_of(proxy)
    assert attempts == [("up/cheap", "accept")]
    attempts, _ = await attempts_of(proxy)
    assert attempts == [("up/cheap", "accept")]
    assert fake_upstream.count(model="cheap") == 4


async def test_contract_failures_escalate_but_never_trip_the_breaker(
    proxy: RunningProxy, fake_upstream: FakeUpstream
) -> None:
    fake_upstream.set_default_reply("cheap", "this is not JSON at all")
    fake_upstream.set_default_reply("strong", json.loads(answer()))
    for _ in range(3):
        attempts, headers = await attempts_of(proxy)
        assert attempts == [("up/cheap", "escalate"), ("up/strong", "accept")]
        assert headers["x-cognitive-decision"] == "escalated"
    assert fake_upstream.count(model="cheap") == 3  # never skipped
    assert fake_upstream.count(model="backup") == 0  # never failed over inside the rung


async def test_schema_failure_escalates(proxy: RunningProxy, fake_upstream: FakeUpstream) -> None:
    bad = json.loads(answer())
    bad["data"]["verdict"] = 42
    fake_upstream.script("cheap", json.dumps(bad))
    fake_upstream.script("strong", answer())
    raw = await proxy.client().chat.completions.with_raw_response.create(
        model="module:code-reviewer", messages=[{"role": "user", "content": json.dumps(REVIEW_INPUT)}]
    )
    first = cognitive_of(raw.parse())["attempts"][0]
    assert first["error"] == "contract:E3001" and first["confidence"] == 0.0
    assert raw.headers["x-cognitive-decision"] == "escalated"


async def test_reask_sends_the_validation_errors_to_the_same_target(
    fake_upstream: FakeUpstream, tmp_path: Path
) -> None:
    policy = routing_policy(fake_upstream)
    policy["tiers"]["decision"]["reask"] = 1
    bad = json.loads(answer())
    del bad["data"]["rationale"]
    fake_upstream.script("cheap", json.dumps(bad), answer(0.85))
    async with running_proxy(tmp_path, policy) as px:
        attempts, headers = await attempts_of(px)
    assert attempts == [("up/cheap", "reask"), ("up/cheap", "accept")]
    assert headers["x-cognitive-decision"] == "accept"
    followup = fake_upstream.requests[1].json["messages"]
    assert followup[-2]["role"] == "assistant" and followup[-1]["role"] == "user"
    assert "data.rationale: is required" in followup[-1]["content"]


async def test_passthrough_fails_over_inside_the_alias_rung(
    proxy: RunningProxy, fake_upstream: FakeUpstream
) -> None:
    fake_upstream.script("cheap", DROP)
    fake_upstream.script("backup", "from backup")
    reply = await proxy.client().chat.completions.create(
        model="gpt-4o-mini", messages=[{"role": "user", "content": "hi"}]
    )
    assert reply.choices[0].message.content == "from backup"
    stream_fault = Fault.http(503)
    fake_upstream.script("cheap", stream_fault)
    fake_upstream.script("backup", "streamed from backup")
    stream = await proxy.client().chat.completions.create(
        model="gpt-4o-mini", messages=[{"role": "user", "content": "hi"}], stream=True
    )
    text = "".join([c.choices[0].delta.content or "" async for c in stream if c.choices])
    assert text == "streamed from backup"


async def test_passthrough_never_escalates_on_content(
    proxy: RunningProxy, fake_upstream: FakeUpstream
) -> None:
    fake_upstream.script("cheap", answer(0.1, "high"))
    reply = await proxy.client().chat.completions.create(
        model="gpt-4o-mini", messages=[{"role": "user", "content": "hi"}]
    )
    assert json.loads(reply.choices[0].message.content or "")["meta"]["confidence"] == 0.1
    assert fake_upstream.count(model="strong") == 0
