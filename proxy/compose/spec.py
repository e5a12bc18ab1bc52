"""``composition`` of module.yaml (composition.md §3-4) as frozen values, parsed once at load.

Sources and targets of a dataflow step name modules; ``input`` is the composite's input and
``output`` its answer (``name.output`` and ``name`` are the same source).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from proxy.compose.condition import Condition, ConditionError, parse_condition
from proxy.compose.paths import Path, PathError, parse_path
from proxy.compose.version import RangeError, VersionRange, parse_range

Pattern = Literal["sequential", "parallel", "conditional", "iterative"]
Aggregate = Literal["merge", "array", "first"]
ContextMode = Literal["main", "fork"]
INPUT = "input"
OUTPUT = "output"
DEFAULT_MAX_DEPTH = 5
"""composition.md §6.4 and conformance.md Level 3: the default maximum composition depth."""
DEFAULT_TIMEOUT_MS = 60000
"""composition.md §3.1: the total composition timeout when the module does not set one."""
DEFAULT_MAX_ITERATIONS = 3
MAX_ITERATIONS = 10
"""An iterative composite runs its module at most this many times, whatever it declares: each
round is a full module call (and a model bill)."""


class CompositionError(ValueError):
    """A composition declaration that cannot be used; the message names the field."""


@dataclass(frozen=True, slots=True)
class Requirement:
    name: str
    version: VersionRange
    optional: bool = False
    fallback: str | None = None
    timeout_ms: int | None = None


@dataclass(frozen=True, slots=True)
class Flow:
    """One dataflow step: from ``sources`` to ``targets``, mapped, when ``condition`` holds."""

    sources: tuple[str, ...]
    targets: tuple[str, ...]
    mapping: tuple[tuple[str, Path], ...] | None = None
    condition: Condition | None = None
    aggregate: Aggregate = "merge"

    @property
    def to_output(self) -> bool:
        return self.targets == (OUTPUT,)


@dataclass(frozen=True, slots=True)
class Route:
    condition: Condition
    next: str | None


@dataclass(frozen=True, slots=True)
class Iterate:
    module: str
    until: Condition
    max_iterations: int = DEFAULT_MAX_ITERATIONS
    mapping: tuple[tuple[str, Path], ...] | None = None


@dataclass(frozen=True, slots=True)
class Composition:
    requires: tuple[Requirement, ...] = ()
    pattern: Pattern = "sequential"
    max_depth: int = DEFAULT_MAX_DEPTH
    timeout_ms: int = DEFAULT_TIMEOUT_MS
    dataflow: tuple[Flow, ...] = ()
    routing: tuple[Route, ...] = ()
    iterate: Iterate | None = None

    def requirement(self, name: str) -> Requirement | None:
        return next((r for r in self.requires if r.name == name), None)

    @property
    def steps(self) -> tuple[str, ...]:
        """Every module the composition may run, in declaration order (fallbacks included)."""
        names: list[str] = []
        for flow in self.dataflow:
            names += [t for t in flow.targets if t != OUTPUT]
        names += [r.next for r in self.routing if r.next]
        if self.iterate is not None:
            names.append(self.iterate.module)
        for req in self.requires:
            names += [req.name] + ([req.fallback] if req.fallback else [])
        return tuple(dict.fromkeys(names))

    @property
    def produces_output(self) -> bool:
        """A pure dataflow composite: its answer is the aggregate, no model call of its own."""
        return any(f.to_output for f in self.dataflow) or bool(self.routing) or self.iterate is not None


def _names(value: Any, where: str) -> tuple[str, ...]:
    items = value if isinstance(value, list) else [value]
    out = []
    for item in items:
        if not isinstance(item, str) or not item:
            raise CompositionError(f"{where}: names a module, 'input' or 'output' (got {item!r})")
        out.append(item.removesuffix(".output"))
    return tuple(out)


def _mapping(raw: Any, where: str) -> tuple[tuple[str, Path], ...] | None:
    if raw is None:
        return None
    if not isinstance(raw, dict):
        raise CompositionError(f"{where}: must be a mapping of field -> JSONPath")
    try:
        return tuple((str(k), parse_path(str(v))) for k, v in raw.items())
    except PathError as exc:
        raise CompositionError(f"{where}: {exc}") from exc


def _condition(raw: Any, where: str) -> Condition | None:
    if raw is None:
        return None
    try:
        return parse_condition(str(raw))
    except ConditionError as exc:
        raise CompositionError(f"{where}: {exc}") from exc


def _flow(raw: Mapping[str, Any], i: int) -> Flow:
    where = f"composition.dataflow[{i}]"
    aggregate = raw.get("aggregate", "merge")
    if aggregate not in ("merge", "array", "first"):
        raise CompositionError(f"{where}.aggregate: {aggregate!r} is not merge, array or first")
    sources = _names(raw.get("from"), f"{where}.from")
    targets = _names(raw.get("to"), f"{where}.to")
    if OUTPUT in sources:
        raise CompositionError(f"{where}.from: 'output' is where data ends, not a source")
    if OUTPUT in targets and len(targets) > 1:
        raise CompositionError(f"{where}.to: 'output' cannot share a step with modules")
    if INPUT in targets:
        raise CompositionError(f"{where}.to: 'input' is not a target")
    return Flow(
        sources,
        targets,
        _mapping(raw.get("mapping"), f"{where}.mapping"),
        _condition(raw.get("condition"), f"{where}.condition"),
        aggregate,
    )


def _requirement(raw: Mapping[str, Any], i: int) -> Requirement:
    where = f"composition.requires[{i}]"
    try:
        version = parse_range(raw.get("version"))
    except RangeError as exc:
        raise CompositionError(f"{where}.version: {exc}") from exc
    fallback = raw.get("fallback")
    return Requirement(
        str(raw["name"]),
        version,
        bool(raw.get("optional", False)),
        str(fallback) if fallback else None,
        raw.get("timeout_ms"),
    )


def _iterate(raw: Any) -> Iterate | None:
    if raw is None:
        return None
    if not isinstance(raw, dict) or not isinstance(raw.get("module"), str) or "until" not in raw:
        raise CompositionError("composition.iterate: needs module and until")
    rounds = raw.get("max_iterations", DEFAULT_MAX_ITERATIONS)
    if not isinstance(rounds, int) or not 1 <= rounds <= MAX_ITERATIONS:
        raise CompositionError(f"composition.iterate.max_iterations: 1..{MAX_ITERATIONS}")
    until = _condition(raw["until"], "composition.iterate.until")
    assert until is not None
    return Iterate(raw["module"], until, rounds, _mapping(raw.get("mapping"), "composition.iterate.mapping"))


def parse_composition(raw: Any) -> Composition | None:
    """The ``composition`` section (already checked against the manifest schema), or None."""
    if not isinstance(raw, dict):
        return None
    flows = tuple(_flow(f, i) for i, f in enumerate(raw.get("dataflow") or ()))
    routes = []
    for i, route in enumerate(raw.get("routing") or ()):
        condition = _condition(route.get("condition"), f"composition.routing[{i}].condition")
        if condition is None:
            raise CompositionError(f"composition.routing[{i}]: needs a condition")
        routes.append(Route(condition, route.get("next")))
    composition = Composition(
        requires=tuple(_requirement(r, i) for i, r in enumerate(raw.get("requires") or ())),
        pattern=raw.get("pattern", "sequential"),
        max_depth=int(raw.get("max_depth", DEFAULT_MAX_DEPTH)),
        timeout_ms=int(raw.get("timeout_ms", DEFAULT_TIMEOUT_MS)),
        dataflow=flows,
        routing=tuple(routes),
        iterate=_iterate(raw.get("iterate")),
    )
    if composition.pattern == "iterative" and composition.iterate is None:
        raise CompositionError("composition: pattern iterative needs an iterate section")
    if composition.pattern == "conditional" and not composition.routing:
        raise CompositionError("composition: pattern conditional needs routing")
    seen: set[str] = set()
    for flow in flows:
        for target in flow.targets:
            if target != OUTPUT and target in seen:
                raise CompositionError(f"composition.dataflow: module {target!r} is the target of two steps")
            seen.add(target)
    return composition
