"""``cogproxy validate``: the module checks of module-format.md, one message per problem.

Problems make a module invalid; warnings (``warning: ...``) are printed but do not.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from proxy.contract.engine import check_answer
from proxy.contract.errors import EXPLAIN_MAX
from proxy.contract.risk import rule_risk
from proxy.json_schema import SchemaCompileError, check, compile_schema
from proxy.jsonshape import as_dict, as_list
from proxy.module.golden import DECISIONS, GoldenCase, load_cases
from proxy.module.loader import ModuleLoadError, load_module
from proxy.module.model import Module, ModuleFormat
from proxy.module.registry import ModuleRegistry

_ENVELOPE_WORDS = ("meta", "confidence", "risk", "explain", "data", "rationale")


def _v22_problems(module: Module) -> list[str]:
    out: list[str] = []
    manifest = module.manifest
    yaml_path = module.path / "module.yaml"
    if module.format is not ModuleFormat.V22:
        out.append(
            f"{module.path}: is a {module.format} module; v2.2 needs module.yaml, "
            "prompt.md and schema.json with meta and data"
        )
    for key in ("tier", "overflow", "enums"):
        if key not in manifest:
            out.append(f"{yaml_path}: {key} is missing (v2.2 declares it explicitly)")
    schema_path = module.path / "schema.json"
    meta: Any = module.schema.get("meta")
    if not isinstance(meta, dict):
        out.append(f"{schema_path}: meta schema is missing")
    else:
        props = as_dict(meta.get("properties"))
        required = as_list(meta.get("required"))
        for field in ("confidence", "risk", "explain"):
            if field not in props or field not in required:
                out.append(f"{schema_path}: meta.{field} must be declared and required")
        limit = as_dict(props.get("explain")).get("maxLength")
        if not isinstance(limit, int) or limit > EXPLAIN_MAX:
            out.append(f"{schema_path}: meta.explain needs maxLength <= {EXPLAIN_MAX} (has {limit})")
    data = module.data_schema
    data_props = as_dict(data.get("properties"))
    data_required = as_list(data.get("required"))
    if "rationale" not in data_props or "rationale" not in data_required:
        out.append(f"{schema_path}: data.rationale must be declared and required")
    elif as_dict(data_props["rationale"]).get("type") != "string":
        out.append(f"{schema_path}: data.rationale must be of type string")
    prompt = module.prompt.lower()
    missing = [w for w in _ENVELOPE_WORDS if w not in prompt]
    if missing:
        out.append(
            f"{module.path / 'prompt.md'}: does not explain the v2.2 envelope "
            f"(never mentions {', '.join(missing)})"
        )
    return out


def _case_problems(module: Module, case: GoldenCase, input_path: Path, expected_path: Path) -> list[str]:
    """The case's input against the input schema; its example answer against the contract."""
    out: list[str] = []
    if module.validators.input is not None:
        out += [f"{input_path}: {v}" for v in check(module.validators.input, case.input, "input")]
    rules = case.expected.get("$validate")
    if isinstance(rules, dict):
        for key, schema in rules.items():
            try:
                compile_schema(schema if isinstance(schema, dict) else {"const": schema})
            except SchemaCompileError as exc:
                out.append(f"{expected_path}: $validate.{key}: does not compile: {exc}")
    example = case.example
    if example is None:
        return out
    where = "$example." if "$example" in case.expected else ""
    if not isinstance(example, dict):
        return [*out, f"{expected_path}: {where or 'the expected answer '}must be a JSON object"]
    result = check_answer(example, module)
    out += [f"{expected_path}: {where}{v}" for v in result.violations]
    out += [f"{expected_path}: {p}" for p in _decision_problems(case)]
    return out + [f"{expected_path}: {where}{p}" for p in _risk_rule_problems(module, example)]


def _decision_problems(case: GoldenCase) -> list[str]:
    value = case.expected.get("$decision", None)
    if value is None or value in DECISIONS:
        return []
    return [f"$decision must be one of {', '.join(DECISIONS)} (has {value!r})"]


def _risk_rule_problems(module: Module, example: dict[str, Any]) -> list[str]:
    """An example whose ``meta.risk`` disagrees with the module's ``risk_rule`` over its own data:
    the router decides on the higher of the two by default, so the example would not route the way
    it reads (a newcomer's "why did this go to review?")."""
    declared = as_dict(example.get("meta")).get("risk")
    computed = rule_risk(example.get("data"), module.risk_rule)
    if computed is None or not isinstance(declared, str) or declared == computed:
        return []
    return [
        f"meta.risk is {declared!r} but the module's risk_rule {module.risk_rule} over data gives "
        f"{computed!r} (policy risk_source decides which one routes: default the higher)"
    ]


def _test_problems(module: Module) -> tuple[list[str], list[str]]:
    """Problems of the golden tests, and warnings (no tests at all)."""
    if not module.tests:
        return [], [
            f"warning: {module.path}: no golden tests (list them under tests: in module.yaml, "
            "or add tests/NAME.input.json with tests/NAME.expected.json)"
        ]
    out = []
    for input_path, expected_path in module.tests:
        out += [f"{p}: golden test file is missing" for p in (input_path, expected_path) if not p.is_file()]
    if out:
        return out, []
    cases, broken = load_cases(module)
    out += [f"{module.path / 'tests' / o.name}: {o.problems[0]}" for o in broken]
    paths = {i.name.removesuffix(".input.json"): (i, e) for i, e in module.tests}
    for case in cases:
        out += _case_problems(module, case, *paths[case.name])
    return out, []


def _composition_problems(module: Module) -> list[str]:
    """A composite resolved against the modules beside it (its directory's parent): a missing or
    too old dependency, a cycle (E4004) or a chain deeper than ``max_depth`` (E4005)."""
    if not module.is_composite:
        return []
    registry = ModuleRegistry.load([module.path.parent])
    unavailable = registry.unavailable_module(module.name)
    if unavailable is None:
        return []
    return [f"{module.path / 'module.yaml'}: {unavailable.code}: {unavailable.reason}"]


def lint_module(path: Path, *, v22: bool = False) -> tuple[list[str], list[str]]:
    """Every problem of the module at ``path`` (empty when it is valid), and the warnings."""
    try:
        module = load_module(path)
    except ModuleLoadError as exc:
        return [str(exc)], []
    problems, warnings = _test_problems(module)
    warnings += [
        f"warning: {path / 'module.yaml'}: runtime_requirements.preferred_capabilities: {c!r} is not "
        "a capability a policy target can declare (recorded; it orders no target)"
        for c in module.runtime.unknown_capabilities
    ]
    problems = _composition_problems(module) + problems
    if v22:
        problems = _v22_problems(module) + problems
    return problems, warnings
