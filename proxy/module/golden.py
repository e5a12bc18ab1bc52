"""Golden tests (``tests/*.input.json`` -> ``*.expected.json``) and the examples they carry.

An expected file is either a plain expected envelope, or the reference runtime's form
``{"$validate": {<envelope key>: <JSON Schema>, ...}, "$example": <a model answer>}``. The
examples double as the offline provider's deterministic answers. Either form may name the routing
decision the case expects, ``"$decision": "accept" | "escalated" | "review" | "reject"``: checked
when a policy routes the call (``cogproxy test --policy``), where there is a decision to check.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from proxy.contract.errors import to_numeric
from proxy.json_schema import SchemaCompileError, check, compile_schema
from proxy.jsonshape import as_dict, as_list
from proxy.module.model import Module

Executor = Callable[[Module, Any, "GoldenCase"], dict[str, Any]]
"""Runs one call (input -> final envelope); the case is passed so an offline run can use it."""

_RUNTIME_META = ("trace_id", "model", "latency_ms")
_MAX_DIFFS = 10  # enough to see the pattern of a wrong answer without flooding the terminal
_PATH_PART = re.compile(r"([^.\[\]]+)|\[(\d+)\]")
_MISSING = object()
DECISIONS = ("accept", "escalated", "review", "reject")
"""The decisions a module answer reports (``X-Cognitive-Decision``), which ``$decision`` may name."""


@dataclass(frozen=True, slots=True)
class GoldenCase:
    name: str
    input: Any
    expected: dict[str, Any]

    @property
    def decision(self) -> str | None:
        """The routing decision the case expects (``$decision``), if it names one."""
        value = self.expected.get("$decision")
        return value if isinstance(value, str) else None

    @property
    def example(self) -> Any:
        """The model answer this case carries: ``$example``, or the plain expected envelope."""
        if "$example" in self.expected:
            return self.expected["$example"]
        if "$validate" in self.expected:
            return None
        return {k: v for k, v in self.expected.items() if k != "$decision"}


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


def _show(value: Any) -> str:
    return "nothing" if value is _MISSING else orjson.dumps(value).decode()


def _value_at(document: Any, path: str) -> Any:
    """The value at a violation path such as ``data.issues[0].line`` (``_MISSING`` if none)."""
    node = document
    for name, index in _PATH_PART.findall(path):
        if name and isinstance(node, dict) and name in node:
            node = node[name]
        elif index and isinstance(node, list) and int(index) < len(node):
            node = node[int(index)]
        else:
            return _MISSING
    return node


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
        problems += [
            f"{v} (got {_show(_value_at(envelope, v.path))})" for v in check(validator, envelope[key], key)
        ]
    return problems


def _diff(path: str, want: Any, got: Any, out: list[str]) -> None:
    """Every leaf where ``got`` differs from ``want``, named by its path."""
    if len(out) >= _MAX_DIFFS or want == got:
        return
    if isinstance(want, dict) and isinstance(got, dict):
        for key in [*want, *(k for k in got if k not in want)]:
            _diff(f"{path}.{key}", want.get(key, _MISSING), got.get(key, _MISSING), out)
    elif isinstance(want, list) and isinstance(got, list) and len(want) == len(got):
        for i, (w, g) in enumerate(zip(want, got, strict=True)):
            _diff(f"{path}[{i}]", w, g, out)
    else:
        out.append(f"{path}: expected {_show(want)}, got {_show(got)}")


def _compare(expected: dict[str, Any], envelope: dict[str, Any]) -> list[str]:
    problems: list[str] = []
    _diff("ok", expected.get("ok"), envelope.get("ok"), problems)
    want_meta = as_dict(expected.get("meta"))
    got_meta = as_dict(envelope.get("meta"))
    for key in ("confidence", "risk"):
        if key in want_meta:
            _diff(f"meta.{key}", want_meta[key], got_meta.get(key, _MISSING), problems)
    if expected.get("ok") is True:
        _diff("data", expected.get("data", _MISSING), envelope.get("data", _MISSING), problems)
    else:
        want_err = as_dict(expected.get("error"))
        got_err = as_dict(envelope.get("error"))
        want_code, got_code = str(want_err.get("code")), str(got_err.get("code"))
        if (to_numeric(want_code) or want_code) != (to_numeric(got_code) or got_code):
            problems.append(f"error.code: expected {want_code}, got {got_code}")
        if "partial_data" in expected:
            _diff("partial_data", expected["partial_data"], envelope.get("partial_data", _MISSING), problems)
    return problems


def _expects_success(expected: dict[str, Any]) -> bool:
    if "$validate" in expected:
        rule = as_dict(expected["$validate"]).get("ok")
        return rule is True or as_dict(rule).get("const") is True
    return expected.get("ok") is True


def _failure_cause(envelope: dict[str, Any]) -> list[str]:
    """Why the answer is an error envelope: each contract violation, else the error itself."""
    error = as_dict(envelope.get("error"))
    code = error.get("code", "?")
    violations = [as_dict(v) for v in as_list(as_dict(error.get("details")).get("violations"))]
    if violations:
        return [f"contract ({code}): {v.get('path') or '(envelope)'}: {v.get('message')}" for v in violations]
    return [f"the answer is an error ({code}): {error.get('message')}"]


def evaluate(case: GoldenCase, envelope: dict[str, Any], decision: str | None = None) -> list[str]:
    """The ways ``envelope`` (decided ``decision``, when a policy routed it) misses what ``case``
    expects (empty: the case passes). When a success was expected and the answer is an error, the
    error's cause comes first."""
    if "$validate" in case.expected:
        problems = _check_rules(case.expected["$validate"], envelope)
    else:
        problems = _compare(case.expected, envelope)
    if decision is not None and case.decision is not None and case.decision != decision:
        problems.append(f"decision: expected {case.decision}, got {decision}")
    if problems and _expects_success(case.expected) and envelope.get("ok") is False:
        problems = _failure_cause(envelope) + problems
    return problems


def run_golden(module: Module, execute: Executor) -> list[CaseOutcome]:
    """Run every golden case of ``module`` through ``execute`` and judge the answers."""
    cases, outcomes = load_cases(module)
    for case in cases:
        envelope = execute(module, case.input, case)
        outcomes.append(CaseOutcome(case.name, tuple(evaluate(case, envelope)), envelope))
    return outcomes


def example_for(module: Module, value: Any, cases: list[GoldenCase] | None = None) -> Any:
    """The example answer of the golden case whose input equals ``value``, else None."""
    if cases is None:
        cases, _ = load_cases(module)
    for case in cases:
        if case.input == value and case.example is not None:
            return case.example
    return None


__all__ = ["CaseOutcome", "Executor", "GoldenCase", "evaluate", "example_for", "load_cases", "run_golden"]
