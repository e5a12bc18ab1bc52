"""The keys a module call reads before its answer, known up front, and read all at once (#32).

A call reads its stored context (``proxy.context.builder.stored_reads``) and its result-cache
entry (``proxy.context.cache.cache_key``); both keys follow from the module, the caller's identity
and the input alone (``planned_reads``, pure). The module-call service sends them with the limits
check, in its round trip; the pipeline then reads them from a ``ReadThrough`` store, which reads
whatever was not read ahead (a composite's steps, a call whose limits are not in Redis) in one
``get_many``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from proxy.context import cache
from proxy.context.builder import stored_reads
from proxy.context.identity import (
    CONTEXT_FIELD,
    IdentityError,
    call_identity,
    client_digest,
    input_hash,
    without_context,
)
from proxy.context.step import CallerContext
from proxy.context.store import ClientQuota, ContextStore, ContextUnavailable
from proxy.jsonshape import deeper_than
from proxy.module.model import Module
from proxy.policy.model import Policy


@dataclass(frozen=True, slots=True)
class Prefetched:
    """What the limits check read of a call's keys: the values (None for an absent key) or the
    error that kept them from being read, and this replica's writes of those keys still pending
    when the read was sent (they win over what Redis answered)."""

    keys: tuple[str, ...]
    read: Mapping[str, bytes | None] | BaseException
    pending: Mapping[str, bytes]


def planned_reads(module: Module, value: Any, call: CallerContext, policy: Policy) -> tuple[str, ...]:
    """The keys ``module``'s call on ``value`` reads from the context store before its answer:
    its stored context, then its result-cache entry. None for a composite (its steps read their
    own), nor for an input the context step refuses."""
    if module.is_composite or not isinstance(value, dict) or deeper_than(value):
        return ()
    sent = value.get(CONTEXT_FIELD)
    if sent is not None and not isinstance(sent, dict):
        return ()
    sent = sent or {}
    try:
        identity = call_identity(call.identity, sent)
    except IdentityError:
        return ()
    keys = [key for key, _ in stored_reads(module.context, identity).values()]
    if not call.bypass_cache and cache.rule_for(policy, module) is not None:
        bare = without_context(value)
        keys.append(cache.cache_key(identity, module, input_hash(bare), client_digest(sent)))
    return tuple(keys)


class ReadThrough:
    """A ``ContextStore`` that answers keys read ahead from what was read, each once (a later read
    of the key, after a step wrote it, goes to the store); any other key from the store."""

    def __init__(self, store: ContextStore) -> None:
        self.store = store
        self._held: dict[str, bytes | None] = {}
        self._unavailable: set[str] = set()
        self._primed = False

    def hold(self, prefetched: Prefetched) -> None:
        """What was read of the call's keys with the limits check (an exception: the store could
        not answer), overlaid with the writes pending when the read was sent."""
        keys, read, pending = prefetched.keys, prefetched.read, prefetched.pending
        if isinstance(read, BaseException):
            self._unavailable.update(k for k in keys if k not in pending)
            self._held.update(pending)
        else:
            self._held.update({**read, **pending})
        self._primed = True

    def take_primed(self) -> bool:
        """True once, when ``hold`` read the first call's keys (the pipeline reads no more)."""
        primed, self._primed = self._primed, False
        return primed

    async def fetch(self, keys: Sequence[str]) -> None:
        """Read ``keys`` not read yet in one ``get_many`` (one round trip to Redis)."""
        missing = [k for k in dict.fromkeys(keys) if k not in self._held and k not in self._unavailable]
        if not missing:
            return
        pending = self.store.pending(missing)
        try:
            read = await self.store.get_many(missing)
        except ContextUnavailable:
            self._unavailable.update(k for k in missing if k not in pending)
            read = {}
        self._held.update({**read, **pending})

    async def get(self, key: str) -> bytes | None:
        if key in self._held:
            return self._held.pop(key)
        if key in self._unavailable:
            self._unavailable.discard(key)
            raise ContextUnavailable("the context store could not answer the read ahead")
        return await self.store.get(key)

    async def get_many(self, keys: Sequence[str]) -> dict[str, bytes | None]:
        await self.fetch(keys)
        return {key: await self.get(key) for key in keys}

    def pending(self, keys: Iterable[str]) -> dict[str, bytes]:
        return self.store.pending(keys)

    async def put(
        self, key: str, value: bytes, ttl: int, *, wait: bool = True, quota: ClientQuota | None = None
    ) -> None:
        self._held.pop(key, None)
        self._unavailable.discard(key)
        await self.store.put(key, value, ttl, wait=wait, quota=quota)

    async def aclose(self) -> None:
        return None  # the app owns the store


async def read_ahead(module: Module, value: Any, call: CallerContext | None, policy: Policy) -> None:
    """Read the keys of ``module``'s call in one round trip, unless they were read with the
    limits check (the call's store is a ``ReadThrough``; any other store is read key by key)."""
    if call is None or not isinstance(call.store, ReadThrough) or call.store.take_primed():
        return
    keys = planned_reads(module, value, call, policy)
    if keys:
        await call.store.fetch(keys)
