"""Prices, cost and savings; limits and budgets per client, team and globally; /v1/usage."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from contextlib import AbstractAsyncContextManager
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import redis.asyncio as aioredis
import yaml

from proxy.api.limits import estimate_body_tokens
from proxy.clients import read_identities
from tests.api.test_routing import REVIEW_INPUT, answer, routing_policy
from tests.fake_upstream import FakeUpstream
from tests.proxy_server import (
    UPSTREAM_KEY,
    UPSTREAM_KEY_ENV,
    RunningProxy,
    cognitive_of,
    free_port,
    proxy_process,
    running_proxy,
)
from tests.support.polling import eventually
from tests.support.redis_db import fresh_db
from tests.support.redis_server import redis_url

REDIS_URL = redis_url(14)
CHEAP = {"input_per_mtok": 1.0, "output_per_mtok": 2.0}
STRONG = {"input_per_mtok": 10.0, "output_per_mtok": 30.0}
KEYS = "sk-alice name=alice team=search\nsk-bob name=bob team=search\n# a comment\nsk-old\n"


def priced(fake: FakeUpstream, limits: dict[str, Any] | None = None) -> dict[str, Any]:
    policy = routing_policy(fake)
    policy["prices"] = {"up/cheap": CHEAP, "up/strong": STRONG}
    if limits is not None:
        policy["limits"] = limits
    return policy


def keyed_proxy(
    tmp_path: Path, policy: dict[str, Any], **settings: Any
) -> AbstractAsyncContextManager[RunningProxy]:
    """The proxy with the keys file ``KEYS`` (alice and bob, with names and teams) as its clients."""
    keys = tmp_path / "keys"
    keys.write_text(KEYS)
    identities = read_identities(keys)
    return running_proxy(
        tmp_path, policy, api_keys=frozenset(identities), client_identities=identities, **settings
    )


def usd(price: dict[str, float], usage: dict[str, int]) -> float:
    return (
        usage["prompt_tokens"] * price["input_per_mtok"]
        + usage["completion_tokens"] * price["output_per_mtok"]
    ) / 1e6


def metric(text: str, name: str, **labels: str) -> float:
    total = 0.0
    for line in text.splitlines():
        if line.startswith((name + "{", name + " ")) and all(f'{k}="{v}"' in line for k, v in labels.items()):
            total += float(line.rsplit(" ", 1)[1])
    return total


@pytest.fixture(autouse=True)
def _upstream_key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(UPSTREAM_KEY_ENV, UPSTREAM_KEY)


@pytest.fixture
async def redis_db() -> AsyncIterator[aioredis.Redis]:
    async with fresh_db(14, match="{cogproxy:limits}:*") as client:
        yield client


async def post_module(session: aiohttp.ClientSession, base: str, key: str) -> aiohttp.ClientResponse:
    resp = await session.post(
        base + "/v1/modules/code-reviewer/execute",
        json={"input": REVIEW_INPUT},
        headers={"Authorization": f"Bearer {key}"},
    )
    await resp.read()
    return resp


async def test_savings_counter_equals_a_hand_computation_on_a_scripted_escalation_sequence(
    fake_upstream: FakeUpstream, tmp_path: Path
) -> None:
    # accepted on cheap, accepted on cheap, escalated cheap -> strong
    fake_upstream.script("cheap", answer(0.9), answer(0.95), answer(0.2))
    fake_upstream.script("strong", answer(0.9))
    async with (
        keyed_proxy(
            tmp_path,
            priced(fake_upstream),
        ) as px,
        aiohttp.ClientSession() as session,
    ):
        calls = []
        for _ in range(3):
            raw = await px.client("sk-alice").chat.completions.with_raw_response.create(
                model="module:code-reviewer", messages=[{"role": "user", "content": json.dumps(REVIEW_INPUT)}]
            )
            cognitive = cognitive_of(raw.parse())
            calls.append((cognitive, raw.headers))
        metrics = await (await session.get(px.url + "/metrics")).text()
    attempts = [[(a["target"], a["usage"]) for a in c["attempts"]] for c, _ in calls]
    assert [[t for t, _ in a] for a in attempts] == [["up/cheap"], ["up/cheap"], ["up/cheap", "up/strong"]]
    (u0,), (u1,), (u2, u3) = ([u for _, u in a] for a in attempts)
    expected = [usd(CHEAP, u0), usd(CHEAP, u1), usd(CHEAP, u2) + usd(STRONG, u3)]
    for (cognitive, headers), want in zip(calls, expected, strict=True):
        assert float(headers["X-Cognitive-Cost-Usd"]) == pytest.approx(want, abs=1e-9)
        assert cognitive["cost"]["usd"] == pytest.approx(want, abs=1e-9)
    assert calls[2][0]["cost"]["escalated_usd"] == pytest.approx(usd(CHEAP, u2), abs=1e-9)
    assert float(calls[2][1]["X-Cognitive-Escalated-Cost-Usd"]) == pytest.approx(usd(CHEAP, u2), abs=1e-9)
    savings = (usd(STRONG, u0) - usd(CHEAP, u0)) + (usd(STRONG, u1) - usd(CHEAP, u1))
    lost = usd(CHEAP, u2)  # the escalated call cost its cheap attempt more than the top rung alone
    assert savings > 0
    assert metric(metrics, "cognitive_savings_usd_total", module="code-reviewer") == pytest.approx(savings)
    assert metric(metrics, "cognitive_savings_lost_usd_total", module="code-reviewer") == pytest.approx(lost)
    assert metric(metrics, "cognitive_cost_usd_total", client="alice") == pytest.approx(sum(expected))
    assert "sk-alice" not in metrics


def chat(model: str = "gpt-4o-mini") -> dict[str, Any]:
    return {"model": model, "messages": [{"role": "user", "content": "hello there"}]}


async def post_chat(session: aiohttp.ClientSession, base: str, key: str) -> aiohttp.ClientResponse:
    resp = await session.post(
        base + "/v1/chat/completions", json=chat(), headers={"Authorization": f"Bearer {key}"}
    )
    await resp.read()
    return resp


async def test_60_rpm_shared_by_two_replicas_admits_60(
    fake_upstream: FakeUpstream, tmp_path: Path, redis_db: aioredis.Redis
) -> None:
    keys = tmp_path / "keys"
    keys.write_text(KEYS)
    policy = tmp_path / "policy.yaml"
    policy.write_text(yaml.safe_dump(priced(fake_upstream, {"clients": {"alice": {"rpm": 60}}})))
    # a generous limits timeout: under load a check past the default 250 ms would fall back to
    # each replica's local window (60 each) and admit all 80, which is not what this test is about
    args = (
        *("--policy", str(policy), "--api-keys-file", str(keys)),
        *("--redis-url", REDIS_URL, "--redis-limits-timeout", "5"),
    )
    env = {UPSTREAM_KEY_ENV: UPSTREAM_KEY}
    async with (
        proxy_process(*args, env=env) as one,
        proxy_process(*args, env=env) as two,
        aiohttp.ClientSession() as session,
    ):
        replies = await asyncio.gather(
            *(post_chat(session, (one, two)[i % 2].url, "sk-alice") for i in range(80))
        )
        other = await post_chat(session, one.url, "sk-bob")  # bob has no limit
    statuses = [r.status for r in replies]
    assert 58 <= statuses.count(200) <= 62
    assert statuses.count(200) + statuses.count(429) == 80
    refused = next(r for r in replies if r.status == 429)
    assert int(refused.headers["Retry-After"]) >= 1
    assert refused.headers["x-ratelimit-limit-requests"] == "60"
    assert refused.headers["x-ratelimit-remaining-requests"] == "0"
    assert refused.headers["x-ratelimit-reset-requests"].endswith("s")
    ok = next(r for r in replies if r.status == 200)
    assert ok.headers["x-ratelimit-limit-requests"] == "60"
    assert other.status == 200 and "x-ratelimit-limit-requests" not in other.headers


async def test_a_short_window_slides_and_admits_again(
    fake_upstream: FakeUpstream, tmp_path: Path, redis_db: aioredis.Redis
) -> None:
    limits = {"clients": {"default": {"rpm": 3}}, "window_s": 1}
    async with (
        keyed_proxy(
            tmp_path,
            priced(fake_upstream, limits),
            redis_url=REDIS_URL,
        ) as px,
        aiohttp.ClientSession() as session,
    ):
        statuses = [(await post_chat(session, px.url, "sk-bob")).status for _ in range(4)]
        assert statuses == [200, 200, 200, 429]
        await eventually(
            lambda: post_chat(session, px.url, "sk-bob"),
            "the window sliding",
            ready=lambda r: r.status != 429,
        )


async def test_token_and_spend_budgets_stop_a_client_with_the_right_headers(
    fake_upstream: FakeUpstream, tmp_path: Path, redis_db: aioredis.Redis
) -> None:
    limits = {"clients": {"alice": {"tpm": 120}, "bob": {"usd_per_day": 0.00005}}}
    async with (
        keyed_proxy(
            tmp_path,
            priced(fake_upstream, limits),
            redis_url=REDIS_URL,
            admin_keys=frozenset({"sk-admin"}),
        ) as px,
        aiohttp.ClientSession() as session,
    ):
        remaining = []
        for _ in range(20):
            resp = await post_chat(session, px.url, "sk-alice")
            if resp.status != 200:
                break
            assert resp.headers["x-ratelimit-limit-tokens"] == "120"
            remaining.append(int(resp.headers["x-ratelimit-remaining-tokens"]))
        assert resp.status == 429 and len(remaining) >= 2
        assert remaining == sorted(remaining, reverse=True)
        error = json.loads(await resp.read())["error"]
        assert error["code"] == "rate_limit_exceeded" and error["type"] == "tokens"
        assert int(resp.headers["Retry-After"]) >= 1
        assert int(resp.headers["x-ratelimit-remaining-tokens"]) < 120
        # the token window is corrected by the reported usage, not left at the estimate
        usage = await (
            await session.get(px.url + "/v1/usage?client=alice", headers={"Authorization": "Bearer sk-admin"})
        ).json()
        (window,) = usage["windows"]
        assert window["kind"] == "tokens" and window["remaining"] < 120

        spent = 0
        for _ in range(50):
            resp = await post_chat(session, px.url, "sk-bob")
            if resp.status != 200:
                break
            spent += 1
        assert spent >= 1 and resp.status == 429
        body = json.loads(await resp.read())
        assert body["error"]["code"] == "budget_exceeded"
        assert int(resp.headers["Retry-After"]) >= 1
        usage = await (
            await session.get(px.url + "/v1/usage?client=bob", headers={"Authorization": "Bearer sk-admin"})
        ).json()
        day = next(b for b in usage["budgets"] if b["period"] == "day")
        assert day["exceeded"] is True and day["spent_usd"] >= 0.00005


async def test_on_budget_downgrade_caps_the_ladder(
    fake_upstream: FakeUpstream, tmp_path: Path, redis_db: aioredis.Redis
) -> None:
    limits = {
        "clients": {"alice": {"usd_per_day": 0.000001}},
        "on_budget": "downgrade",
        "downgrade_to": "fast",
    }
    fake_upstream.script("cheap", answer(0.2), answer(0.2))
    fake_upstream.script("strong", answer(0.9))
    async with keyed_proxy(
        tmp_path,
        priced(fake_upstream, limits),
        redis_url=REDIS_URL,
    ) as px:
        client = px.client("sk-alice")
        cognitives = []
        for _ in range(2):
            raw = await client.chat.completions.with_raw_response.create(
                model="module:code-reviewer", messages=[{"role": "user", "content": json.dumps(REVIEW_INPUT)}]
            )
            cognitives.append(cognitive_of(raw.parse()))
    first, second = cognitives
    assert [a["target"] for a in first["attempts"]] == ["up/cheap", "up/strong"]
    assert first["cost"]["downgraded"] is False
    # over budget now: the call stays on the cheap rung though its answer is weak
    assert [a["target"] for a in second["attempts"]] == ["up/cheap"]
    assert second["cost"]["downgraded"] is True
    assert second["decision"] == "review"  # the decision tier's exhausted action on the capped top


async def test_redis_down_falls_back_to_local_windows_and_says_so(
    fake_upstream: FakeUpstream, tmp_path: Path
) -> None:
    dead = f"redis://127.0.0.1:{free_port()}/0"
    async with (
        keyed_proxy(
            tmp_path,
            priced(fake_upstream, {"clients": {"default": {"rpm": 10}}}),
            redis_url=dead,
            replicas_hint=2,
        ) as px,
        aiohttp.ClientSession() as session,
    ):
        statuses = [(await post_chat(session, px.url, "sk-alice")).status for _ in range(7)]
        metrics = await (await session.get(px.url + "/metrics")).text()
    assert statuses == [200] * 5 + [429] * 2  # this replica's share: 10 / 2
    assert metric(metrics, "cognitive_limits_degraded") == 1.0


async def test_usage_needs_an_admin_key(fake_upstream: FakeUpstream, tmp_path: Path) -> None:
    async with (
        keyed_proxy(
            tmp_path,
            priced(fake_upstream, {"clients": {"default": {"rpm": 10}}}),
            admin_keys=frozenset({"sk-admin"}),
        ) as px,
        aiohttp.ClientSession() as session,
    ):
        url = px.url + "/v1/usage?client=alice"
        assert (await session.get(url)).status == 401
        assert (await session.get(url, headers={"Authorization": "Bearer sk-alice"})).status == 403
        assert (
            await session.get(
                px.url + "/v1/usage?client=nobody", headers={"Authorization": "Bearer sk-admin"}
            )
        ).status == 404
        resp = await session.get(url, headers={"Authorization": "Bearer sk-admin"})
        assert resp.status == 200
        body = await resp.json()
        assert body["client"] == "alice" and body["team"] == "search"
        assert body["windows"][0]["remaining"] == 10  # reading does not count
        # the admin key is not a client key
        assert (await post_chat(session, px.url, "sk-admin")).status == 401


async def test_passthrough_routes_count_against_the_request_window(
    fake_upstream: FakeUpstream, tmp_path: Path
) -> None:
    async with (
        keyed_proxy(
            tmp_path,
            priced(fake_upstream, {"clients": {"default": {"rpm": 2}}}),
        ) as px,
        aiohttp.ClientSession() as session,
    ):
        replies = []
        for path, body in (
            ("/v1/embeddings", {"model": "text-embedding-3-small", "input": "hi"}),
            ("/v1/responses", {"model": "gpt-4o-mini", "input": "hi"}),
            ("/v1/embeddings", {"model": "text-embedding-3-small", "input": "hi"}),
        ):
            resp = await session.post(px.url + path, json=body, headers={"Authorization": "Bearer sk-alice"})
            await resp.read()
            replies.append(resp)
    assert [r.status for r in replies] == [200, 200, 429]
    # the proxy's window replaces the provider's own x-ratelimit-* headers
    assert replies[0].headers["x-ratelimit-limit-requests"] == "2"
    assert replies[0].headers["x-ratelimit-remaining-requests"] == "1"
    assert replies[1].headers["x-ratelimit-remaining-requests"] == "0"


async def test_inputs_too_deep_to_estimate_are_refused_as_before_with_limits_on(
    fake_upstream: FakeUpstream, tmp_path: Path
) -> None:
    deep: Any = "x"
    for _ in range(400):
        deep = {"a": deep}
    limits = {"clients": {"default": {"rpm": 100, "tpm": 100000}}}
    async with (
        running_proxy(tmp_path, priced(fake_upstream, limits)) as px,
        aiohttp.ClientSession() as session,
    ):
        resp = await session.post(px.url + "/v1/modules/code-reviewer/execute", json={"input": deep})
        assert resp.status == 400 and (await resp.json())["error"]["code"] == "E1001"
    # passthrough chat: the estimate of a body too deep to serialise is 0, not a crash (the
    # provider call itself still fails on it: see the report)
    assert estimate_body_tokens({"messages": [{"role": "user", "content": deep}], "max_tokens": 7}) == 7


async def test_a_streamed_module_call_over_its_limit_is_a_429_not_a_broken_stream(
    fake_upstream: FakeUpstream, tmp_path: Path
) -> None:
    fake_upstream.script("cheap", answer(0.9))
    async with (
        running_proxy(tmp_path, priced(fake_upstream, {"clients": {"default": {"rpm": 1}}})) as px,
        aiohttp.ClientSession() as session,
    ):
        replies = []
        for _ in range(2):
            resp = await session.post(
                px.url + "/v1/modules/code-reviewer/execute",
                json={"input": REVIEW_INPUT},
                headers={"Accept": "text/event-stream"},
            )
            replies.append((resp.status, resp.headers.copy(), await resp.read()))
    (first_status, first_headers, first_body), (status, headers, body) = replies
    assert first_status == 200 and first_headers["Content-Type"].startswith("text/event-stream")
    assert first_headers["x-ratelimit-remaining-requests"] == "0"
    assert b"event: final" in first_body
    refused = json.loads(body)  # a module route: the spec's envelope, E4002
    assert status == 429 and refused["ok"] is False and refused["error"]["code"] == "E4002", refused
    assert int(headers["Retry-After"]) >= 1
