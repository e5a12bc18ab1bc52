"""Prompt rendering: $ARGUMENTS substitution and the envelope instructions."""

from __future__ import annotations

import pytest

from proxy.module.prompt import render_prompt, substitute_arguments
from tests.conftest import ModuleFactory


@pytest.mark.parametrize(
    ("template", "value", "expected"),
    [
        ("Do $ARGUMENTS now", {"$ARGUMENTS": "fix bug"}, "Do fix bug now"),
        (
            "First $ARGUMENTS[0], second $ARGUMENTS[1]",
            {"$ARGUMENTS": "alpha beta"},
            "First alpha, second beta",
        ),
        ("$0-$1", {"query": "left right"}, "left-right"),
        ("costs $5", {"query": "one"}, "costs $5"),
        ("$ARGUMENTS", {"code": "x=1"}, "x=1"),
        ("$ARGUMENTS", {"other": 1}, ""),
        ("$ARGUMENTS[3]", {"$ARGUMENTS": "a b"}, "$ARGUMENTS[3]"),
    ],
)
def test_substitution(template: str, value: dict[str, object], expected: str) -> None:
    assert substitute_arguments(template, value) == expected


def test_v22_prompt_has_envelope_instructions_schema_and_excludes(make_module: ModuleFactory) -> None:
    module = make_module(tier="decision")
    rendered = render_prompt(module, {"code": "x = 1 + 2"})
    assert "Simplify x = 1 + 2." in rendered.system
    assert "Envelope v2.2" in rendered.system
    assert "at most 5 observations" in rendered.system
    assert '"rationale"' in rendered.system
    assert "- writing files" in rendered.system
    assert '"code": "x = 1 + 2"' in rendered.user


def test_exec_prompt_forbids_overflow_and_custom_enums(make_module: ModuleFactory) -> None:
    rendered = render_prompt(make_module(tier="exec"), {"code": "x"})
    assert "overflow is disabled" in rendered.system
    assert "take only the listed values" in rendered.system
