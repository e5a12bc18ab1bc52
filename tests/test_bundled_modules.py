"""Every bundled module is valid (v2.2 checks for v2.2 modules) and passes its golden tests."""

from __future__ import annotations

from pathlib import Path

import pytest

from proxy.cli import offline_envelope
from proxy.module.golden import run_golden
from proxy.module.lint import lint_module
from proxy.module.loader import load_module
from proxy.module.model import ModuleFormat
from proxy.module.registry import ModuleRegistry
from tests.conftest import MODULES
from tests.paths import BUNDLED_MODULES, SHIPPED_MODULES

BUNDLED = sorted(p for p in MODULES.iterdir() if p.is_dir())
REQUIRED = {
    "code-simplifier": "decision",
    "code-reviewer": "decision",
    "config-patcher": "exec",
    "idea-explorer": "exploration",
}


def test_the_required_modules_are_bundled_with_their_tiers() -> None:
    registry = ModuleRegistry.load([MODULES])
    assert registry.problems == ()
    for name, tier in REQUIRED.items():
        assert registry.modules[name].tier == tier
    assert any(m.format is ModuleFormat.V1 for m in registry.modules.values())
    assert registry.modules["code-reviewer"].risk_rule == "max_issues_risk"
    exec_module = registry.modules["config-patcher"]
    assert (exec_module.enum_strategy, exec_module.overflow.limit) == ("strict", 0)


@pytest.mark.parametrize("path", BUNDLED, ids=[p.name for p in BUNDLED])
def test_bundled_module_is_valid(path: Path) -> None:
    v22 = load_module(path).format is ModuleFormat.V22
    assert lint_module(path, v22=v22) == ([], [])


@pytest.mark.parametrize("path", BUNDLED, ids=[p.name for p in BUNDLED])
def test_bundled_module_golden_tests_pass(path: Path) -> None:
    module = load_module(path)
    outcomes = run_golden(module, offline_envelope)
    assert len(outcomes) >= 3
    assert [(o.name, o.problems) for o in outcomes if not o.passed] == []


def test_the_suite_runs_on_its_own_copy_of_the_shipped_modules() -> None:
    """A module a user adds to modules/ is not in the copy, so it changes no test outcome."""
    assert MODULES != SHIPPED_MODULES and not MODULES.is_relative_to(SHIPPED_MODULES)
    assert sorted(p.name for p in MODULES.iterdir()) == sorted(BUNDLED_MODULES)
    for name in BUNDLED_MODULES:
        shipped = sorted(p.relative_to(SHIPPED_MODULES / name) for p in (SHIPPED_MODULES / name).rglob("*"))
        assert sorted(p.relative_to(MODULES / name) for p in (MODULES / name).rglob("*")) == shipped
