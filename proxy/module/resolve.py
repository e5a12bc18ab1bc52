"""Load-time resolution of composites against the registry (composition.md §6.2-6.4).

A composite whose required module is missing (or of an unsatisfied version), that sits on a
dependency cycle (E4004), or whose call chain is deeper than its ``max_depth`` (E4005) is not
available: it is reported with its code and reason, and the rest of the registry serves. A module
that requires an unavailable one is unavailable too (E4006 naming it).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from proxy.compose.spec import DEFAULT_MAX_DEPTH, Requirement
from proxy.module.model import Module

CIRCULAR = "E4004"
TOO_DEEP = "E4005"
NOT_INSTALLED = "E4006"
ARROW = " → "


@dataclass(frozen=True, slots=True)
class Unavailable:
    """A module that loaded but cannot run: its error code and the reason."""

    module: Module
    code: str
    reason: str


def _required(module: Module, name: str) -> bool:
    """Whether a missing ``name`` makes ``module`` unusable (optional steps and calls do not)."""
    req = module.composition.requirement(name) if module.composition else None
    if req is not None and req.optional:
        return False
    calls = [c for c in module.calls if c.name == name]
    return not (calls and all(c.optional for c in calls) and req is None)


def _problem(
    name: str, found: Module | None, req: Requirement | None, broken: Mapping[str, Unavailable]
) -> str | None:
    if name in broken:
        return f"requires module {name!r}, which is unavailable ({broken[name].code}: {broken[name].reason})"
    if found is None:
        return f"requires module {name!r}, which is not installed"
    if req is not None and not req.version.allows(found.version):
        return f"requires {name} {req.version}; installed: {found.version}"
    return None


def _missing(module: Module, modules: Mapping[str, Module], broken: Mapping[str, Unavailable]) -> str | None:
    """The first required dependency that cannot run (no usable fallback), as a reason."""
    for name in module.dependencies():
        req = module.composition.requirement(name) if module.composition else None
        problem = _problem(name, modules.get(name), req, broken)
        if problem is None or not _required(module, name):
            continue
        fallback = req.fallback if req is not None else None
        if fallback is not None and fallback in modules and fallback not in broken:
            continue
        return problem
    return None


def _cycle_from(start: str, graph: Mapping[str, tuple[str, ...]]) -> list[str] | None:
    """A dependency cycle through ``start`` as a path ``[start, ..., start]``, or None."""
    stack: list[tuple[str, int]] = [(start, 0)]
    path = [start]
    on_path = {start}
    while stack:
        node, index = stack[-1]
        edges = graph.get(node, ())
        if index >= len(edges):
            stack.pop()
            on_path.discard(path.pop())
            continue
        stack[-1] = (node, index + 1)
        nxt = edges[index]
        if nxt == start:
            return [*path, start]
        if nxt in on_path or nxt not in graph:
            continue
        stack.append((nxt, 0))
        path.append(nxt)
        on_path.add(nxt)
    return None


def _deepest(name: str, graph: Mapping[str, tuple[str, ...]], memo: dict[str, list[str]]) -> list[str]:
    """The longest call chain from ``name`` (graph acyclic here), as a list of module names."""
    if name in memo:
        return memo[name]
    best: list[str] = []
    for dep in graph.get(name, ()):
        chain = _deepest(dep, graph, memo)
        if len(chain) > len(best):
            best = chain
    memo[name] = [name, *best]
    return memo[name]


def resolve(modules: Mapping[str, Module]) -> tuple[dict[str, Module], dict[str, Unavailable]]:
    """Split ``modules`` into the runnable ones and the composites that cannot run."""
    graph = {name: tuple(d for d in m.dependencies() if d in modules) for name, m in modules.items()}
    broken: dict[str, Unavailable] = {}
    for name in sorted(graph):
        if name in broken or not graph[name]:
            continue
        cycle = _cycle_from(name, graph)
        if cycle is not None:
            message = "Circular dependency detected: " + ARROW.join(cycle)
            for member in cycle[:-1]:
                broken.setdefault(member, Unavailable(modules[member], CIRCULAR, message))
    acyclic = {n: tuple(d for d in deps if d not in broken) for n, deps in graph.items() if n not in broken}
    memo: dict[str, list[str]] = {}
    for name, module in modules.items():
        if name in broken or not module.is_composite:
            continue
        limit = module.composition.max_depth if module.composition else DEFAULT_MAX_DEPTH
        chain = _deepest(name, acyclic, memo)
        if len(chain) - 1 > limit:
            broken[name] = Unavailable(
                module, TOO_DEEP, f"Maximum composition depth ({limit}) exceeded: " + ARROW.join(chain)
            )
    changed = True
    while changed:  # a module that needs an unavailable one is unavailable too
        changed = False
        for name, module in modules.items():
            if name in broken or not module.is_composite:
                continue
            reason = _missing(module, modules, broken)
            if reason is not None:
                broken[name] = Unavailable(module, NOT_INSTALLED, reason)
                changed = True
    return {n: m for n, m in modules.items() if n not in broken}, broken
