"""Golden tests (``tests/*.input.json`` -> ``*.expected.json``) and the examples they carry.

An expected file is either a plain expected envelope, or the reference runtime's form
``{"$validate": {<envelope key>: <JSON Schema>, ...}, "$example": <a model answer>}``. The
examples double as the offline provider's deterministic answers.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from proxy.contract.errors import to_numeric
from proxy.contract.schema import SchemaCompileError, check, compile_schema
from proxy.jsonshape import as_dict
from proxy.module.model import Module

Executor = Callable[[Module, Any, "GoldenCase"], dict[str, Any]]
"""Runs one call (input -> final envelope); the case is passed so an offline run can use it."""

_RUNTIME_META = ("trace_id", "model", "latency_ms")


@dataclass(frozen=True, slots=True)
class GoldenCase:
    name: str
    input: Any
    expected: dict[str, Any]

    @property
    def example(self) -> Any:
        """The model answer this case carries: ``$example``, or the plain expected envelope."""
        if "$example" in self.expected:
            return self.expected["$example"]
        return None if "$validate" in self.expected else self.expected


@dataclass(frozen=True, slots=True)
class CaseOutcome:
    name: str
    problems: tuple[str, ...]
    envelope: dict[str, Any] | None = None

    @property
    def passed(self) -> bool:
        return not self.problems


def _read_json(path: Path) -> Any:
    return orjson.loads(path.read_bytes())


def load_cases(module: Module) -> tuple[list[GoldenCase], list[CaseOutcome]]:
    """The module's cases, and a failed outcome for each case whose files cannot be read."""
    cases: list[GoldenCase] = []
    broken: list[CaseOutcome] = []
    for input_path, expected_path in module.tests:
        name = input_path.name.removesuffix(".input.json")
        try:
            expected = _read_json(expected_path)
            if not isinstance(expected, dict):
                raise ValueError("the expected file must hold a JSON object")
            cases.append(GoldenCase(name, _read_json(input_path), expected))
        except (OSError, ValueError) as exc:
            broken.append(CaseOutcome(name, (f"cannot read case: {exc}",)))
    return cases, broken


def _check_rules(rules: Any, envelope: dict[str, Any]) -> list[str]:
    if not isinstance(rules, dict):
        return ["$validate must map envelope keys to JSON Schemas"]
    problems = []
    for key, schema in rules.items():
        if key not in envelope:
            problems.append(f"{key}: missing from the answer")
            continue
        try:
            validator = compile_schema(schema if isinstance(schema, dict) else {"const": schema})
        except SchemaCompileError as exc:
            problems.append(f"$validate.{key}: bad schema: {exc}")
            continue
        problems += [str(v) for v in check(validator, envelope[key], key)]
    return problems


def _compare(expected: dict[str, Any], envelope: dict[str, Any]) -> list[str]:
    problems = []

    def differ(path: str, want: Any, got: Any) -> None:
        if want != got:
            problems.append(
                f"{path}: expected {orjson.dumps(want).decode()}, got {orjson.dumps(got).decode()}"
            )

    differ("ok", expected.get("ok"), envelope.get("ok"))
    want_meta = as_dict(expected.get("meta"))
    got_meta = as_dict(envelope.get("meta"))
    for key in ("confidence", "risk"):
        if key in want_meta:
            differ(f"meta.{key}", want_meta[key], got_meta.get(key))
    if expected.get("ok") is True:
        differ("data", expected.get("data"), envelope.get("data"))
    else:
        want_err = as_dict(expected.get("error"))
        got_err = as_dict(envelope.get("error"))
        want_code, got_code = str(want_err.get("code")), str(got_err.get("code"))
        if (to_numeric(want_code) or want_code) != (to_numeric(got_code) or got_code):
            problems.append(f"error.code: expected {want_code}, got {got_code}")
        if "partial_data" in expected:
            differ("partial_data", expected["partial_data"], envelope.get("partial_data"))
    return problems


def evaluate(case: GoldenCase, envelope: dict[str, Any]) -> list[str]:
    """The ways ``envelope`` misses what ``case`` expects (empty: the case passes)."""
    if "$validate" in case.expected:
        return _check_rules(case.expected["$validate"], envelope)
    return _compare(case.expected, envelope)


def run_golden(module: Module, execute: Executor) -> list[CaseOutcome]:
    """Run every golden case of ``module`` through ``execute`` and judge the answers."""
    cases, outcomes = load_cases(module)
    for case in cases:
        envelope = execute(module, case.input, case)
        outcomes.append(CaseOutcome(case.name, tuple(evaluate(case, envelope)), envelope))
    return outcomes


def example_for(module: Module, value: Any, cases: list[GoldenCase] | None = None) -> Any:
    """The module's own example answer for ``value``: the case with an equal input, else the
    first case whose example succeeds, else None. Deterministic: the offline provider's answer."""
    if cases is None:
        cases, _ = load_cases(module)
    for case in cases:
        if case.input == value and case.example is not None:
            return case.example
    for case in cases:
        example = case.example
        if isinstance(example, dict) and example.get("ok", True) is not False:
            return example
    return None


__all__ = ["CaseOutcome", "Executor", "GoldenCase", "evaluate", "example_for", "load_cases", "run_golden"]
