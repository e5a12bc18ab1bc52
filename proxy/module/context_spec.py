"""The ``context`` section of module.yaml as frozen values, parsed (and its schemas compiled) at load.

Errors are ``ContextSpecError`` naming the key (``context.accepts[1].schema``); the loader adds
the module's path.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import orjson

from proxy.json_schema import SchemaCompileError, compile_schema
from proxy.jsonshape import as_dict

Validator = Callable[[Any], Any]
Mode = Literal["main", "fork"]

CONTEXT_PROPERTY = "_context"
"""Where schema.json declares the context container: ``#/input/properties/_context`` (§3.2)."""
CONVERSATION_HISTORY = "conversation_history"
USER_PROFILE = "user_profile"
SESSION_STATE = "session_state"
PREVIOUS_RESULT = "previous_result"
ANALYSIS_CACHE = "analysis_cache"
ENVIRONMENT = "environment"

TTL_REQUEST = 0
"""Spec §5.2: request-scoped only (returned to the client, never stored)."""
TTL_PERSISTENT = -1
"""Spec §5.2: never expires."""

DEFAULT_KEY_PATTERNS: Mapping[str, str] = {
    SESSION_STATE: "${session_id}:session_state",
    USER_PROFILE: "${user_id}:user_profile",
    ANALYSIS_CACHE: "${module}:${input_hash}",
}
"""Where an emitted item goes when its emit names no ``key_pattern`` (the builder reads
``session_state`` and ``user_profile`` from these same keys); any other type:
``${session_id}:<type>``."""
KEY_VARIABLES = ("${module}", "${input_hash}", "${user_id}", "${session_id}")

# The conversation_history shape of spec §3.2 ($defs/conversation_history), used when the
# module names no schema of its own.
HISTORY_SCHEMA: dict[str, Any] = {
    "type": "array",
    "items": {
        "type": "object",
        "required": ["role", "content"],
        "properties": {
            "role": {"enum": ["user", "assistant", "system"]},
            "content": {"type": "string"},
            "timestamp": {"type": "string"},
        },
    },
}
# Spec §4.5: a prior module's answer.
PREVIOUS_RESULT_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {"module": {"type": "string"}, "meta": {"type": "object"}, "data": {}},
}
_BUILTIN_SCHEMAS = {CONVERSATION_HISTORY: HISTORY_SCHEMA, PREVIOUS_RESULT: PREVIOUS_RESULT_SCHEMA}


class ContextSpecError(ValueError):
    """A ``context`` section that cannot be used; the message names the key."""


@dataclass(frozen=True, slots=True)
class Accept:
    """One ``context.accepts`` entry."""

    type: str
    required: bool = False
    max_turns: int | None = None
    fields: tuple[str, ...] | None = None
    schema_path: str | None = None
    ttl: int | None = None
    from_module: str | None = None
    validator: Validator | None = field(default=None, repr=False, compare=False)


@dataclass(frozen=True, slots=True)
class Emit:
    """One ``context.emits`` entry."""

    type: str
    ttl: int = TTL_REQUEST
    key_pattern: str = ""
    schema_path: str | None = None
    validator: Validator | None = field(default=None, repr=False, compare=False)


@dataclass(frozen=True, slots=True)
class ContextSpec:
    """What a module accepts and emits; ``mode`` is how a composite's steps share it (proxy.compose.run)."""

    accepts: tuple[Accept, ...] = ()
    emits: tuple[Emit, ...] = ()
    mode: Mode = "main"

    def accepted(self, kind: str) -> Accept | None:
        return next((a for a in self.accepts if a.type == kind), None)

    def emitted(self, kind: str) -> Emit | None:
        return next((e for e in self.emits if e.type == kind), None)

    @property
    def declared(self) -> bool:
        return bool(self.accepts or self.emits)

    def summary(self) -> dict[str, Any]:
        return {
            "mode": self.mode,
            "accepts": [
                {
                    k: v
                    for k, v in (
                        ("type", a.type),
                        ("required", a.required),
                        ("max_turns", a.max_turns),
                        ("from_module", a.from_module),
                    )
                    if v is not None
                }
                for a in self.accepts
            ],
            "emits": [{"type": e.type, "ttl": e.ttl, "key_pattern": e.key_pattern} for e in self.emits],
        }


NO_CONTEXT = ContextSpec()


def _schema(root: Path, where: str, relative: Any, builtin: dict[str, Any] | None) -> Validator | None:
    if relative is None:
        return compile_schema(builtin) if builtin is not None else None
    if not isinstance(relative, str) or not relative:
        raise ContextSpecError(f"{where}: must be a path relative to the module")
    path = (root / relative).resolve()
    if not path.is_relative_to(root.resolve()):
        raise ContextSpecError(f"{where}: {relative!r} is outside the module directory")
    try:
        doc = orjson.loads(path.read_bytes())
    except OSError as exc:
        raise ContextSpecError(f"{where}: cannot read {relative!r}: {exc.strerror or exc}") from exc
    except orjson.JSONDecodeError as exc:
        raise ContextSpecError(f"{where}: {relative!r} is not valid JSON: {exc}") from exc
    if not isinstance(doc, dict):
        raise ContextSpecError(f"{where}: {relative!r} must hold a JSON Schema object")
    try:
        return compile_schema(doc, source=relative)
    except SchemaCompileError as exc:
        raise ContextSpecError(f"{where}: {relative!r} does not compile: {exc}") from exc


