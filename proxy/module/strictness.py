"""The data schema a module is validated against, derived once at load from its tier settings.

* ``schema_strictness: high``: the schema as written, and no undeclared top-level data fields
  (``additionalProperties: false`` at the data root unless the schema says otherwise).
* ``medium``: the schema as written.
* ``low``: the minimum: only ``rationale`` stays required at the data root; types and
  constraints of the fields that are present are still checked.
* ``enums.strategy: strict`` removes the extensible-enum ``{custom, reason}`` branches from every
  ``oneOf``/``anyOf`` in the schema, so that form is accepted only under ``extensible``.
"""

from __future__ import annotations

import copy
from typing import Any

from proxy.module.model import EnumStrategy, Strictness


def _is_custom_branch(node: Any, tag: str) -> bool:
    if not isinstance(node, dict):
        return False
    required = node.get("required")
    props = node.get("properties")
    return (isinstance(required, list) and tag in required) or (
        isinstance(props, dict) and tag in props and "reason" in props
    )


def _strip_custom_branches(node: Any, tag: str) -> None:
    if isinstance(node, dict):
        for keyword in ("oneOf", "anyOf"):
            branches = node.get(keyword)
            if isinstance(branches, list):
                kept = [b for b in branches if not _is_custom_branch(b, tag)]
                if kept and len(kept) != len(branches):
                    node[keyword] = kept
        for value in node.values():
            _strip_custom_branches(value, tag)
    elif isinstance(node, list):
        for item in node:
            _strip_custom_branches(item, tag)


def data_contract_schema(
    document: dict[str, Any],
    *,
    strictness: Strictness,
    enum_strategy: EnumStrategy,
    unknown_tag: str,
) -> dict[str, Any]:
    """A compilable schema for ``data``: the module's data schema with the document's
    ``$defs``/``definitions`` carried along (so local ``$ref``s resolve) and the tier applied."""
    schema = with_definitions(document, "data") or {}
    if enum_strategy == "strict":
        _strip_custom_branches(schema, unknown_tag)
    if strictness == "high" and isinstance(schema.get("properties"), dict):
        schema.setdefault("additionalProperties", False)
    elif strictness == "low" and isinstance(schema.get("required"), list):
        schema["required"] = [name for name in schema["required"] if name == "rationale"]
    return schema


def with_definitions(document: dict[str, Any], section: str) -> dict[str, Any] | None:
    """``document[section]`` with the document's definitions attached, or None if absent."""
    part = document.get(section)
    if not isinstance(part, dict):
        return None
    schema = copy.deepcopy(part)
    for key in ("$defs", "definitions"):
        if key in document and key not in schema:
            schema[key] = copy.deepcopy(document[key])
    return schema
