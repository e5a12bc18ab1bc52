"""The composition declaration: version ranges, paths, conditions, @call directives, parse errors."""

from __future__ import annotations

from pathlib import Path

import pytest

from proxy.compose.condition import ConditionError, parse_condition
from proxy.compose.directives import DirectiveError, parse_directives
from proxy.compose.paths import MISSING, parse_path
from proxy.compose.spec import CompositionError, parse_composition
from proxy.compose.version import RangeError, parse_range
from proxy.module.loader import ModuleLoadError, load_module
from tests.compose.build import make_module


@pytest.mark.parametrize(
    ("declared", "allowed", "refused"),
    [
        ("1.0.0", ["1.0.0"], ["1.0.1", "0.9.9"]),
        (">=1.0.0", ["1.0.0", "3.2.1"], ["0.9.0"]),
        ("^1.2.0", ["1.2.0", "1.9.9"], ["2.0.0", "1.1.9"]),
        ("^0.2.3", ["0.2.3", "0.2.9"], ["0.3.0"]),
        ("~1.2.0", ["1.2.0", "1.2.7"], ["1.3.0"]),
        ("*", ["0.0.1", "9.9.9"], []),
        (">=1.0.0, <2.0.0", ["1.5.0"], ["2.0.0"]),
        ("~=1.4", ["1.4.0", "1.9.0"], ["2.0.0"]),
    ],
)
def test_version_ranges_of_composition_md_3_3(declared: str, allowed: list[str], refused: list[str]) -> None:
    rng = parse_range(declared)
    assert all(rng.allows(v) for v in allowed)
    assert not any(rng.allows(v) for v in refused)


def test_an_unreadable_range_is_refused() -> None:
    with pytest.raises(RangeError):
        parse_range(">>1")
    assert not parse_range(">=1.0.0").allows("not-a-version")


def test_mapping_paths_of_composition_md_4_2() -> None:
    doc = {"code": "x", "data": {"result": 1}, "changes": [{"risk": "low"}, {"risk": "high"}]}
    assert parse_path("$.code").find(doc) == "x"
    assert parse_path("$.data.result").find(doc) == 1
    assert parse_path("$.changes[0]").find(doc) == {"risk": "low"}
    assert parse_path("$.changes[*].risk").find(doc) == ["low", "high"]
    assert parse_path("$").find(doc) == doc
    assert parse_path("$.nope").find(doc) is MISSING
    assert parse_path("$.changes.length").find(doc) == 2


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("$.meta.confidence > 0.7", True),
        ("$.meta.confidence <= 0.7", False),
        ("$.meta.risk != 'none'", True),
        ('$.meta.risk == "low"', True),
        ("$.data.changes.length > 0", True),
        ("exists($.data.changes)", True),
        ("!exists($.data.nothing)", True),
        ("$.meta.confidence > 0.9 || $.meta.risk == 'low'", True),
        ("$.meta.confidence > 0.9 && $.meta.risk == 'low'", False),
        ("!($.meta.confidence >= 0.8)", False),
        ("$.missing > 0", False),
        ("$.meta.risk > 1", False),
        ("$.quick-check.meta.confidence > 0.5", True),
    ],
)
def test_conditions_of_composition_md_4_3(text: str, expected: bool) -> None:
    doc = {
        "meta": {"confidence": 0.8, "risk": "low"},
        "data": {"changes": [1]},
        "quick-check": {"meta": {"confidence": 0.95}},
    }
    assert parse_condition(text).holds(doc) is expected


@pytest.mark.parametrize(
    "text",
    [
        "",
        "$.a >",
        "__import__('os')",
        "$.a == 1 extra",
        "((((($.a)",
        "$.a + 1",
        "exists(1)",
        "!" * 40 + "$.a",
    ],
)
def test_a_condition_outside_the_grammar_is_refused(text: str) -> None:
    with pytest.raises(ConditionError):
        parse_condition(text)


