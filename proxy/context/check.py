"""Validation of the merged ``_context`` against the module's ``context.accepts`` (spec §7.2).

Undeclared types are dropped (never sent to the model) with a warning; ``fields`` keeps only the
named fields of an object; ``max_turns`` keeps the newest turns of a list; a required type that
is missing is E1002 naming it (and saying so when the store could not be read); a schema
violation (an ``accepts[].schema`` or schema.json's ``_context``, §3.2) is E1001 with the path
(``_context.session_state.issues_found``).
"""

from __future__ import annotations

from collections.abc import Set
from dataclasses import dataclass, field
from typing import Any

from proxy.context.identity import CONTEXT_FIELD
from proxy.contract.errors import MESSAGE_VIOLATIONS_MAX, Code, error_envelope
from proxy.json_schema import Violation, check
from proxy.module.context_spec import ContextSpec, Validator

_MAX_LISTED = 20


@dataclass
class Checked:
    context: dict[str, Any] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)
    error: dict[str, Any] | None = None


def check_context(
    spec: ContextSpec,
    merged: dict[str, Any],
    unavailable: Set[str],
    module: str,
    schema: Validator | None = None,
) -> Checked:
    """``schema``: schema.json's ``_context`` declaration (§3.2), checked on the whole merged
    context before the ``accepts`` entries filter it."""
    out = Checked()
    if schema is not None:
        problems = check(schema, merged, CONTEXT_FIELD)
        if problems:
            out.error = _invalid(problems, module)
            return out
    for kind, value in merged.items():
        accept = spec.accepted(kind)
        if accept is None:
            out.warnings.append(f"_context.{kind}: not declared in context.accepts of {module!r}; dropped")
            continue
        if accept.fields is not None and isinstance(value, dict):
            extra = [k for k in value if k not in accept.fields]
            if extra:
                out.warnings.append(
                    f"_context.{kind}: fields {', '.join(map(str, extra))} are not accepted; dropped"
                )
                value = {k: v for k, v in value.items() if k in accept.fields}
        if accept.max_turns is not None and isinstance(value, list):
            value = value[-accept.max_turns :]
        out.context[kind] = value
    missing = [a for a in spec.accepts if a.required and a.type not in out.context]
    if missing:
        first = missing[0]
        down = first.type in unavailable
        why = (
            "the context store is down, so the proxy could not supply it"
            if down
            else "send it in _context (or let the proxy build it: a session, a previous call)"
        )
        out.error = error_envelope(
            Code.MISSING_REQUIRED_FIELD,
            f"Module {module!r} requires context {first.type!r}, which is missing: {why}",
            explain=f"Required context {first.type!r} is missing"
            + (" (context store unavailable)" if down else " (caller error)"),
            suggestion=f"Send _context.{first.type}" if not down else "Retry when the context store is back",
            details={"missing_context": [a.type for a in missing], "store_unavailable": down},
        )
        return out
    problems = []
    for kind, value in out.context.items():
        accept = spec.accepted(kind)
        if accept is not None and accept.validator is not None:
            problems += check(accept.validator, value, f"_context.{kind}")
    if problems:
        out.error = _invalid(problems, module)
    return out


def _invalid(problems: list[Violation], module: str) -> dict[str, Any]:
    listing = "; ".join(str(p) for p in problems[:MESSAGE_VIOLATIONS_MAX])
    return error_envelope(
        Code.INVALID_INPUT,
        f"_context does not match what module {module!r} accepts: {listing}",
        explain=f"Context validation failed (caller error): {problems[0]}",
        suggestion=f"Fix {problems[0].path} and send the request again",
        details={"violations": [{"path": p.path, "message": p.message} for p in problems[:_MAX_LISTED]]},
    )
