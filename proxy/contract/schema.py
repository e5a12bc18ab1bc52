"""Compiling JSON Schemas (draft-07) with fastjsonschema, and turning failures into violations."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import fastjsonschema

Validator = Callable[[Any], Any]


class SchemaCompileError(ValueError):
    """A schema that cannot be compiled (bad keyword, unresolvable or remote ``$ref``)."""


def _no_remote(uri: str) -> Any:
    raise SchemaCompileError(f"remote $ref {uri!r} is not allowed; inline it or use #/$defs")


_NO_REMOTE_HANDLERS = dict.fromkeys(("http", "https", "file", "ftp", ""), _no_remote)


def compile_schema(schema: dict[str, Any]) -> Validator:
    """Compile ``schema`` once. Defaults are never filled in (validation must not add fields)."""
    doc = {k: v for k, v in schema.items() if k not in ("$schema", "$id")}
    doc["$schema"] = "http://json-schema.org/draft-07/schema#"
    try:
        validator: Validator = fastjsonschema.compile(
            doc, handlers=_NO_REMOTE_HANDLERS, use_default=False, fast_fail=False
        )
    except SchemaCompileError:
        raise
    except (fastjsonschema.JsonSchemaDefinitionException, ValueError, KeyError, TypeError) as exc:
        raise SchemaCompileError(str(exc) or type(exc).__name__) from exc
    return validator


@dataclass(frozen=True, slots=True)
class Violation:
    """One way a value breaks its contract. ``code`` is the most specific taxonomy code."""

    path: str
    message: str
    rule: str = ""
    code: str = "E3001"

    def __str__(self) -> str:
        return f"{self.path}: {self.message}" if self.path else self.message


def _rename_root(name: str, root: str) -> str:
    rest = name[len("data") :] if name.startswith("data") else name
    if not root:
        return rest.lstrip(".")
    return root + rest


def check(validator: Validator, value: Any, root: str) -> list[Violation]:
    """Run ``validator`` on ``value``; violations are named from ``root`` (``meta.risk``)."""
    try:
        validator(value)
    except fastjsonschema.JsonSchemaValuesException as exc:
        errors = exc.errors
    except fastjsonschema.JsonSchemaValueException as exc:
        errors = [exc]
    else:
        return []
    out = []
    for err in errors:
        path = _rename_root(err.name or "data", root)
        if err.rule == "required" and isinstance(err.value, dict):
            missing = [k for k in err.rule_definition or () if k not in err.value]
            prefix = f"{path}." if path else ""
            out += [Violation(f"{prefix}{k}", "is required", "required") for k in missing]
            continue
        text = err.message
        if err.name and text.startswith(err.name):
            text = text[len(err.name) :].lstrip()
        out.append(Violation(path=path, message=text, rule=err.rule or ""))
    return out
