"""Schema-guided enum normalisation for the repair pass.

A string that differs from exactly one declared enum value only by case or surrounding
whitespace is replaced by that declared value. Nothing else is touched: no value is invented,
no type changes, and an ambiguous match (two declared values equal up to case) is left alone.
"""

from __future__ import annotations

from typing import Any

_MAX_DEPTH = 32


def _resolve(schema: Any, root: dict[str, Any]) -> Any:
    seen = 0
    while isinstance(schema, dict) and isinstance(schema.get("$ref"), str) and seen < 8:
        ref: str = schema["$ref"]
        if not ref.startswith("#"):
            return {}
        node: Any = root
        for part in ref.lstrip("#").strip("/").split("/"):
            if not part:
                continue
            part = part.replace("~1", "/").replace("~0", "~")
            node = node.get(part) if isinstance(node, dict) else None
        schema = node
        seen += 1
    return schema if isinstance(schema, dict) else {}


def _match(value: str, declared: list[Any]) -> str | None:
    if value in declared:
        return None
    key = value.strip().casefold()
    hits = [d for d in declared if isinstance(d, str) and d.casefold() == key]
    return hits[0] if len(hits) == 1 else None


def normalize_enums(
    value: Any, schema: Any, root: dict[str, Any], path: str, out: list[str], depth: int = 0
) -> Any:
    """Return ``value`` with enum strings normalised; appends each changed path to ``out``."""
    if depth > _MAX_DEPTH:
        return value
    node = _resolve(schema, root)
    if not node:
        return value
    if isinstance(value, str) and isinstance(node.get("enum"), list):
        fixed = _match(value, node["enum"])
        if fixed is not None:
            out.append(path)
            return fixed
        return value
    for keyword in ("allOf", "anyOf", "oneOf"):
        for branch in node.get(keyword) or ():
            changed = normalize_enums(value, branch, root, path, out, depth + 1)
            if changed is not value:
                return changed
    if isinstance(value, dict):
        props = node.get("properties")
        if isinstance(props, dict):
            for key, sub in props.items():
                if key in value:
                    value[key] = normalize_enums(value[key], sub, root, f"{path}.{key}", out, depth + 1)
    elif isinstance(value, list):
        items = node.get("items")
        if isinstance(items, dict):
            for i, item in enumerate(value):
                value[i] = normalize_enums(item, items, root, f"{path}[{i}]", out, depth + 1)
    return value