def _check_pattern(where: str, pattern: str) -> None:
    rest = pattern
    for variable in KEY_VARIABLES:
        rest = rest.replace(variable, "")
    if "${" in rest:
        raise ContextSpecError(
            f"{where}: unknown variable in {pattern!r} (known: {', '.join(KEY_VARIABLES)})"
        )


_ACCEPT_KEYS = frozenset({"type", "required", "max_turns", "fields", "schema", "ttl", "from_module"})
_EMIT_KEYS = frozenset({"type", "ttl", "key_pattern", "schema"})
_SECTION_KEYS = frozenset({"accepts", "emits", "mode"})


def _unknown(where: str, item: dict[str, Any], known: frozenset[str]) -> None:
    extra = sorted(str(k) for k in item if k not in known)
    if extra:
        raise ContextSpecError(f"{where}.{extra[0]}: unknown key (known: {', '.join(sorted(known))})")


def context_input_schema(schema: Mapping[str, Any]) -> dict[str, Any] | None:
    """``schema.json#/input/properties/_context`` with the document's ``$defs``/``definitions``
    attached (context-protocol §3.2 refers into them), or None when schema.json declares none."""
    declared = as_dict(as_dict(as_dict(schema.get("input")).get("properties")).get(CONTEXT_PROPERTY))
    if not declared:
        return None
    out = copy.deepcopy(declared)
    for key in ("$defs", "definitions"):
        if key in schema and key not in out:
            out[key] = copy.deepcopy(schema[key])
    return out


def declared_in_schema(schema: Mapping[str, Any]) -> tuple[str, ...]:
    """The context types schema.json's ``_context`` names: accepted like ``context.accepts`` entries."""
    declared = context_input_schema(schema) or {}
    return tuple(str(k) for k in as_dict(declared.get("properties")))


def parse_context(raw: Any, root: Path, in_schema: tuple[str, ...] = ()) -> ContextSpec:
    """The ``context`` section (already checked against module.yaml.schema.json for its shape);
    ``in_schema``: the types schema.json's ``_context`` declares, accepted too (§3.2)."""
    if raw is None:
        raw = {}
    if isinstance(raw, str):  # conformance.md's plain form: ``context: fork``
        raw = {"mode": raw}
    if not isinstance(raw, dict):
        raise ContextSpecError("context: must be a mapping")
    _unknown("context", raw, _SECTION_KEYS)
    accepts: list[Accept] = []
    for i, item in enumerate(raw.get("accepts") or ()):
        where = f"context.accepts[{i}]"
        _unknown(where, item, _ACCEPT_KEYS)
        kind = str(item["type"])
        if any(a.type == kind for a in accepts):
            raise ContextSpecError(f"{where}.type: {kind!r} is accepted twice")
        fields = item.get("fields")
        accepts.append(
            Accept(
                type=kind,
                required=bool(item.get("required", False)),
                max_turns=item.get("max_turns"),
                fields=tuple(str(f) for f in fields) if fields is not None else None,
                schema_path=item.get("schema"),
                ttl=item.get("ttl"),
                from_module=item.get("from_module"),
                validator=_schema(root, f"{where}.schema", item.get("schema"), _BUILTIN_SCHEMAS.get(kind)),
            )
        )
        if kind == PREVIOUS_RESULT and not item.get("from_module"):
            raise ContextSpecError(
                f"{where}.from_module: required for previous_result (the module whose result)"
            )
    emits: list[Emit] = []
    for i, item in enumerate(raw.get("emits") or ()):
        where = f"context.emits[{i}]"
        _unknown(where, item, _EMIT_KEYS)
        kind = str(item["type"])
        if any(e.type == kind for e in emits):
            raise ContextSpecError(f"{where}.type: {kind!r} is emitted twice")
        pattern = str(item.get("key_pattern") or DEFAULT_KEY_PATTERNS.get(kind, f"${{session_id}}:{kind}"))
        _check_pattern(f"{where}.key_pattern", pattern)
        emits.append(
            Emit(
                type=kind,
                ttl=int(item.get("ttl", TTL_REQUEST)),
                key_pattern=pattern,
                schema_path=item.get("schema"),
                validator=_schema(root, f"{where}.schema", item.get("schema"), None),
            )
        )
    accepts += [Accept(type=kind) for kind in in_schema if not any(a.type == kind for a in accepts)]
    mode = raw.get("mode", "main")
    if mode not in ("main", "fork"):
        raise ContextSpecError(f"context.mode: must be fork or main, not {str(mode)[:40]!r}")
    return ContextSpec(tuple(accepts), tuple(emits), mode)
