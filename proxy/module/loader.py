"""Loading one module directory in any supported format into a ``Module``.

* v2.2: ``module.yaml`` + ``prompt.md`` + ``schema.json`` with ``meta`` and ``data``.
* v2.1: the same files; ``schema.json`` has ``output`` instead of ``data`` and no ``meta``.
  A missing ``tier`` runs as ``decision``; answers are auto-wrapped into v2.2 envelopes.
* v1: ``MODULE.md`` (YAML front matter + prompt) + ``schema.json`` (``input``/``output``).

module.yaml is validated against the spec's ``module.yaml.schema.json`` (shipped in the package);
every schema is compiled here, once.
"""

from __future__ import annotations

import re
from functools import cache
from pathlib import Path
from typing import Any

import orjson
import yaml

from proxy import schemas
from proxy.compose.directives import CallDirective, DirectiveError, parse_directives
from proxy.compose.spec import Composition, CompositionError, parse_composition
from proxy.contract.rules import (
    CompatPolicy,
    FailurePolicy,
    OverflowPolicy,
    RuntimeRequirements,
    Tier,
    Validators,
)
from proxy.contract.validate import standard_meta_schema
from proxy.json_schema import SchemaCompileError, Validator, check, compile_schema
from proxy.jsonshape import as_dict
from proxy.media import schema as media_schema
from proxy.module.context_spec import (
    ContextSpecError,
    context_input_schema,
    declared_in_schema,
    parse_context,
)
from proxy.module.model import Module, ModuleFormat, Strictness, ToolPolicy
from proxy.module.refs import RefError, referenced_files
from proxy.module.strictness import data_contract_schema, with_definitions
from proxy.module.tiers import LEGACY_TIER, MAX_ITEMS_BY_STRICTNESS, TIER_DEFAULTS
from proxy.textfile import UnreadableFile, read_small_text
from proxy.yamlerrors import describe

_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
MAX_MODULE_FILE_BYTES = 1024 * 1024
"""Modules load on the event loop (hot reload); the largest bundled file is 8 KB."""
NAME_RE = re.compile(r"^[a-z0-9][a-z0-9._-]{0,127}$")
_TEST_LINE = re.compile(r"^\s*(?P<input>.+\.input\.json)\s*->\s*(?P<expected>.+\.expected\.json)\s*$")
_FRONT_MATTER = re.compile(r"\A---\s*\n(?P<meta>.*?)\n---\s*(?:\n|\Z)(?P<body>.*)\Z", re.DOTALL)


class ModuleLoadError(ValueError):
    """A module that cannot be loaded; ``str()`` names its path and the reason."""

    def __init__(self, path: Path, reason: str) -> None:
        super().__init__(f"{path}: {reason}")
        self.path = path
        self.reason = reason


def valid_module_name(name: str) -> bool:
    """Module names are path-safe: no separators, no ``..``, lowercase."""
    return bool(NAME_RE.match(name)) and ".." not in name


def _read_text(path: Path) -> str:
    try:
        return read_small_text(path, MAX_MODULE_FILE_BYTES, "a module file")
    except UnreadableFile as exc:
        raise ModuleLoadError(path, exc.reason) from exc


def _read_yaml(path: Path, text: str | None = None) -> dict[str, Any]:
    try:
        doc = yaml.load(_read_text(path) if text is None else text, Loader=_LOADER)
    except yaml.YAMLError as exc:
        raise ModuleLoadError(path, describe(exc)) from exc
    if not isinstance(doc, dict):
        raise ModuleLoadError(path, "must be a YAML mapping")
    return doc


def _read_schema(path: Path, required: bool) -> dict[str, Any]:
    if not path.is_file():
        if required:
            raise ModuleLoadError(path, "missing (the module's contract)")
        return {}
    try:
        doc = orjson.loads(_read_text(path))
    except orjson.JSONDecodeError as exc:
        raise ModuleLoadError(path, f"invalid JSON: {exc}") from exc
    if not isinstance(doc, dict):
        raise ModuleLoadError(path, "must be a JSON object")
    if "data" not in doc and isinstance(doc.get("output"), dict):
        doc["data"] = doc["output"]  # spec §3.1: "output" is an alias of "data"
    return doc


@cache
def _manifest_validator() -> Validator:
    return compile_schema(schemas.load("module.yaml.schema.json"))


def _check_manifest(path: Path, manifest: dict[str, Any]) -> None:
    problems = check(_manifest_validator(), manifest, "")
    if problems:
        raise ModuleLoadError(path, "; ".join(str(p) for p in problems))


def _tests(root: Path, declared: Any) -> tuple[tuple[Path, Path], ...]:
    if isinstance(declared, list) and declared:
        pairs = []
        for line in declared:
            match = _TEST_LINE.match(str(line))
            if match:
                pairs.append((root / match["input"].strip(), root / match["expected"].strip()))
        return tuple(pairs)
    found = sorted((root / "tests").glob("*.input.json"))
    return tuple((p, p.with_name(p.name.removesuffix(".input.json") + ".expected.json")) for p in found)


