"""The module result cache (the spec's ``analysis_cache``): an accepted answer is kept under
module + canonical input hash (+ a digest of the ``_context`` the caller sent) in the client's
namespace, and a repeated identical call is answered from it without calling a model.

The key holds only what the call itself carries, so it is known before anything is read and the
lookup goes out in the same round trip as the limits check and the context reads
(``proxy.context.prefetch``). The context the proxy builds from the store (a session's state, a
previous result) is not known then: the entry records a digest of the context the model saw, and
an entry whose digest is not that of the call's context is a miss (overwritten by its answer).

Each entry records the policy version it was decided under: a hash of that module's thresholds.
A reload that changes them makes old entries misses (they are overwritten by the next answer).
"""

from __future__ import annotations

import hashlib
from dataclasses import asdict, dataclass
from typing import Any

import orjson
import structlog

from proxy.context.identity import Identity, expand
from proxy.context.store import ContextStore, ContextUnavailable
from proxy.module.context_spec import ANALYSIS_CACHE, DEFAULT_KEY_PATTERNS, TTL_REQUEST
from proxy.module.model import Module
from proxy.policy.model import CacheRule, Policy, Thresholds

log = structlog.get_logger("proxy.context")

HIT, MISS, BYPASS = "hit", "miss", "bypass"
MAX_ENTRY_BYTES = 1024 * 1024
"""An answer larger than this is not cached: one entry must not evict hundreds of others from
the memory store, and a megabyte answer is rarely asked twice."""
VERSION_HEX = 16


@dataclass(frozen=True, slots=True)
class Entry:
    version: str
    envelope: dict[str, Any]
    model: str | None
    usage: dict[str, int]
    emitted: dict[str, Any] | None
    context: str = ""
    """The digest of the context the model saw (``Prepared.context_digest``)."""

    @property
    def tokens(self) -> int:
        return int(self.usage.get("total_tokens") or 0) or sum(
            int(self.usage.get(k) or 0) for k in ("prompt_tokens", "completion_tokens")
        )


def rule_for(policy: Policy, module: Module) -> CacheRule | None:
    """The policy's rule for the module (module, then tier), else the module's own
    ``analysis_cache`` emit; None (or ttl 0) means no caching."""
    rule = policy.cache.rule_for(module.name, module.tier)
    if rule is None:
        emit = module.context.emitted(ANALYSIS_CACHE)
        if emit is not None:
            rule = CacheRule(ttl_s=emit.ttl)
    return rule if rule is not None and rule.ttl_s != TTL_REQUEST else None


def policy_version(thresholds: Thresholds) -> str:
    raw = orjson.dumps(asdict(thresholds), option=orjson.OPT_SORT_KEYS)
    return hashlib.sha256(raw).hexdigest()[:VERSION_HEX]


def cache_key(identity: Identity, module: Module, hashed_input: str, sent_digest: str) -> str:
    """The entry's key: ``sent_digest`` is the digest of the caller's own ``_context``
    (``proxy.context.identity.client_digest``), never of context read from the store."""
    emit = module.context.emitted(ANALYSIS_CACHE)
    pattern = emit.key_pattern if emit is not None else DEFAULT_KEY_PATTERNS[ANALYSIS_CACHE]
    # A pattern naming a session or user the call lacks falls back to module + input.
    base = expand(pattern, identity, module.name, hashed_input) or f"{module.name}:{hashed_input}"
    return identity.key("cache", base, sent_digest)


async def lookup(store: ContextStore, key: str, version: str, context_digest: str) -> Entry | None:
    """The entry, or None (absent, decided under another policy version or for another context,
    unreadable, or the store is down: the cache never fails a request)."""
    try:
        raw = await store.get(key)
    except ContextUnavailable:
        return None
    if raw is None:
        return None
    try:
        doc = orjson.loads(raw)
        entry = Entry(
            str(doc["version"]),
            dict(doc["envelope"]),
            doc.get("model"),
            dict(doc.get("usage") or {}),
            doc.get("emitted"),
            str(doc.get("context") or ""),
        )
    except (orjson.JSONDecodeError, KeyError, TypeError, ValueError):
        log.warning("proxy.cache_entry_unreadable", key_hash=hashlib.sha256(key.encode()).hexdigest()[:12])
        return None
    return entry if entry.version == version and entry.context == context_digest else None


async def save(store: ContextStore, key: str, entry: Entry, ttl: int) -> None:
    raw = orjson.dumps(asdict(entry))
    if len(raw) <= MAX_ENTRY_BYTES:
        await store.put(key, raw, ttl, wait=False)  # the next identical call may miss; no harm
