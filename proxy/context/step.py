"""The pipeline's two context steps: ``prepare`` before the upstream call (build, merge, check,
sanitise), ``emit`` after the decision (store what the answer emitted and the session's result).
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson
import structlog

from proxy.context.builder import Built, build, merge, result_key
from proxy.context.check import check_context
from proxy.context.identity import (
    CONTEXT_FIELD,
    SESSION_FIELD,
    Identity,
    IdentityError,
    call_identity,
    check_id,
    client_digest,
    expand,
    input_hash,
    without_context,
)
from proxy.context.sanitise import DEFAULT_MATCHER, MAX_CONTEXT_BYTES, NameMatcher, sanitise
from proxy.context.store import ContextStore
from proxy.context.used import ContextUsed, context_used
from proxy.contract.errors import EXPLAIN_MAX, Code, error_envelope
from proxy.jsonshape import deeper_than
from proxy.module.context_spec import TTL_REQUEST
from proxy.module.model import Module

log = structlog.get_logger("proxy.context")

SESSION_RESULT_TTL_S = 24 * 3600
"""How long a session's last accepted answer per module is kept for ``previous_result``: the
upper end of the spec's session lifetime (1-24 hours, §4.1)."""
ACCEPTED = frozenset({"accept", "escalated"})


@dataclass(frozen=True, slots=True)
class CallerContext:
    """What the edge knows about the caller's context: where it is stored, who the caller is,
    the earlier chat messages, and whether the result cache is bypassed."""

    store: ContextStore
    identity: Identity
    history: Sequence[Mapping[str, Any]] = ()
    bypass_cache: bool = False
    matcher: NameMatcher = DEFAULT_MATCHER


@dataclass
class Prepared:
    model_input: Any
    """What the model is shown: the input with the sanitised ``_context`` (or without any)."""
    checked_input: Any
    """The input without ``_context``: what the input schema checks and the cache key hashes."""
    identity: Identity | None = None
    input_hash: str = ""
    context_digest: str = ""
    """A digest of the context the model is shown ("" for none)."""
    client_digest: str = ""
    """A digest of the ``_context`` the caller sent (``proxy.context.identity.client_digest``)."""
    warnings: list[str] = field(default_factory=list)
    redacted: list[str] = field(default_factory=list)
    error: dict[str, Any] | None = None
    used: ContextUsed | None = None
    """The context types the model is shown and their sources; None when ``_context`` was refused."""


def _invalid(message: str, **details: Any) -> dict[str, Any]:
    return error_envelope(
        Code.INVALID_INPUT,
        message,
        explain=f"Invalid context (caller error): {message}"[:EXPLAIN_MAX],
        details=details or None,
    )


async def prepare(module: Module, value: Any, call: CallerContext | None) -> Prepared:
    if not isinstance(value, dict) or deeper_than(value):
        return Prepared(value, value)  # the input check refuses it (E1001) before anything else
    client = value.get(CONTEXT_FIELD)
    bare = without_context(value)
    prepared = Prepared(bare, bare)
    if client is not None and not isinstance(client, dict):
        prepared.error = _invalid("_context must be an object")
        return prepared
    client = dict(client or {})
    identity = call.identity if call is not None else None
    try:
        if identity is not None:
            identity = call_identity(identity, client)
        else:
            check_id(client.get(SESSION_FIELD), "_context.session_id")
    except IdentityError as exc:
        prepared.error = _invalid(str(exc))
        return prepared
    prepared.client_digest = client_digest(client)
    client.pop(SESSION_FIELD, None)
    prepared.identity = identity
    if not module.context.declared and not client:
        prepared.input_hash = input_hash(bare) if call is not None else ""
        prepared.used = ContextUsed()
        return prepared  # the common case: nothing to build, check or show
    built = (
        await build(module.context, identity, call.store, call.history)
        if call is not None and identity is not None
        else Built()
    )
    merged = merge(built.context, client)
    checked = check_context(module.context, merged, built.unavailable, module.name, module.validators.context)
    prepared.warnings = checked.warnings
    prepared.used = context_used(checked.context, built.context, built.sources, client, built.unavailable)
    if checked.error is not None:
        prepared.error = checked.error
        return prepared
    clean = sanitise(checked.context, call.matcher if call is not None else DEFAULT_MATCHER)
    prepared.redacted = clean.redacted
    if clean.redacted:
        log.info("proxy.context_redacted", module=module.name, paths=clean.redacted[:50])
    if clean.value:
        raw = orjson.dumps(clean.value, option=orjson.OPT_SORT_KEYS)
        if len(raw) > MAX_CONTEXT_BYTES:
            prepared.error = error_envelope(
                Code.INPUT_TOO_LARGE,
                f"The context is {len(raw)} bytes after sanitisation; "
                f"at most {MAX_CONTEXT_BYTES} are sent to a model",
                details={"context_bytes": len(raw), "max_context_bytes": MAX_CONTEXT_BYTES},
            )
            return prepared
        prepared.model_input = {**bare, CONTEXT_FIELD: clean.value}
        prepared.context_digest = input_hash(clean.value)[:16]
    prepared.input_hash = input_hash(bare)
    return prepared


async def emit(
    module: Module,
    call: CallerContext | None,
    prepared: Prepared,
    decision: str,
    envelope: dict[str, Any],
    emitted: dict[str, Any] | None,
) -> tuple[dict[str, Any] | None, list[str]]:
    """Store an accepted answer's emitted items (by their TTL and key pattern) and the session's
    last result; returns what goes back to the client as ``_emitted_context`` and warnings."""
    warnings: list[str] = []
    identity = prepared.identity
    if decision not in ACCEPTED or call is None or identity is None:
        return (emitted if decision in ACCEPTED else None), warnings
    writes: list[tuple[str, bytes, int]] = []
    key = result_key(identity, module.name)
    if key is not None:
        result = {"module": module.name, "meta": envelope.get("meta"), "data": envelope.get("data")}
        writes.append((key, orjson.dumps(result), SESSION_RESULT_TTL_S))
    for kind, value in (emitted or {}).items():
        spec = module.context.emitted(kind)
        if spec is None or spec.ttl == TTL_REQUEST:
            continue
        name = expand(spec.key_pattern, identity, module.name, prepared.input_hash)
        if name is None:
            warnings.append(f"_emitted_context.{kind}: not stored (its key needs a session or user id)")
            continue
        raw = orjson.dumps(value)
        if len(raw) > MAX_CONTEXT_BYTES:
            warnings.append(f"_emitted_context.{kind}: not stored (larger than {MAX_CONTEXT_BYTES} bytes)")
            continue
        writes.append((identity.key(name), raw, spec.ttl))
    # all queued before any is waited on: they reach Redis together, one acknowledgement to wait for
    await asyncio.gather(*(call.store.put(k, raw, ttl) for k, raw, ttl in writes))
    return emitted, warnings
