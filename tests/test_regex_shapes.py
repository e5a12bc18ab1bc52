"""No backtracking regex on bytes someone else controls (issue #26): every regular expression in
``proxy/`` is read from the source and parsed, and none may hold a lazy quantifier or a quantified
group that holds another variable quantifier — the two shapes that make Python's backtracking
engine super-linear (the PDF page count and the ``{{step.path}}`` reference regex were both) —
unless it is listed in ``TRUSTED_ONLY`` with the reason only an operator or a module author
writes what it reads. A regex added anywhere is checked without anyone remembering to.

THREAT_MODEL.md lists the parsers of untrusted bytes and their cost tests; this is the net under
them."""

from __future__ import annotations

import ast
import re._parser as sre  # type: ignore[import-not-found]  # the stdlib's own regex parser (3.11+)
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

PROXY = Path(__file__).resolve().parent.parent / "proxy"
_FUNCTIONS = {"compile", "match", "search", "fullmatch", "findall", "finditer", "sub", "subn", "split"}

TRUSTED_ONLY: dict[tuple[str, str], str] = {
    ("module/loader.py", "_FRONT_MATTER"): "prompt.md front matter: a module author's file, read at load",
    (
        "compose/condition.py",
        "_TOKEN",
    ): "composition conditions: a module.yaml line, <= 1000 characters",
}
"""(file, variable or pattern) -> why every text it reads is the operator's or a module author's."""


def patterns() -> Iterator[tuple[str, str, str | bytes]]:
    """(file, the variable it is bound to or the pattern itself, pattern) for every literal regex."""
    for path in sorted(PROXY.rglob("*.py")):
        tree = ast.parse(path.read_text())
        names: dict[int, str] = {}
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Assign)
                and len(node.targets) == 1
                and isinstance(node.targets[0], ast.Name)
            ):
                names[id(node.value)] = node.targets[0].id
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and isinstance(node.func.value, ast.Name)
                and node.func.value.id == "re"
                and node.func.attr in _FUNCTIONS
                and node.args
            ):
                arg = node.args[0]
                text: Any = arg.value if isinstance(arg, ast.Constant) else ast.unparse(arg)
                yield str(path.relative_to(PROXY)), names.get(id(node), str(text)), text


def _repeats(parsed: Any) -> Iterator[tuple[Any, Any]]:
    for op, av in parsed:
        if op in (sre.MAX_REPEAT, sre.MIN_REPEAT, sre.POSSESSIVE_REPEAT):
            yield op, av
            yield from _repeats(av[2])
        elif op is sre.SUBPATTERN:
            yield from _repeats(av[3])
        elif op is sre.BRANCH:
            for branch in av[1]:
                yield from _repeats(branch)
        elif op in (sre.ASSERT, sre.ASSERT_NOT):
            yield from _repeats(av[1])


def problems(pattern: str | bytes) -> list[str]:
    """The super-linear shapes in ``pattern``: lazy quantifiers, variable repeats inside repeats."""
    found = []
    for op, (low, high, body) in _repeats(sre.parse(pattern)):
        if op is sre.MIN_REPEAT:
            found.append("lazy quantifier")
        elif high > 1 and low != high and any(lo != hi for _, (lo, hi, _) in _repeats(body)):
            # (an optional group, ``(...)?``, runs at most once: nothing to multiply)
            found.append("a variable repeat inside a variable repeat")
    return found


ALL = list(patterns())


def test_the_source_scan_sees_the_regexes() -> None:
    assert len(ALL) > 20 and any(name == "_TRACEPARENT" for _, name, _ in ALL)


@pytest.mark.parametrize(("file", "name", "pattern"), ALL, ids=[f"{f}:{n}"[:80] for f, n, _ in ALL])
def test_no_regex_backtracks_on_text_someone_else_controls(file: str, name: str, pattern: Any) -> None:
    if not isinstance(pattern, (str, bytes)):
        pytest.fail(f"{file}: {name} is not a literal pattern; make it one so this test can read it")
    found = problems(pattern)
    if (file, name) in TRUSTED_ONLY:
        assert found, f"{file}:{name} is linear now: drop it from TRUSTED_ONLY"
        return
    assert not found, f"{file}:{name} {pattern!r}: {found}"


@pytest.mark.parametrize(
    ("pattern", "shape"),
    [
        (rb"/Type\s*/Pages\b[^>]*?/Count\s+(\d+)", "lazy quantifier"),  # the PDF page count of 0.3
        (r"(a+)+$", "a variable repeat inside a variable repeat"),
        (r"(?:\.[A-Za-z0-9_-]+)*", "a variable repeat inside a variable repeat"),
    ],
)
def test_the_shapes_that_stalled_are_caught(pattern: Any, shape: str) -> None:
    assert shape in problems(pattern)


def test_fixed_count_repeats_inside_a_repeat_are_linear() -> None:
    assert problems(r"(?:[A-Za-z]|%[0-9A-Fa-f]{2})*") == []
