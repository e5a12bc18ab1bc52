"""The reference runtime's seven example modules (vendored in tests/data/reference_modules, see its
README.md) load unchanged and serve through the proxy, and its repair cases that are spec
behaviour hold (the ones that are not are listed in that README with the decision)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from proxy.contract.repair import repair as repair_envelope
from proxy.module.loader import load_module
from proxy.module.model import Module
from proxy.module.registry import ModuleRegistry
from proxy.module.sample import sample
from tests.fake_upstream import FakeUpstream
from tests.proxy_server import UPSTREAM_KEY, UPSTREAM_KEY_ENV, running_proxy, upstream_policy

REFERENCE = Path(__file__).resolve().parents[1] / "data" / "reference_modules"
NAMES = (
    "api-designer",
    "code-reviewer",
    "code-simplifier",
    "product-analyzer",
    "task-prioritizer",
    "ui-component-generator",
    "ui-spec-generator",
)


def _answer(module: Module) -> str:
    data = sample(module.data_schema, module.schema)
    return json.dumps(
        {"ok": True, "meta": {"confidence": 0.95, "risk": "low", "explain": "ok"}, "data": data}
    )


def _input(module: Module) -> Any:
    example = module.path / "examples" / "input.json"
    if example.is_file():
        return json.loads(example.read_text(encoding="utf-8"))
    cases = sorted((module.path / "tests").glob("*.input.json"))
    if cases:
        return json.loads(cases[0].read_text(encoding="utf-8"))
    return sample(module.schema["input"], module.schema)


def test_all_seven_load_without_a_problem() -> None:
    registry = ModuleRegistry.load([REFERENCE])
    assert tuple(registry.names()) == NAMES and not registry.problems
    analyzer = registry.modules["product-analyzer"]
    assert analyzer.context.mode == "fork"  # `context: fork`, the plain form
    assert [c.name for c in analyzer.calls] == ["ui-spec-generator"]  # `@call:x($ARGUMENTS)`
    assert "code_generation" in registry.modules["ui-component-generator"].runtime.unknown_capabilities


async def test_all_seven_serve_an_explicit_sync_request(
    fake_upstream: FakeUpstream, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each answers 200 ok; the exploration ones (no response: block) answer the sync they were asked."""
    monkeypatch.setenv(UPSTREAM_KEY_ENV, UPSTREAM_KEY)
    registry = ModuleRegistry.load([REFERENCE])
    async with (
        running_proxy(tmp_path, upstream_policy(fake_upstream), modules=(REFERENCE,)) as px,
        aiohttp.ClientSession() as session,
    ):
        for name in NAMES:
            module = registry.modules[name]
            for callee in module.calls:
                fake_upstream.script("cheap", _answer(registry.modules[callee.name]))
            fake_upstream.script("cheap", _answer(module))
            resp = await session.post(
                f"{px.url}/v1/modules/{name}/execute",
                json={"input": _input(module)},
                headers={"X-Cognitive-Response-Mode": "sync"},
            )
            body = await resp.json()
            assert (name, resp.status, body.get("ok")) == (name, 200, True), body


def _reference_module() -> Module:
    return load_module(REFERENCE / "code-simplifier")


def test_repair_fills_a_missing_meta() -> None:
    """Reference test_add_missing_meta."""
    repaired, _ = repair_envelope(
        {"ok": True, "data": {"rationale": "r", "result": "x"}}, _reference_module()
    )
    assert set(repaired["meta"]) >= {"confidence", "risk", "explain"}


def test_repair_takes_confidence_from_data_when_meta_lacks_it() -> None:
    """Reference test_fill_confidence_from_data: the model's own number, moved, never invented."""
    answer = {"ok": True, "meta": {}, "data": {"confidence": 0.85, "rationale": "test"}}
    repaired, repairs = repair_envelope(answer, _reference_module())
    assert repaired["meta"]["confidence"] == 0.85
    assert any("confidence" in str(r) for r in repairs)


@pytest.mark.parametrize("value", [1.5, -0.1, True, "0.9", None])
def test_a_data_confidence_that_is_no_confidence_is_not_taken(value: Any) -> None:
    answer = {"ok": True, "meta": {}, "data": {"confidence": value, "rationale": "test"}}
    repaired, _ = repair_envelope(answer, _reference_module())
    assert repaired["meta"]["confidence"] != value or value is None


def test_repair_trims_and_lowercases_risk_and_trims_explain() -> None:
    """Reference test_trim_whitespace_from_risk and test_trim_whitespace_from_explain (a MAY: done)."""
    answer = {"ok": True, "meta": {"confidence": 0.9, "risk": "  LOW  ", "explain": "  e  "}, "data": {}}
    repaired, _ = repair_envelope(answer, _reference_module())
    assert (repaired["meta"]["risk"], repaired["meta"]["explain"]) == ("low", "e")
