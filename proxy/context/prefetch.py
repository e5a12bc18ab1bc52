"""The keys a module call reads before its answer, known up front, and read all at once (#32).

A call reads its stored context (``proxy.context.builder.stored_reads``) and its result-cache
entry (``proxy.context.cache.cache_key``); both keys follow from the module, the caller's identity
and the input alone (``planned_reads``, pure). The module-call service sends them with the limits
check, in its round trip; the pipeline then reads them from a ``ReadThrough`` store, which reads
whatever was not read ahead (a composite's steps, a call whose limits are not in Redis) in one
``get_many``.

A session call on a store shared by replicas (Redis) also adds its pending-write mark in that round
trip (``proxy.context.store.Mark``) and reads the session's marks alive before its own: when
another replica's is among them, a write of that session may be in flight, and the call re-reads
its keys until that mark is gone, at most the context timeout (``wait_for_writes``). The call's
session writes then need not wait for Redis's acknowledgement before the answer (``put``); the
mark is removed after them, through the outbox (``release``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from proxy.context import cache
from proxy.context.builder import stored_reads
from proxy.context.identity import (
    CONTEXT_FIELD,
    Identity,
    IdentityError,
    call_identity,
    client_digest,
    input_hash,
    without_context,
)
from proxy.context.step import CallerContext
from proxy.context.store import (
    ClientQuota,
    ContextStore,
    ContextUnavailable,
    Mark,
    SessionMarks,
    marks_of,
)
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
    mark: Mark | None = None
    """The session call's pending-write mark sent with the read (its set's live marks in ``read``
    under its key when it was added)."""


def planned_identity(module: Module, value: Any, call: CallerContext) -> Identity | None:
    """Whose keys ``module``'s call on ``value`` reads: the caller's identity with the input's
    ``_context`` ids. None for a composite (its steps read their own), or an input the context
    step refuses."""
    if module.is_composite or not isinstance(value, dict) or deeper_than(value):
        return None
    sent = value.get(CONTEXT_FIELD)
    if sent is not None and not isinstance(sent, dict):
        return None
    try:
        return call_identity(call.identity, sent or {})
    except IdentityError:
        return None


def planned_reads(module: Module, value: Any, call: CallerContext, policy: Policy) -> tuple[str, ...]:
    """The keys ``module``'s call on ``value`` reads from the context store before its answer:
    its stored context, then its result-cache entry. None for a composite (its steps read their
    own), nor for an input the context step refuses."""
    identity = planned_identity(module, value, call)
    if identity is None:
        return ()
    sent = value.get(CONTEXT_FIELD) or {}
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
        self._mark: Mark | None = None
        self._sent = False
        """The mark went out with a read (removed at ``release`` whatever that read answered)."""
        self._marked = False
        """Redis answered the read that added the mark: it is there."""
        self._alive: frozenset[str] = frozenset()
        self._marked_keys: tuple[str, ...] = ()

    def plan_mark(self, identity: Identity | None, *, sent: bool = False) -> Mark | None:
        """The pending-write mark this call's first read adds (None: no session, a store of one
        process, or a mark planned already); ``sent``: the caller sends it (with the limits
        check), else ``fetch`` does."""
        marks = self.store.marks()
        if self._mark is None and identity is not None and marks is not None:
            self._mark = marks.mark(identity)
            self._sent = sent and self._mark is not None
            return self._mark
        return None

    def hold(self, prefetched: Prefetched) -> None:
        """What was read of the call's keys with the limits check (an exception: the store could
        not answer), overlaid with the writes pending when the read was sent."""
        keys, read, pending = prefetched.keys, prefetched.read, prefetched.pending
        if prefetched.mark is not None:
            self._mark, self._sent = prefetched.mark, True
        if isinstance(read, BaseException):
            self._unavailable.update(k for k in keys if k not in pending)
            self._held.update(pending)
        else:
            self._held.update({**self._take_marks(dict(read), keys), **pending})
        self._primed = True

    def _take_marks(self, read: dict[str, bytes | None], keys: Sequence[str]) -> dict[str, bytes | None]:
        if self._mark is not None and self._mark.key in read:
            self._alive, self._marked, self._marked_keys = marks_of(read, self._mark), True, tuple(keys)
        return read

    async def wait_for_writes(self) -> None:
        """When the read that added the mark saw another replica's mark, re-read those keys until
        it is gone (at most the context timeout): that replica answered a call of the session
        whose writes may not have reached Redis yet."""
        marks, mark, alive = self.store.marks(), self._mark, self._alive
        self._alive = frozenset()
        if marks is None or mark is None or not alive:
            return
        keys = [k for k in self._marked_keys if k in self._held]
        if not keys:
            return
        read = await marks.wait_for_writes(keys, mark, alive)
        if read is not None:
            self._held.update({**read, **self.store.pending(keys)})

    def covered(self, key: str) -> bool:
        """Whether a write of the session's ``key`` queued now is covered by the call's mark (no
        acknowledgement to wait for)."""
        marks, mark = self.store.marks(), self._mark
        return (
            self._marked
            and mark is not None
            and mark.covers_key(key)
            and marks is not None
            and marks.covers(mark)
        )

    def release(self) -> None:
        """The call is over: its mark goes, after the writes it queued (once)."""
        marks, mark = self.store.marks(), self._mark
        if self._sent and marks is not None and mark is not None:
            self._sent = False
            marks.release(mark)

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
        marks, mark = self.store.marks(), self._mark
        try:
            if marks is not None and mark is not None and not self._sent:
                self._sent = True
                read = self._take_marks(await marks.read_marked(missing, mark), missing)
            else:
                read = await self.store.get_many(missing)
        except ContextUnavailable:
            self._unavailable.update(k for k in missing if k not in pending)
            read = {}
        self._held.update({**read, **pending})
        await self.wait_for_writes()

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

    def marks(self) -> SessionMarks | None:
        return self.store.marks()

    async def put(
        self,
        key: str,
        value: bytes,
        ttl: int,
        *,
        wait: bool = True,
        quota: ClientQuota | None = None,
        ack: bool = True,
    ) -> None:
        """``wait`` writes of the session's keys covered by the call's mark do not wait for the
        acknowledgement."""
        self._held.pop(key, None)
        self._unavailable.discard(key)
        await self.store.put(key, value, ttl, wait=wait, quota=quota, ack=ack and not self.covered(key))

    async def aclose(self) -> None:
        return None  # the app owns the store


async def read_ahead(module: Module, value: Any, call: CallerContext | None, policy: Policy) -> None:
    """Read the keys of ``module``'s call in one round trip, unless they were read with the
    limits check (the call's store is a ``ReadThrough``; any other store is read key by key)."""
    if call is None or not isinstance(call.store, ReadThrough) or call.store.take_primed():
        return
    keys = planned_reads(module, value, call, policy)
    if keys:
        call.store.plan_mark(planned_identity(module, value, call))
        await call.store.fetch(keys)