def test_call_directives_are_parsed_and_their_lines_removed() -> None:
    prompt = (
        "Intro\n"
        "1. Analyze:\n"
        "   @call:code-analyzer($INPUT)\n"
        "2. Scan: @call:security-scanner($.code)[async, timeout=5s, optional, tier=exec]\n"
        "Risk: {{code-analyzer.meta.risk}}\n"
    )
    text, calls = parse_directives(prompt)
    assert "@call" not in text and "Risk: {{code-analyzer.meta.risk}}" in text and "Intro" in text
    assert [c.name for c in calls] == ["code-analyzer", "security-scanner"]
    assert calls[0].argument is None and calls[0].timeout_s == 30.0 and not calls[0].optional
    scan = calls[1]
    assert scan.background and scan.optional and scan.timeout_s == 5.0 and scan.tier == "exec"
    assert scan.argument is not None and scan.argument.find({"code": "c"}) == "c"


@pytest.mark.parametrize(
    "line", ["@call:x($INPUT)[forever]", "@call:x($INPUT)[timeout=0s]", "@call:Bad Name()"]
)
def test_a_malformed_directive_is_a_load_error(line: str) -> None:
    with pytest.raises(DirectiveError):
        parse_directives(line)


def test_composition_parse_errors_name_the_field() -> None:
    with pytest.raises(CompositionError, match=r"dataflow\[0\]\.condition"):
        parse_composition({"dataflow": [{"from": "input", "to": "a", "condition": "$.x >"}]})
    with pytest.raises(CompositionError, match="iterate"):
        parse_composition({"pattern": "iterative"})
    with pytest.raises(CompositionError, match="target of two steps"):
        parse_composition({"dataflow": [{"from": "input", "to": "a"}, {"from": "input", "to": "a"}]})


def test_the_loader_keeps_composition_and_directives_and_strips_directive_lines(tmp_path: Path) -> None:
    path = make_module(
        tmp_path,
        "pipe",
        prompt="Summarize.\n@call:helper($INPUT)\nHelper said {{helper.data.summary}}.",
        composition={"requires": [{"name": "helper", "version": "^1.0.0"}], "max_depth": 3},
    )
    module = load_module(path)
    assert module.is_composite and "@call" not in module.prompt
    assert module.dependencies() == ("helper",)
    assert module.composition is not None and module.composition.max_depth == 3
    assert module.summary()["composition"]["requires"][0]["version"] == "^1.0.0"


def test_a_bad_composition_is_a_load_error_naming_it(tmp_path: Path) -> None:
    path = make_module(tmp_path, "pipe", composition={"requires": [{"name": "a", "version": "^^1"}]})
    with pytest.raises(ModuleLoadError, match=r"requires\[0\]\.version"):
        load_module(path)


@pytest.mark.parametrize(
    ("requirements", "key"),
    [
        ({"max_input_tokens": 0}, "max_input_tokens"),
        ({"structured_output": "yes"}, "structured_output"),
        ({"preferred_capabilities": "vision"}, "preferred_capabilities"),
    ],
)
def test_runtime_requirements_are_validated_at_load(
    tmp_path: Path, requirements: dict[str, object], key: str
) -> None:
    """A malformed requirement is refused naming its key; an unknown preference is not (it only orders)."""
    path = make_module(tmp_path, "odd", runtime_requirements=requirements)
    with pytest.raises(ModuleLoadError, match=key):
        load_module(path)


def test_call_directives_take_the_reference_runtimes_arguments_as_the_whole_input() -> None:
    """The reference product-analyzer writes ``@call:ui-spec-generator($ARGUMENTS)``."""
    _, calls = parse_directives("@call:ui-spec-generator($ARGUMENTS)\n")
    assert [(c.name, c.argument) for c in calls] == [("ui-spec-generator", None)]


def test_a_call_without_an_argument_list_is_a_mention_left_in_the_prompt() -> None:
    prompt = "- ui_spec: from @call:ui-spec-generator (optional)\n@call:ui-spec-generator($INPUT)\n"
    text, calls = parse_directives(prompt)
    assert text == "- ui_spec: from @call:ui-spec-generator (optional)\n"
    assert [c.name for c in calls] == ["ui-spec-generator"]
