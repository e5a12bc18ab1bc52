"""``_emitted_context``: the declared extension of the envelope through which a module emits
context (spec context-protocol §5).

It is split off the answer before the envelope is validated (the v2.2 envelope itself stays
closed), then checked against the module's ``context.emits``: it must be an object; a declared
type is validated against its emit's schema (a violation fails the answer like a data violation);
an undeclared type is dropped and recorded as a repair, never passed on. A module that declares
no emits gets no split: ``_emitted_context`` is then an unknown envelope field as before.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from proxy.contract.repair import Repair
from proxy.json_schema import Violation, check

if TYPE_CHECKING:
    from proxy.contract.rules import ModuleContract

FIELD = "_emitted_context"


@dataclass(frozen=True, slots=True)
class Split:
    answer: dict[str, Any]
    emitted: dict[str, Any] | None
    violations: tuple[Violation, ...] = ()
    repairs: tuple[Repair, ...] = ()


def split_emitted(answer: dict[str, Any], module: ModuleContract) -> Split:
    if FIELD not in answer or not module.context.emits:
        return Split(answer, None)
    rest = {k: v for k, v in answer.items() if k != FIELD}
    raw = answer[FIELD]
    if raw is None:
        return Split(rest, None)
    if not isinstance(raw, dict):
        return Split(rest, None, (Violation(FIELD, "must be an object", "type"),))
    kept: dict[str, Any] = {}
    violations: list[Violation] = []
    repairs: list[Repair] = []
    for kind, value in raw.items():
        emit = module.context.emitted(str(kind))
        if emit is None:
            repairs.append(Repair("emitted_context_dropped", f"{FIELD}.{kind}", "not in context.emits"))
            continue
        if emit.validator is not None:
            violations += check(emit.validator, value, f"{FIELD}.{kind}")
        kept[str(kind)] = value
    return Split(rest, kept or None, tuple(violations), tuple(repairs))
