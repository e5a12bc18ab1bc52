"""Dataflow and routing conditions (composition.md §4.3): a small grammar, parsed once at load.

    expr    := or
    or      := and ("||" and)*
    and     := unary ("&&" unary)*
    unary   := "!" unary | compare
    compare := operand (("==" | "!=" | ">=" | "<=" | ">" | "<") operand)?
    operand := path | string | number | true | false | null | "exists(" path ")" | "(" expr ")"

No ``eval``: the tree below is all that runs. Ordering compares numbers with numbers and strings
with strings; anything else is false (a missing field never satisfies ``>``). A bare operand is
true when it is present and truthy.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from proxy.compose.paths import MISSING, Path, PathError, parse_path

MAX_CONDITION_CHARS = 1000
"""A condition is one line of module.yaml."""
MAX_NESTING = 32
"""Parentheses and ``!`` deeper than this are refused at load (the parser recurses)."""

_TOKEN = re.compile(
    r"""\s*(?:
      (?P<path>\$(?:\.\.?[A-Za-z0-9_*-]+|\[[^\]]*\])*)
    | (?P<string>'(?:[^'\\]|\\.)*'|"(?:[^"\\]|\\.)*")
    | (?P<number>-?\d+(?:\.\d+)?(?:[eE][+-]?\d+)?)
    | (?P<op>==|!=|>=|<=|&&|\|\||[><!()])
    | (?P<word>[A-Za-z_]+)
    )""",
    re.VERBOSE,
)


class ConditionError(ValueError):
    """A condition that does not parse."""


Node = Callable[[Any], Any]


@dataclass(frozen=True, slots=True)
class Condition:
    text: str
    root: Node

    def holds(self, document: Any) -> bool:
        return _truthy(self.root(document))


def _truthy(value: Any) -> bool:
    return value is not MISSING and value is not None and bool(value)


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _ordered(left: Any, right: Any) -> bool:
    return (_number(left) and _number(right)) or (isinstance(left, str) and isinstance(right, str))


def _equal(left: Any, right: Any) -> bool:
    left = None if left is MISSING else left
    right = None if right is MISSING else right
    if _number(left) and _number(right):
        return bool(left == right)
    return type(left) is type(right) and bool(left == right)


_COMPARE: dict[str, Callable[[Any, Any], bool]] = {
    "==": _equal,
    "!=": lambda a, b: not _equal(a, b),
    ">": lambda a, b: _ordered(a, b) and a > b,
    "<": lambda a, b: _ordered(a, b) and a < b,
    ">=": lambda a, b: _ordered(a, b) and a >= b,
    "<=": lambda a, b: _ordered(a, b) and a <= b,
}


def _tokens(text: str) -> list[tuple[str, str]]:
    out: list[tuple[str, str]] = []
    pos = 0
    text = text.rstrip()
    while pos < len(text):
        match = _TOKEN.match(text, pos)
        if match is None or match.end() == pos:
            raise ConditionError(f"unexpected text at {pos}: {text[pos : pos + 20]!r}")
        kind = match.lastgroup or ""
        out.append((kind, match[kind]))
        pos = match.end()
    return out


class _Parser:
    def __init__(self, text: str) -> None:
        self.tokens = _tokens(text)
        self.pos = 0
        self.depth = 0

    def peek(self) -> tuple[str, str] | None:
        return self.tokens[self.pos] if self.pos < len(self.tokens) else None

    def take(self, value: str | None = None) -> tuple[str, str]:
        token = self.peek()
        if token is None or (value is not None and token[1] != value):
            raise ConditionError(f"expected {value or 'more'} at token {self.pos}")
        self.pos += 1
        return token

    def nested(self) -> None:
        self.depth += 1
        if self.depth > MAX_NESTING:
            raise ConditionError(f"nested deeper than {MAX_NESTING}")

    def expr(self) -> Node:
        return self.binary("||", self.conjunction)

    def conjunction(self) -> Node:
        return self.binary("&&", self.unary)

    def binary(self, op: str, part: Callable[[], Node]) -> Node:
        nodes = [part()]
        while (token := self.peek()) is not None and token[1] == op:
            self.take()
            nodes.append(part())
        if len(nodes) == 1:
            return nodes[0]
        if op == "||":
            return lambda doc: any(_truthy(n(doc)) for n in nodes)
        return lambda doc: all(_truthy(n(doc)) for n in nodes)

    def unary(self) -> Node:
        token = self.peek()
        if token is not None and token[1] == "!":
            self.take()
            self.nested()
            inner = self.unary()
            self.depth -= 1
            return lambda doc: not _truthy(inner(doc))
        return self.compare()

    def compare(self) -> Node:
        left = self.operand()
        token = self.peek()
        if token is None or token[1] not in _COMPARE:
            return left
        self.take()
        right = self.operand()
        test = _COMPARE[token[1]]
        return lambda doc: test(left(doc), right(doc))

    def operand(self) -> Node:
        kind, value = self.take()
        if kind == "path":
            return _path_node(value)
        if kind == "string":
            text = re.sub(r"\\(.)", r"\1", value[1:-1])
            return lambda _doc: text
        if kind == "number":
            number = float(value) if any(c in value for c in ".eE") else int(value)
            return lambda _doc: number
        if kind == "word":
            return self.word(value)
        if value == "(":
            self.nested()
            inner = self.expr()
            self.take(")")
            self.depth -= 1
            return inner
        raise ConditionError(f"unexpected {value!r}")

    def word(self, value: str) -> Node:
        constants = {"true": True, "false": False, "null": None}
        if value in constants:
            constant = constants[value]
            return lambda _doc: constant
        if value == "exists":
            self.take("(")
            kind, text = self.take()
            if kind != "path":
                raise ConditionError("exists() takes a path")
            self.take(")")
            path = _parse(text)
            return lambda doc: path.find(doc) not in (MISSING, [])
        raise ConditionError(f"unknown word {value!r}")


def _parse(text: str) -> Path:
    try:
        return parse_path(text)
    except PathError as exc:
        raise ConditionError(str(exc)) from exc


def _path_node(text: str) -> Node:
    path = _parse(text)
    return path.find


def parse_condition(text: str) -> Condition:
    """Parse ``text``; raise ``ConditionError`` naming what is wrong."""
    if len(text) > MAX_CONDITION_CHARS:
        raise ConditionError(f"longer than {MAX_CONDITION_CHARS} characters")
    parser = _Parser(text)
    if not parser.tokens:
        raise ConditionError("empty condition")
    root = parser.expr()
    if parser.peek() is not None:
        raise ConditionError(f"unexpected {parser.peek()[1]!r} after the expression")  # type: ignore[index]
    return Condition(text, root)
