"""The keys a module call reads, known before it runs (``planned_reads``), and the store that
answers them from one read ahead (``ReadThrough``): each value once, this replica's pending writes
over what Redis answered, a read Redis could not answer "not available"."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import pytest

from proxy.context import cache
from proxy.context.builder import build
from proxy.context.identity import Identity, client_digest, input_hash, namespace_of
from proxy.context.prefetch import Prefetched, ReadThrough, planned_reads
from proxy.context.step import CallerContext, prepare
from proxy.context.store import ContextUnavailable, MemoryContextStore
from proxy.module.model import Module
from proxy.policy.loader import parse_policy
from proxy.policy.model import Policy
from tests.conftest import ModuleFactory

STATEFUL = {
    "accepts": [
        {"type": "session_state", "required": False},
        {"type": "previous_result", "from_module": "mod1", "required": False},
    ]
}
WHO = Identity(namespace_of("sk-test"), "s1")


def policy_caching(module: str) -> Policy:
    return parse_policy(
        {
            "version": 1,
            "providers": {"offline": {"kind": "offline"}},
            "ladder": [{"name": "r", "targets": ["offline/m"]}],
            "cache": {"modules": {module: {"ttl_s": 60}}},
        }
    )


class Recording(MemoryContextStore):
    """A memory store that records the keys read and answers ``pending`` from a dict."""

    def __init__(self) -> None:
        super().__init__()
        self.read: list[str] = []
        self.in_flight: dict[str, bytes] = {}

    async def get(self, key: str) -> bytes | None:
        self.read.append(key)
        return await super().get(key)

    async def get_many(self, keys: Sequence[str]) -> dict[str, bytes | None]:
        self.read.extend(keys)
        return {key: await MemoryContextStore.get(self, key) for key in keys}

    def pending(self, keys: Iterable[str]) -> dict[str, bytes]:
        return {k: self.in_flight[k] for k in keys if k in self.in_flight}


class Down(Recording):
    async def get_many(self, keys: Sequence[str]) -> dict[str, bytes | None]:
        raise ContextUnavailable("down")


async def _read_by_the_call(module: Module, value: Any, policy: Policy) -> list[str]:
    """The keys the context step and the cache lookup read for ``value``, in order."""
    store = Recording()
    call = CallerContext(store, WHO)
    prepared = await prepare(module, value, call)
    assert prepared.identity is not None
    digest = prepared.client_digest
    await cache.lookup(
        store, cache.cache_key(prepared.identity, module, prepared.input_hash, digest), "v", ""
    )
    return store.read


@pytest.mark.parametrize(
    "value",
    [
        {"code": "x"},
        {"code": "x", "_context": {"session_state": {"a": 1}}},
        {"code": "x", "_context": {"session_id": "from-body"}},
    ],
)
async def test_the_planned_reads_are_the_keys_the_call_reads(make_module: ModuleFactory, value: Any) -> None:
    module = make_module(context=STATEFUL)
    policy = policy_caching(module.name)
    planned = planned_reads(module, value, CallerContext(MemoryContextStore(), WHO), policy)
    assert sorted(planned) == sorted(await _read_by_the_call(module, value, policy))
    assert len(planned) == 3  # session_state, previous_result, the cache entry


def test_a_refused_context_plans_no_reads_and_a_bypassed_cache_reads_no_entry(
    make_module: ModuleFactory,
) -> None:
    module = make_module(context=STATEFUL)
    policy = policy_caching(module.name)
    call = CallerContext(MemoryContextStore(), WHO)
    assert planned_reads(module, {"code": "x", "_context": [1]}, call, policy) == ()
    assert planned_reads(module, {"code": "x", "_context": {"session_id": "a b"}}, call, policy) == ()
    bypass = CallerContext(MemoryContextStore(), WHO, bypass_cache=True)
    assert len(planned_reads(module, {"code": "x"}, bypass, policy)) == 2  # the context only


def test_the_cache_key_holds_what_the_caller_sent_not_what_the_store_holds() -> None:
    assert client_digest({"session_id": "s"}) == ""  # the session id alone is no context
    assert client_digest({"a": 1, "b": 2}) == client_digest({"b": 2, "a": 1})
    assert client_digest({"a": 1}) != client_digest({"a": 2})
    assert input_hash({"code": "x", "_context": {"a": 1}}) == input_hash({"code": "x"})


async def test_an_entry_decided_for_another_context_is_a_miss() -> None:
    store = MemoryContextStore()
    entry = cache.Entry("v", {"ok": True}, None, {}, None, context="abc")
    await cache.save(store, "k", entry, 60)
    assert await cache.lookup(store, "k", "v", "abc") == entry
    assert await cache.lookup(store, "k", "v", "other") is None


async def test_held_values_answer_once_and_pending_writes_win() -> None:
    store = Recording()
    await store.put("a", b"redis", 60)
    through = ReadThrough(store)
    through.hold(Prefetched(("a", "b"), {"a": b"redis", "b": None}, {"b": b"written here"}))
    assert (await through.get("a"), await through.get("b")) == (b"redis", b"written here")
    assert store.read == []  # both from the read ahead
    assert await through.get("a") == b"redis" and store.read == ["a"]  # a second read: the store


async def test_a_read_ahead_redis_could_not_answer_is_not_available_but_pending_writes_are() -> None:
    through = ReadThrough(Recording())
    through.hold(Prefetched(("a", "b"), ConnectionError("down"), {"b": b"mine"}))
    with pytest.raises(ContextUnavailable):
        await through.get("a")
    assert await through.get("b") == b"mine"
    down = Down()
    down.in_flight["p"] = b"pending"
    fetched = ReadThrough(down)
    await fetched.fetch(["p", "q"])
    assert await fetched.get("p") == b"pending"
    with pytest.raises(ContextUnavailable):
        await fetched.get("q")


async def test_a_write_through_the_store_replaces_what_was_read_ahead() -> None:
    store = Recording()
    through = ReadThrough(store)
    through.hold(Prefetched(("a",), {"a": b"old"}, {}))
    await through.put("a", b"new", 60)
    assert await through.get("a") == b"new"


async def test_fetch_reads_only_what_was_not_read_ahead_in_one_read() -> None:
    store = Recording()
    through = ReadThrough(store)
    through.hold(Prefetched(("a",), {"a": None}, {}))
    assert through.take_primed() and not through.take_primed()
    await through.fetch(["a", "b", "c", "b"])
    assert store.read == ["b", "c"]


async def test_the_builder_reads_from_the_read_ahead(make_module: ModuleFactory) -> None:
    module = make_module(context=STATEFUL)
    store = Recording()
    through = ReadThrough(store)
    key = WHO.key("s1", "session_state")
    through.hold(Prefetched((key,), {key: b'{"n": 1}'}, {}))
    built = await build(module.context, WHO, through, ())
    assert built.context["session_state"] == {"n": 1}
    assert key not in store.read
