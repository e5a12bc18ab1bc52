"""Load-time resolution: cycles (E4004 with the path), depth (E4005), missing modules and versions."""

from __future__ import annotations

from pathlib import Path

from proxy.module.lint import lint_module
from proxy.module.registry import ModuleRegistry
from tests.compose.build import make_module


def _requires(*names: str) -> dict[str, object]:
    return {"requires": [{"name": n} for n in names]}


def test_a_cycle_is_e4004_with_its_path_and_the_rest_loads(tmp_path: Path) -> None:
    make_module(tmp_path, "a", composition=_requires("b"))
    make_module(tmp_path, "b", composition=_requires("c"))
    make_module(tmp_path, "c", prompt="Check.\n@call:a($INPUT)")
    make_module(tmp_path, "plain")
    make_module(tmp_path, "user-of-a", composition=_requires("a"))
    registry = ModuleRegistry.load([tmp_path])
    assert registry.names() == ["plain"]
    a = registry.unavailable["a"]
    assert a.code == "E4004" and a.reason == "Circular dependency detected: a → b → c → a"
    assert {registry.unavailable[n].code for n in ("b", "c")} == {"E4004"}
    user = registry.unavailable["user-of-a"]
    assert user.code == "E4006" and "'a', which is unavailable (E4004" in user.reason
    assert any("E4004: Circular dependency detected: a → b → c → a" in str(p) for p in registry.problems)


def test_a_module_calling_itself_is_a_cycle(tmp_path: Path) -> None:
    make_module(tmp_path, "selfish", prompt="@call:selfish($INPUT)")
    registry = ModuleRegistry.load([tmp_path])
    assert registry.unavailable["selfish"].reason == "Circular dependency detected: selfish → selfish"


def test_a_chain_deeper_than_max_depth_is_e4005(tmp_path: Path) -> None:
    make_module(tmp_path, "m0", composition={**_requires("m1"), "max_depth": 2})
    make_module(tmp_path, "m1", composition=_requires("m2"))
    make_module(tmp_path, "m2", composition=_requires("m3"))
    make_module(tmp_path, "m3")
    registry = ModuleRegistry.load([tmp_path])
    too_deep = registry.unavailable["m0"]
    assert too_deep.code == "E4005"
    assert too_deep.reason == "Maximum composition depth (2) exceeded: m0 → m1 → m2 → m3"
    assert {"m1", "m2", "m3"} <= set(registry.names())  # m1 (depth 2, default max 5) is fine


def test_the_default_max_depth_is_five(tmp_path: Path) -> None:
    for i in range(6):
        make_module(tmp_path, f"d{i}", composition=_requires(f"d{i + 1}"))
    make_module(tmp_path, "d6")
    registry = ModuleRegistry.load([tmp_path])
    assert registry.unavailable["d0"].code == "E4005"
    assert "(5)" in registry.unavailable["d0"].reason and "d1" in registry.names()


def test_missing_and_unsatisfied_requirements(tmp_path: Path) -> None:
    make_module(tmp_path, "old", version="1.4.0")
    make_module(tmp_path, "needs-missing", composition=_requires("ghost"))
    make_module(tmp_path, "needs-new", composition={"requires": [{"name": "old", "version": ">=2.0.0"}]})
    make_module(tmp_path, "caret-ok", composition={"requires": [{"name": "old", "version": "^1.0.0"}]})
    make_module(
        tmp_path,
        "optional-missing",
        composition={"requires": [{"name": "ghost", "optional": True}]},
    )
    make_module(
        tmp_path,
        "fallback-ok",
        composition={"requires": [{"name": "ghost", "fallback": "old"}]},
    )
    registry = ModuleRegistry.load([tmp_path])
    assert registry.unavailable["needs-missing"].reason == "requires module 'ghost', which is not installed"
    assert registry.unavailable["needs-new"].reason == "requires old >=2.0.0; installed: 1.4.0"
    assert {"caret-ok", "optional-missing", "fallback-ok", "old"} <= set(registry.names())


def test_validate_reports_the_resolution_error(tmp_path: Path) -> None:
    make_module(tmp_path, "a", composition=_requires("b"))
    make_module(tmp_path, "b", composition=_requires("a"))
    make_module(tmp_path, "lonely", composition=_requires("nobody"))
    problems, _ = lint_module(tmp_path / "a")
    assert any("E4004: Circular dependency detected: a → b → a" in p for p in problems)
    problems, _ = lint_module(tmp_path / "lonely")
    assert any("E4006: requires module 'nobody', which is not installed" in p for p in problems)
