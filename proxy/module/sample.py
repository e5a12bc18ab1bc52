"""A minimal value that satisfies a JSON Schema: the offline demo's answer to unseen inputs.

Only the required parts are built (first enum value, first ``oneOf``/``anyOf`` branch, the
minimum of a number, ``minItems`` items), so the answer is obviously not a real one. Schemas
this cannot satisfy (patterns, formats) are caught by validating the result afterwards.
"""

from __future__ import annotations

from typing import Any, Final

from proxy.jsonshape import as_dict, as_list

DEMO_TEXT: Final = "offline demo"
_MAX_DEPTH: Final = 12  # recursive $refs stop here; the result is validated anyway


def _resolve(schema: dict[str, Any], document: dict[str, Any]) -> dict[str, Any]:
    ref = schema.get("$ref")
    if not isinstance(ref, str) or not ref.startswith("#/"):
        return schema
    node: Any = document
    for part in ref[2:].split("/"):
        node = as_dict(node).get(part.replace("~1", "/").replace("~0", "~"))
    return as_dict(node)


def _string(schema: dict[str, Any]) -> str:
    text = DEMO_TEXT
    low, high = schema.get("minLength"), schema.get("maxLength")
    if isinstance(low, int) and len(text) < low:
        text = text + "." * (low - len(text))
    if isinstance(high, int):
        text = text[:high]
    return text


def _number(schema: dict[str, Any], integer: bool) -> int | float:
    for key in ("minimum", "exclusiveMinimum"):
        bound = schema.get(key)
        if isinstance(bound, int | float) and not isinstance(bound, bool):
            value = bound + (1 if key == "exclusiveMinimum" and integer else 0)
            if key == "exclusiveMinimum" and not integer:
                value = bound + 0.5
            return int(value) if integer else value
    return 0


def sample(schema: Any, document: dict[str, Any], depth: int = 0) -> Any:
    """A small value valid against ``schema`` (local ``$ref``s resolved in ``document``)."""
    node = _resolve(as_dict(schema), document)
    if depth > _MAX_DEPTH:
        return None
    if "const" in node:
        return node["const"]
    if as_list(node.get("enum")):
        return node["enum"][0]
    for keyword in ("oneOf", "anyOf"):
        branches = as_list(node.get(keyword))
        if branches:
            return sample(branches[0], document, depth + 1)
    if as_list(node.get("allOf")):
        merged: dict[str, Any] = {}
        for part in node["allOf"]:
            merged.update(_resolve(as_dict(part), document))
        return sample(merged, document, depth + 1)
    kind = node.get("type")
    if isinstance(kind, list):
        kind = next((k for k in kind if k != "null"), "null")
    if kind is None and isinstance(node.get("properties"), dict):
        kind = "object"
    if kind == "object":
        props = as_dict(node.get("properties"))
        return {
            str(name): sample(props.get(name, {}), document, depth + 1)
            for name in as_list(node.get("required"))
        }
    if kind == "array":
        least = node.get("minItems")
        count = least if isinstance(least, int) else 0
        return [sample(node.get("items", {}), document, depth + 1) for _ in range(count)]
    if kind in ("number", "integer"):
        return _number(node, kind == "integer")
    if kind == "boolean":
        return False
    if kind == "null":
        return None
    return _string(node)
