"""Loading v2.2, v2.1 and v1 modules; tier defaults; the registry's error reporting."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from proxy.json_schema import check
from proxy.module.loader import ModuleLoadError, load_module
from proxy.module.model import ModuleFormat
from proxy.module.registry import ModuleRegistry
from tests.conftest import SCHEMA, ModuleFactory, write_module
from tests.support.unreadable import UNREADABLE_SHAPES


@pytest.mark.parametrize(
    ("tier", "strictness", "strategy", "overflow_enabled", "max_items", "mode"),
    [
        ("exec", "high", "strict", False, 0, "sync"),
        ("decision", "medium", "extensible", True, 5, "both"),
        ("exploration", "low", "extensible", True, 20, "streaming"),
    ],
)
def test_tier_defaults_apply_when_manifest_is_silent(
    make_module: ModuleFactory,
    tier: str,
    strictness: str,
    strategy: str,
    overflow_enabled: bool,
    max_items: int,
    mode: str,
) -> None:
    module = make_module(tier=tier)
    assert module.format is ModuleFormat.V22
    assert (module.strictness, module.enum_strategy) == (strictness, strategy)
    assert (module.overflow.enabled, module.overflow.max_items) == (overflow_enabled, max_items)
    assert module.response_mode == mode


def test_explicit_manifest_values_win(make_module: ModuleFactory) -> None:
    module = make_module(
        tier="exec",
        schema_strictness="low",
        enums={"strategy": "extensible"},
        overflow={"enabled": True, "max_items": 3},
        response={"mode": "both"},
    )
    assert module.strictness == "low"
    assert module.enum_strategy == "extensible"
    assert module.overflow.limit == 3
    assert module.response_mode == "both"


def test_failure_compat_and_risk_rule_are_read(make_module: ModuleFactory) -> None:
    module = make_module(
        failure={"partial_allowed": False},
        meta={"risk_rule": "max_issues_risk"},
        compat={"accepts_v21_payload": True},
    )
    assert module.failure.partial_allowed is False
    assert module.risk_rule == "max_issues_risk"
    assert module.compat.auto_wrap


def test_v21_module_with_output_schema(tmp_path: Path) -> None:
    schema = {
        "input": SCHEMA["input"],
        "output": {
            "type": "object",
            "required": ["result", "confidence", "rationale"],
            "properties": {
                "result": {"type": "string"},
                "confidence": {"type": "number"},
                "rationale": {"type": "string"},
            },
        },
    }
    path = write_module(tmp_path, "legacy21", manifest={"tier": None}, schema=schema)
    module = load_module(path)
    assert module.format is ModuleFormat.V21
    assert module.tier == "decision"
    assert module.compat.auto_wrap
    assert module.data_schema["required"] == ["result", "confidence", "rationale"]


def test_v1_module_from_module_md(tmp_path: Path) -> None:
    path = tmp_path / "summarize"
    path.mkdir()
    (path / "MODULE.md").write_text(
        "---\nname: summarize\nversion: 1.0.0\nresponsibility: Summarise text\n"
        "excludes: [inventing facts]\n---\n"
        "# Summarize\nSummarise $ARGUMENTS.\n",
        encoding="utf-8",
    )
    (path / "schema.json").write_text(
        json.dumps(
            {
                "input": {"type": "object"},
                "output": {
                    "type": "object",
                    "required": ["summary", "rationale"],
                    "properties": {"summary": {"type": "string"}, "rationale": {"type": "string"}},
                },
            }
        )
    )
    module = load_module(path)
    assert module.format is ModuleFormat.V1
    assert module.prompt.startswith("# Summarize")
    assert module.excludes == ("inventing facts",)
    assert module.compat.auto_wrap


@pytest.mark.parametrize(
    ("break_it", "reason"),
    [
        (lambda p: (p / "module.yaml").write_text("name: [unclosed"), "invalid YAML"),
        (lambda p: (p / "module.yaml").write_text("- a list"), "must be a YAML mapping"),
        (lambda p: (p / "schema.json").write_text("{nope"), "invalid JSON"),
        (lambda p: (p / "schema.json").unlink(), "missing"),
        (lambda p: (p / "prompt.md").unlink(), "missing"),
        (
            lambda p: (p / "module.yaml").write_text(
                "name: Bad_Name\nversion: 1.0.0\nresponsibility: r\ntier: exec\n"
            ),
            "name",
        ),
        (
            lambda p: (p / "module.yaml").write_text("name: ok\nversion: 1\nresponsibility: r\ntier: exec\n"),
            "version",
        ),
        (
            lambda p: (p / "module.yaml").write_text(
                "name: ok\nversion: 1.0.0\nresponsibility: r\ntier: wild\n"
            ),
            "tier",
        ),
        (
            lambda p: (p / "schema.json").write_text(json.dumps({**SCHEMA, "data": {"type": "nonsense"}})),
            "schema.json#/data",
        ),
        (
            lambda p: (p / "schema.json").write_text(
                json.dumps({**SCHEMA, "data": {"$ref": "https://example.com/s.json"}})
            ),
            "$ref at #/data/$ref",
        ),
    ],
)
def test_broken_module_names_path_and_reason(tmp_path: Path, break_it: Any, reason: str) -> None:
    path = write_module(tmp_path, "broken")
    break_it(path)
    with pytest.raises(ModuleLoadError) as info:
        load_module(path)
    assert str(path) in str(info.value)
    assert reason in str(info.value)


def test_registry_loads_the_good_and_reports_the_broken(tmp_path: Path) -> None:
    write_module(tmp_path, "good-one")
    write_module(tmp_path, "good-two")
    bad = write_module(tmp_path, "bad")
    (bad / "schema.json").write_text("{")
    (tmp_path / "not-a-module").mkdir()
    registry = ModuleRegistry.load([tmp_path])
    assert registry.names() == ["good-one", "good-two"]
    assert [(p.path.name, "invalid JSON" in p.reason) for p in registry.problems] == [
        ("schema.json", True),
        ("not-a-module", False),
    ]


def test_registry_first_directory_wins_on_duplicate_names(tmp_path: Path) -> None:
    first, second = tmp_path / "a", tmp_path / "b"
    write_module(first, "same")
    write_module(second, "same")
    registry = ModuleRegistry.load([first, second])
    assert registry.modules["same"].path == first / "same"
    assert "duplicate module name" in registry.problems[0].reason


@pytest.mark.parametrize("name", ["../etc", "a/b", "..", "", "UPPER", "a\\b", "x..y"])
def test_registry_refuses_unsafe_names(tmp_path: Path, name: str) -> None:
    write_module(tmp_path, "safe")
    registry = ModuleRegistry.load([tmp_path])
    assert registry.get(name) is None
    assert registry.get("safe") is not None


def test_a_directory_that_is_itself_a_module(tmp_path: Path) -> None:
    path = write_module(tmp_path, "solo")
    assert ModuleRegistry.load([path]).names() == ["solo"]


def test_missing_directory_is_a_problem_not_a_crash(tmp_path: Path) -> None:
    registry = ModuleRegistry.load([tmp_path / "nowhere"])
    assert registry.names() == [] and "not a directory" in registry.problems[0].reason


def _with_ref(path: Path, ref: str) -> None:
    schema = json.loads((path / "schema.json").read_text())
    schema["data"]["properties"]["extra"] = {"$ref": ref}
    (path / "schema.json").write_text(json.dumps(schema))


def test_relative_file_refs_inside_the_module_are_resolved_locally(tmp_path: Path) -> None:
    path = write_module(tmp_path, "reffy")
    (path / "defs").mkdir()
    (path / "defs" / "types.json").write_text(
        json.dumps({"definitions": {"id": {"$ref": "#/definitions/short"}, "short": {"maxLength": 3}}})
    )
    _with_ref(path, "defs/types.json#/definitions/id")
    module = load_module(path)

    def paths(extra: str) -> list[str]:
        return [p.path for p in check(module.validators.data, {"extra": extra}, "data")]

    assert "data.extra" not in paths("abc")
    assert "data.extra" in paths("abcdef")


@pytest.mark.parametrize(
    "ref",
    [
        "URL:http://127.0.0.1:9/x.json",
        "http://127.0.0.1:9/x.json",
        "file:///etc/passwd",
        "//127.0.0.1/x.json",
        "/etc/passwd",
        "../outside.json",
        "defs/../../outside.json",
        "escape.json",
        "missing.json",
    ],
)
def test_every_other_ref_is_a_load_error_naming_the_key(tmp_path: Path, ref: str) -> None:
    (tmp_path / "outside.json").write_text("{}")
    path = write_module(tmp_path, "reffy")
    (path / "escape.json").symlink_to(tmp_path / "outside.json")
    _with_ref(path, ref)
    with pytest.raises(ModuleLoadError) as info:
        load_module(path)
    assert str(path / "schema.json") in str(info.value)
    assert "$ref at #/data/properties/extra/$ref" in str(info.value)


def test_a_ref_inside_a_referenced_file_is_checked_too(tmp_path: Path) -> None:
    path = write_module(tmp_path, "reffy")
    (path / "types.json").write_text(json.dumps({"$ref": "http://127.0.0.1:9/x.json"}))
    _with_ref(path, "types.json")
    with pytest.raises(ModuleLoadError) as info:
        load_module(path)
    assert str(path / "types.json") in str(info.value) and "$ref at #/$ref" in str(info.value)


def test_a_property_named_ref_is_not_a_reference(tmp_path: Path) -> None:
    path = write_module(tmp_path, "reffy")
    schema = json.loads((path / "schema.json").read_text())
    schema["data"]["properties"]["$ref"] = {"type": "string"}
    (path / "schema.json").write_text(json.dumps(schema))
    assert load_module(path).name == "reffy"
    schema["data"]["properties"]["kind"] = {"enum": [{"$ref": "http://x"}]}  # the compiler follows it
    (path / "schema.json").write_text(json.dumps(schema))
    with pytest.raises(ModuleLoadError, match=r"\$ref at #/data/properties/kind/enum/0/\$ref"):
        load_module(path)


@pytest.mark.parametrize("name", ["module.yaml", "prompt.md"])
@pytest.mark.parametrize("shape", UNREADABLE_SHAPES)
def test_an_unreadable_module_file_is_a_load_error_naming_it(tmp_path: Path, name: str, shape: str) -> None:
    """A FIFO would block the reload forever, ``/dev/zero`` would fill memory: each is refused."""
    path = write_module(tmp_path, "m")
    (path / name).unlink()
    UNREADABLE_SHAPES[shape][0](path / name)
    with pytest.raises(ModuleLoadError) as info:
        load_module(path)
    assert str(info.value).startswith(str(path))  # the file, or the module it leaves without a manifest


@pytest.mark.parametrize("mode", ["fork", "main"])
def test_context_written_as_a_plain_mode_is_that_mode(make_module: ModuleFactory, mode: str) -> None:
    """conformance.md writes ``context: fork``; the object form ``context: {mode: fork}`` is the same."""
    plain = make_module(context=mode)
    spelled = make_module(context={"mode": mode})
    assert plain.context.mode == spelled.context.mode == mode
    assert not plain.context.declared


@pytest.mark.parametrize("value", ["share", "", 3, ["fork"]])
def test_a_plain_context_that_is_no_mode_is_refused_naming_the_modes(tmp_path: Path, value: Any) -> None:
    path = write_module(tmp_path, "ctx", manifest={"context": value})
    with pytest.raises(ModuleLoadError, match=r"context"):
        load_module(path)


def test_an_unknown_preferred_capability_loads_is_recorded_and_warned(tmp_path: Path) -> None:
    """Preferences never refuse a module (the reference ui-component-generator prefers code_generation)."""
    from proxy.module.lint import lint_module

    path = write_module(
        tmp_path,
        "prefers",
        manifest={"runtime_requirements": {"preferred_capabilities": ["json_mode", "code_generation"]}},
    )
    module = load_module(path)
    assert module.runtime.preferred_capabilities == ("json_mode", "code_generation")
    assert module.runtime.unknown_capabilities == ("code_generation",)
    problems, warnings = lint_module(path)
    assert not [p for p in problems if "preferred" in p]
    assert any("code_generation" in w and w.startswith("warning:") for w in warnings)
