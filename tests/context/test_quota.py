"""Per-client quotas in the context store (issue 26.8): one client's writes evict only its own
oldest entries, in memory and in Redis; persistent items count; evictions are counted."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from proxy.clients import ClientIdentity
from proxy.context.identity import Identity, namespace_of
from proxy.context.store import CLIENT_QUOTA, STORE_FULL, ClientQuota, MemoryContextStore
from proxy.module.context_spec import TTL_PERSISTENT
from tests.context.helpers import REDIS_URL, execute
from tests.context.test_cache import REVIEW, cached_policy, metric, review_answer
from tests.fake_upstream import FakeUpstream
from tests.proxy_server import UPSTREAM_KEY, UPSTREAM_KEY_ENV, running_proxy

BIG = 900_000
"""Each of Bob's answers: about 0.9 MB, under the cache's 1 MiB entry bound."""
KEYS = {"sk-alice-q": ClientIdentity("alice"), "sk-bob-q": ClientIdentity("bob")}


def big_answer(i: int) -> str:
    return json.dumps(
        {
            "ok": True,
            "meta": {"confidence": 0.9, "risk": "low", "explain": "e"},
            "data": {"issues": [], "summary": f"{i}" + "x" * BIG, "verdict": "approve", "rationale": "r"},
        }
    )


def key(client: str, name: str) -> str:
    return Identity(namespace_of(client)).key(name)


@pytest.mark.parametrize("store", ["memory", "redis"])
async def test_bobs_40_large_answers_do_not_evict_alices_cached_answer(
    fake_upstream: FakeUpstream, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, store: str, redis_db: Any
) -> None:
    monkeypatch.setenv(UPSTREAM_KEY_ENV, UPSTREAM_KEY)
    extra: dict[str, Any] = {"redis_url": REDIS_URL} if store == "redis" else {}
    async with running_proxy(
        tmp_path, cached_policy(fake_upstream), api_keys=frozenset(KEYS), client_identities=KEYS, **extra
    ) as px:
        alice, bob = {"Authorization": "Bearer sk-alice-q"}, {"Authorization": "Bearer sk-bob-q"}
        fake_upstream.script("cheap", review_answer())
        status, headers, _ = await execute(px.url, "code-reviewer", REVIEW, alice)
        assert (status, headers["X-Cognitive-Cache"]) == (200, "miss")
        for i in range(40):
            fake_upstream.script("cheap", big_answer(i))
            status, headers, _ = await execute(px.url, "code-reviewer", {**REVIEW, "code": f"x = {i}"}, bob)
            assert (status, headers["X-Cognitive-Cache"]) == (200, "miss")
        if store == "redis":  # the writes reach Redis through the outbox, in order: wait for the last
            for _ in range(200):
                if len(await redis_db.keys(key("bob", "cache") + "*")) <= 9:
                    break
        calls = fake_upstream.count("/v1/chat/completions")
        status, headers, _ = await execute(px.url, "code-reviewer", REVIEW, alice)
        assert (status, headers["X-Cognitive-Cache"]) == (200, "hit")
        assert fake_upstream.count("/v1/chat/completions") == calls
        assert await metric(px, 'cognitive_context_evictions_total{reason="client_quota"}') >= 31
        if store == "redis":
            bobs = await redis_db.keys(f"cogproxy:ctx:{{{namespace_of('bob')}}}:*")
            assert 1 <= len(bobs) <= 9  # 8 MiB of 0.9 MB answers: Bob keeps his newest only
            assert await redis_db.keys(f"cogproxy:ctx:{{{namespace_of('alice')}}}:*")


async def test_a_client_at_exactly_its_quota_keeps_everything_and_one_more_evicts_its_oldest() -> None:
    reasons: list[str] = []
    store = MemoryContextStore(on_evict=reasons.append)
    quota = ClientQuota(max_entries=3, max_bytes=30)
    ns = namespace_of("bob")
    await store.put(key("alice", "a"), b"a" * 10, 60, quota=quota)
    for i in range(3):
        await store.put(key("bob", f"b{i}"), b"b" * 10, TTL_PERSISTENT if i == 0 else 60, quota=quota)
    assert store.client_usage(ns) == (3, 30) and reasons == []  # at the limit: nothing goes
    await store.put(key("bob", "b3"), b"b" * 10, 60, quota=quota)  # one more: its oldest goes
    assert await store.get(key("bob", "b0")) is None  # persistent items count and go too
    assert store.client_usage(ns) == (3, 30) and reasons == [CLIENT_QUOTA]
    await store.put(key("bob", "big"), b"b" * 30, 60, quota=quota)  # exactly its bytes: alone
    assert store.client_usage(ns) == (1, 30)
    await store.put(key("bob", "huge"), b"b" * 31, 60, quota=quota)  # past it alone: not stored
    assert await store.get(key("bob", "huge")) is None
    assert await store.get(key("alice", "a")) == b"a" * 10  # never touched


async def test_a_full_memory_store_takes_from_the_client_holding_the_most() -> None:
    reasons: list[str] = []
    store = MemoryContextStore(max_bytes=100, on_evict=reasons.append)
    await store.put(key("alice", "a"), b"a" * 10, 60)
    for i in range(10):
        await store.put(key("bob", f"b{i}"), b"b" * 10, 60)
    assert await store.get(key("alice", "a")) == b"a" * 10  # alice is older, bob holds more
    assert reasons == [STORE_FULL] and store.client_usage(namespace_of("bob")) == (9, 90)
