"""The context pieces on their own: the store's TTL (injected clock) and bounds, sanitisation,
manifest errors, key patterns, merging, and context writes through the Redis outbox."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from proxy.context.builder import history_of, merge
from proxy.context.identity import Identity, expand, input_hash, namespace_of
from proxy.context.sanitise import MAX_STRING_CHARS, NameMatcher, sanitise
from proxy.context.store import MemoryContextStore
from proxy.module.context_spec import TTL_PERSISTENT
from proxy.module.loader import ModuleLoadError, load_module
from proxy.state.outbox import KeyWrite, RedisOutbox
from proxy.state.redis_client import RedisOptions
from tests.conftest import write_module
from tests.context.helpers import REDIS_URL


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


async def test_items_expire_after_their_ttl_by_the_injected_clock() -> None:
    clock = Clock()
    store = MemoryContextStore(clock=clock)
    await store.put("a", b"1", 60)
    await store.put("p", b"2", TTL_PERSISTENT)
    await store.put("r", b"3", 0)  # request-scoped: never stored
    clock.now += 59.9
    assert await store.get("a") == b"1"
    clock.now += 0.1
    assert await store.get("a") is None
    clock.now += 10**9
    assert await store.get("p") == b"2"
    assert await store.get("r") is None
    assert len(store) == 1


async def test_the_memory_store_is_bounded_and_evicts_least_recently_used() -> None:
    store = MemoryContextStore(max_bytes=30, max_entries=100)
    for key in "abc":
        await store.put(key, b"x" * 10, 60)
    assert await store.get("a") == b"x" * 10  # a is now the most recently used
    await store.put("d", b"y" * 10, 60)
    assert await store.get("b") is None and await store.get("a") is not None
    assert store.size_bytes <= 30
    await store.put("huge", b"z" * 31, 60)  # larger than the whole store: not kept
    assert await store.get("huge") is None
    small = MemoryContextStore(max_bytes=10**6, max_entries=2)
    for key in "abc":
        await small.put(key, b"v", 60)
    assert len(small) == 2 and await small.get("a") is None


async def test_overwriting_a_key_keeps_the_byte_count_exact() -> None:
    store = MemoryContextStore()
    await store.put("a", b"x" * 100, 60)
    await store.put("a", b"x" * 10, 60)
    assert store.size_bytes == 10


def test_sanitise_redacts_names_and_credential_values_and_reports_paths() -> None:
    value = {
        "session_state": {
            "password": "p",
            "sessionToken": "t",
            "api_key": "k",
            "max_tokens": 5,
            "keyboard": "qwerty",
            "notes": "use sk-abcdefghijklmnop please",
            "nested": [{"Authorization": "Bearer abc"}],
        }
    }
    clean = sanitise(value)
    state = clean.value["session_state"]
    assert state["password"] == state["sessionToken"] == state["api_key"] == "[REDACTED]"
    assert (state["max_tokens"], state["keyboard"]) == (5, "qwerty")
    assert state["notes"] == "use [REDACTED] please"
    assert state["nested"] == [{"Authorization": "[REDACTED]"}]
    assert "_context.session_state.password" in clean.redacted
    assert "_context.session_state.notes" in clean.redacted
    assert all("sk-" not in path for path in clean.redacted)


def test_sanitise_names_are_configurable() -> None:
    matcher = NameMatcher(("ssn",))
    clean = sanitise({"user_profile": {"ssn": "123", "locale": "en", "password": "x"}}, matcher)
    # Configured names add to what the log redaction always treats as secret.
    assert clean.value["user_profile"] == {"ssn": "[REDACTED]", "locale": "en", "password": "[REDACTED]"}


def test_sanitise_truncates_long_strings_and_deep_nesting() -> None:
    clean = sanitise({"session_state": {"text": "a" * (MAX_STRING_CHARS + 5)}})
    assert clean.value["session_state"]["text"].startswith("a" * MAX_STRING_CHARS)
    assert len(clean.value["session_state"]["text"]) < MAX_STRING_CHARS + 20
    deep: Any = "leaf"
    for _ in range(100):
        deep = [deep]
    assert "leaf" not in str(sanitise({"x": deep}).value)


def test_input_hash_ignores_context_and_key_order() -> None:
    assert input_hash({"a": 1, "b": 2}) == input_hash({"b": 2, "a": 1, "_context": {"x": 1}})
    assert input_hash({"a": 1}) != input_hash({"a": 2})


def test_key_patterns_need_the_ids_they_name() -> None:
    who = Identity(namespace_of("k"), "s1", None)
    assert expand("${module}:${input_hash}", who, "m", "h") == "m:h"
    assert expand("${session_id}:state", who, "m", "h") == "s1:state"
    assert expand("${user_id}:profile", who, "m", "h") is None
    assert namespace_of("k") != namespace_of("k2") and "k" not in who.key("x").split(":")[2:3]


def test_client_context_wins_field_by_field() -> None:
    built = {"session_state": {"a": 1, "b": 2}, "previous_result": {"data": 1}}
    client = {"session_state": {"b": 3}, "previous_result": "given"}
    assert merge(built, client) == {"session_state": {"a": 1, "b": 3}, "previous_result": "given"}


def test_history_keeps_the_newest_turns_as_role_and_content() -> None:
    messages = [{"role": "user", "content": str(i), "name": "x"} for i in range(4)] + [
        {"role": "tool", "content": "t"}
    ]
    assert history_of(messages, 2) == [{"role": "user", "content": "2"}, {"role": "user", "content": "3"}]


@pytest.mark.parametrize(
    ("context", "named"),
    [
        ({"accepts": [{"type": "session_state", "schema": "missing.json"}]}, "context.accepts[0].schema"),
        ({"accepts": [{"type": "session_state", "schema": "../../etc/passwd"}]}, "context.accepts[0].schema"),
        ({"accepts": [{"type": "previous_result"}]}, "context.accepts[0].from_module"),
        ({"accepts": [{"type": "x"}, {"type": "x"}]}, "context.accepts[1].type"),
        ({"accepts": [{"type": "x", "requred": True}]}, "context.accepts[0].requred"),
        ({"emits": [{"type": "x", "key_pattern": "${tenant}:x"}]}, "context.emits[0].key_pattern"),
        ({"emits": [{"type": "x", "schema": "bad.json"}]}, "context.emits[0].schema"),
        ({"mode": "parallel"}, "context.mode"),
    ],
)
def test_manifest_errors_name_the_module_and_key(tmp_path: Path, context: dict[str, Any], named: str) -> None:
    path = write_module(tmp_path, "ctxmod", manifest={"context": context})
    (path / "bad.json").write_text('{"type": 5}')
    with pytest.raises(ModuleLoadError) as info:
        load_module(path)
    assert named in str(info.value)
    assert "ctxmod" in str(info.value)


async def test_context_writes_go_through_the_outbox_and_its_spool(tmp_path: Path) -> None:
    import redis.asyncio as aioredis

    client: Any = aioredis.Redis.from_url(REDIS_URL, decode_responses=True)
    await client.delete("cogproxy:ctx:test:a", "cogproxy:ctx:test:b")
    dead = RedisOutbox(RedisOptions("redis://127.0.0.1:1/0"), spool_dir=tmp_path)
    dead.put_key(KeyWrite("cogproxy:ctx:test:a", '{"v": 1}', 60))
    dead.put_key(KeyWrite("cogproxy:ctx:test:b", '{"v": 2}', None))
    await dead.aclose(timeout=0)
    outbox = RedisOutbox(RedisOptions(REDIS_URL), spool_dir=tmp_path)  # replays the spool
    outbox.start()
    delivered = outbox.put_key(KeyWrite("cogproxy:ctx:test:c", "3", 5))
    assert delivered is not None
    assert await asyncio.wait_for(delivered, 5) is True
    try:
        assert await client.get("cogproxy:ctx:test:a") == '{"v": 1}'
        assert 0 < await client.ttl("cogproxy:ctx:test:a") <= 60
        assert await client.ttl("cogproxy:ctx:test:b") == -1
    finally:
        await outbox.aclose()
        await client.delete("cogproxy:ctx:test:a", "cogproxy:ctx:test:b", "cogproxy:ctx:test:c")
        await client.aclose()