def _compile(path: Path, section: str, schema: dict[str, Any], documents: dict[str, Any]) -> Validator:
    try:
        return compile_schema(schema, documents, path.name)
    except SchemaCompileError as exc:
        raise ModuleLoadError(path, f"schema.json#/{section} does not compile: {exc}") from exc


def _build(
    root: Path, manifest: dict[str, Any], prompt: str, schema: dict[str, Any], fmt: ModuleFormat
) -> Module:
    name, tier = _name_and_tier(root, manifest)
    defaults = TIER_DEFAULTS[tier]
    strictness = manifest.get("schema_strictness") or defaults.strictness
    enums = as_dict(manifest.get("enums"))
    enum_strategy = enums.get("strategy") or defaults.enum_strategy
    unknown_tag = str(enums.get("unknown_tag") or "custom")
    composition, prompt, calls = _composition(root, manifest, prompt)
    modalities = frozenset(as_dict(manifest.get("modalities")).get("input") or ("text",))
    data_schema = data_contract_schema(
        schema, strictness=strictness, enum_strategy=enum_strategy, unknown_tag=unknown_tag
    )
    validators = _validators(root, name, schema, data_schema, modalities)
    try:
        context = parse_context(manifest.get("context"), root, declared_in_schema(schema))
    except ContextSpecError as exc:
        raise ModuleLoadError(root / "module.yaml", f"module {name!r}: {exc}") from exc
    return Module(
        name=name,
        version=str(manifest.get("version", "0.0.0")),
        responsibility=str(manifest.get("responsibility", "")),
        tier=tier,
        format=fmt,
        path=root,
        prompt=prompt,
        schema=schema,
        strictness=strictness,
        enum_strategy=enum_strategy,
        unknown_tag=unknown_tag,
        overflow=_overflow(as_dict(manifest.get("overflow")), defaults.overflow_enabled, strictness),
        failure=_failure(as_dict(manifest.get("failure"))),
        compat=_compat(as_dict(manifest.get("compat")), legacy=fmt is not ModuleFormat.V22),
        risk_rule=as_dict(manifest.get("meta")).get("risk_rule", "max_changes_risk"),
        runtime=_runtime(as_dict(manifest.get("runtime_requirements"))),
        response_mode=as_dict(manifest.get("response")).get("mode") or defaults.response_mode,
        excludes=tuple(str(x) for x in manifest.get("excludes") or ()),
        tests=_tests(root, manifest.get("tests")),
        validators=validators,
        manifest=manifest,
        context=context,
        input_modalities=modalities,
        composition=composition,
        calls=calls,
        tools=_tools(as_dict(manifest.get("tools"))),
        policies=tuple((str(k), str(v)) for k, v in as_dict(manifest.get("policies")).items()),
        decision_fields=tuple(str(x) for x in as_dict(manifest.get("meta")).get("decision_fields") or ()),
    )


def _name_and_tier(root: Path, manifest: dict[str, Any]) -> tuple[str, Tier]:
    name = str(manifest.get("name", root.name))
    if not valid_module_name(name):
        raise ModuleLoadError(root, f"invalid module name {name!r} (lowercase, digits, '-', '_', '.')")
    tier = manifest.get("tier") or LEGACY_TIER
    if tier not in TIER_DEFAULTS:
        raise ModuleLoadError(root, f"tier: {tier!r} is not one of exec, decision, exploration")
    return name, tier


def _composition(
    root: Path, manifest: dict[str, Any], prompt: str
) -> tuple[Composition | None, str, tuple[CallDirective, ...]]:
    """The ``composition`` section, and the prompt without its ``@call`` directives and those."""
    try:
        composition = parse_composition(manifest.get("composition"))
        prompt, calls = parse_directives(prompt)
    except (CompositionError, DirectiveError) as exc:
        raise ModuleLoadError(root, str(exc)) from exc
    return composition, prompt, calls


def _overflow(raw: dict[str, Any], enabled: bool, strictness: Strictness) -> OverflowPolicy:
    """``overflow``: on by the tier's default, as many items as the strictness allows."""
    return OverflowPolicy(
        enabled=bool(raw.get("enabled", enabled)),
        max_items=int(raw.get("max_items", MAX_ITEMS_BY_STRICTNESS[strictness])),
        require_suggested_mapping=bool(raw.get("require_suggested_mapping", True)),
        recoverable=bool(raw.get("recoverable", True)),
    )


def _failure(raw: dict[str, Any]) -> FailurePolicy:
    defaults = FailurePolicy()
    return FailurePolicy(
        contract=raw.get("contract", defaults.contract),
        partial_allowed=bool(raw.get("partial_allowed", defaults.partial_allowed)),
        must_return_error_schema=bool(raw.get("must_return_error_schema", defaults.must_return_error_schema)),
    )


