"""Load-time checks of a module's media inputs: ``modalities`` against ``schema.json#/input``."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

FORM_NAMES = frozenset({"url", "base64", "file", "upload_ref"})
MAX_SCHEMA_DEPTH = 32


def _forms_of(node: dict[str, Any]) -> set[str]:
    props = node.get("properties")
    kind = props.get("type") if isinstance(props, dict) else None
    if not isinstance(kind, dict):
        return set()
    values = [kind["const"]] if "const" in kind else list(kind.get("enum") or ())
    return {v for v in values if isinstance(v, str)} & FORM_NAMES


def _deref(node: Any, root: dict[str, Any]) -> Any:
    ref = node.get("$ref") if isinstance(node, dict) else None
    if isinstance(ref, str) and ref.startswith("#/"):
        target: Any = root
        for key in ref[2:].split("/"):
            target = target.get(key) if isinstance(target, dict) else None
        return target
    return node


def media_paths(schema: Any, root: dict[str, Any], path: str = "input", depth: int = 0) -> Iterator[str]:
    """JSON-pointer-like paths of ``schema`` where a media input (spec v2.5 §2.3) is accepted."""
    node = _deref(schema, root)
    if not isinstance(node, dict) or depth > MAX_SCHEMA_DEPTH:
        return
    variants = [v for key in ("oneOf", "anyOf", "allOf") for v in node.get(key) or ()]
    if _forms_of(node) or any(_forms_of(_deref(v, root) or {}) for v in variants):
        yield path
        return
    for name, sub in (node.get("properties") or {}).items():
        yield from media_paths(sub, root, f"{path}/properties/{name}", depth + 1)
    if isinstance(node.get("items"), dict):
        yield from media_paths(node["items"], root, f"{path}/items", depth + 1)


def check(
    input_schema: dict[str, Any] | None, root: dict[str, Any], modalities: frozenset[str]
) -> str | None:
    """The problem with a module's media declaration, or None."""
    media = modalities - {"text"}
    paths = list(media_paths(input_schema, root)) if input_schema else []
    if paths and not media:
        return (
            f"schema.json#/{paths[0]} accepts media (spec v2.5 §2.3) but module.yaml modalities.input "
            "declares none of image, audio, video, document"
        )
    if media and not paths:
        return (
            f"module.yaml modalities.input declares {', '.join(sorted(media))} but schema.json#/input "
            "has no media input (an object with type url | base64 | file | upload_ref)"
        )
    return None


def without_content_encoding(node: Any) -> Any:
    """``node`` without ``contentEncoding``: an annotation in draft-07 that fastjsonschema would
    enforce by decoding every base64 string once more. The media step decodes media strictly
    itself (E1013, after the size check), so the schema check neither doubles that memory nor
    turns a bad media encoding into a generic E1001."""
    if isinstance(node, dict):
        return {k: without_content_encoding(v) for k, v in node.items() if k != "contentEncoding"}
    if isinstance(node, list):
        return [without_content_encoding(v) for v in node]
    return node
