"""Compiling JSON Schemas (draft-07) with fastjsonschema, and turning failures into violations."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import fastjsonschema
import orjson

Validator = Callable[[Any], Any]


class SchemaCompileError(ValueError):
    """A schema that cannot be compiled (bad keyword, unresolvable or remote ``$ref``)."""


# The base URI of a module's schema files while compiling: a name, never fetched. A file $ref
# "common.json" resolves to BASE_URI + "common.json", served from the documents read at load.
BASE_URI = "file:///module/"


class _LocalOnly(Mapping[str, Callable[[str], Any]]):
    """fastjsonschema's handlers: one for *every* scheme (an unknown scheme, such as ``url`` in
    ``URL:http://...``, would otherwise go to urllib), serving only the documents given."""

    def __init__(self, documents: Mapping[str, Any]) -> None:
        self._documents = documents

    def _serve(self, uri: str) -> Any:
        name = uri.removeprefix(BASE_URI) if uri.startswith(BASE_URI) else None
        if name is None or name not in self._documents:
            raise SchemaCompileError(
                f"$ref {uri!r} is not allowed: only local pointers and files inside the module"
            )
        return self._documents[name]

    def __getitem__(self, scheme: str) -> Callable[[str], Any]:
        return self._serve

    def __contains__(self, scheme: object) -> bool:
        return True

    def __iter__(self) -> Iterator[str]:
        return iter(())

    def __len__(self) -> int:
        return 0


def _copy(value: dict[str, Any]) -> dict[str, Any]:
    copied: dict[str, Any] = orjson.loads(orjson.dumps(value))
    return copied


def compile_schema(
    schema: dict[str, Any], documents: Mapping[str, Any] | None = None, source: str = "schema.json"
) -> Validator:
    """Compile ``schema`` once; nothing is fetched. ``documents``: the module's other schema
    files that its ``$ref``s name (checked by ``proxy.module.refs``), by path relative to the
    module; ``source`` is the schema's own path. Defaults are never filled in (validation must
    not add fields)."""
    # fastjsonschema rewrites every $ref in place to an absolute URI: compile a copy, so that a
    # shared schema (the cached envelope schema, a module's parsed schema.json) stays as written.
    doc = {k: v for k, v in _copy(schema).items() if k not in ("$schema", "$id")}
    doc["$schema"] = "http://json-schema.org/draft-07/schema#"
    doc["$id"] = BASE_URI + source
    try:
        validator: Validator = fastjsonschema.compile(
            doc, handlers=_LocalOnly(_copy(dict(documents or {}))), use_default=False, fast_fail=False
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