def _compat(raw: dict[str, Any], *, legacy: bool) -> CompatPolicy:
    """``compat``; v2.1 and v1 answers (``legacy``) carry no meta: they are always wrapped."""
    defaults = CompatPolicy()
    return CompatPolicy(
        accepts_v21_payload=legacy or bool(raw.get("accepts_v21_payload", defaults.accepts_v21_payload)),
        runtime_auto_wrap=legacy or bool(raw.get("runtime_auto_wrap", defaults.runtime_auto_wrap)),
        schema_output_alias=raw.get("schema_output_alias", defaults.schema_output_alias),
    )


def _runtime(raw: dict[str, Any]) -> RuntimeRequirements:
    defaults = RuntimeRequirements()
    return RuntimeRequirements(
        structured_output=bool(raw.get("structured_output", defaults.structured_output)),
        max_input_tokens=raw.get("max_input_tokens", defaults.max_input_tokens),
        preferred_capabilities=tuple(raw.get("preferred_capabilities") or defaults.preferred_capabilities),
    )


def _tools(raw: dict[str, Any]) -> ToolPolicy:
    return ToolPolicy(
        policy=raw.get("policy", ToolPolicy().policy),
        allowed=frozenset(str(t) for t in raw.get("allowed") or ()),
        denied=frozenset(str(t) for t in raw.get("denied") or ()),
    )


def _validators(
    root: Path, name: str, schema: dict[str, Any], data_schema: dict[str, Any], modalities: frozenset[str]
) -> Validators:
    """The module's four schemas compiled once, with the files their ``$ref``s name; the input
    schema's media declarations are checked against the declared modalities."""
    input_schema = media_schema.without_content_encoding(with_definitions(schema, "input"))
    meta_schema = with_definitions(schema, "meta") or standard_meta_schema()
    error_schema = with_definitions(schema, "error") or {
        "type": "object",
        "required": ["code", "message"],
        "properties": {"code": {"type": "string"}, "message": {"type": "string"}},
    }
    schema_path = root / "schema.json"
    try:
        documents = referenced_files(schema, schema_path, root)
    except RefError as exc:
        raise ModuleLoadError(exc.path, str(exc)) from exc
    problem = media_schema.check(input_schema, schema, modalities)
    if problem is not None:
        raise ModuleLoadError(root, f"module {name!r}: {problem}")
    context_schema = context_input_schema(schema)
    return Validators(
        input=_compile(schema_path, "input", input_schema, documents) if input_schema else None,
        data=_compile(schema_path, "data", data_schema, documents),
        meta=_compile(schema_path, "meta", meta_schema, documents),
        error=_compile(schema_path, "error", error_schema, documents),
        context=(
            _compile(schema_path, "input/properties/_context", context_schema, documents)
            if context_schema
            else None
        ),
    )


def _load_v2(root: Path) -> Module:
    manifest = _read_yaml(root / "module.yaml")
    prompt_path = root / "prompt.md"
    if not prompt_path.is_file():
        raise ModuleLoadError(prompt_path, "missing (the module's prompt)")
    prompt = _read_text(prompt_path)
    schema = _read_schema(root / "schema.json", required=True)
    is_v22 = isinstance(schema.get("meta"), dict) and "output" not in schema
    fmt = ModuleFormat.V22 if is_v22 else ModuleFormat.V21
    checked = manifest if "tier" in manifest or is_v22 else {**manifest, "tier": LEGACY_TIER}
    _check_manifest(root / "module.yaml", checked)
    return _build(root, manifest, prompt, schema, fmt)


def _load_v1(root: Path) -> Module:
    path = root / "MODULE.md"
    match = _FRONT_MATTER.match(_read_text(path))
    if not match:
        raise ModuleLoadError(path, "must start with YAML front matter between '---' lines")
    manifest = _read_yaml(path, match["meta"])
    for key in ("name", "version", "responsibility"):
        if not isinstance(manifest.get(key), str):
            raise ModuleLoadError(path, f"front matter: {key} is required (a string)")
    schema = _read_schema(root / "schema.json", required=False)
    return _build(root, manifest, match["body"].strip(), schema, ModuleFormat.V1)


def load_module(root: Path) -> Module:
    """Load the module in directory ``root``; raise ``ModuleLoadError`` naming path and reason."""
    if (root / "module.yaml").is_file():
        return _load_v2(root)
    if (root / "MODULE.md").is_file():
        return _load_v1(root)
    raise ModuleLoadError(root, "not a module: no module.yaml or MODULE.md")


def is_module_dir(path: Path) -> bool:
    return (path / "module.yaml").is_file() or (path / "MODULE.md").is_file()
