"""What the contract engine needs of a module: its schemas, validators and declared rules.

The engine is typed against the ``ModuleContract`` protocol, not ``proxy.module.model.Module``, so
the contract layer never imports the module layer above it; a loaded ``Module`` satisfies the
protocol structurally. The rule value types live here and ``proxy.module.model`` builds on them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal, Protocol

from proxy.json_schema import Validator

Tier = Literal["exec", "decision", "exploration"]
RiskRule = Literal["max_changes_risk", "max_issues_risk", "explicit", "custom_function"]


@dataclass(frozen=True, slots=True)
class OverflowPolicy:
    enabled: bool
    max_items: int
    require_suggested_mapping: bool
    recoverable: bool = True

    @property
    def limit(self) -> int:
        """How many insights are allowed: 0 when overflow is disabled."""
        return self.max_items if self.enabled else 0


@dataclass(frozen=True, slots=True)
class FailurePolicy:
    contract: Literal["error_union", "throw"] = "error_union"
    partial_allowed: bool = True
    must_return_error_schema: bool = True


@dataclass(frozen=True, slots=True)
class CompatPolicy:
    accepts_v21_payload: bool = False
    runtime_auto_wrap: bool = False
    schema_output_alias: Literal["data", "output"] = "data"

    @property
    def auto_wrap(self) -> bool:
        return self.accepts_v21_payload or self.runtime_auto_wrap


KNOWN_PREFERENCES = ("json_mode", "long_context", "function_calling", "vision")
"""The ``preferred_capabilities`` a policy target can be declared to have (policy ``capabilities:``)."""


@dataclass(frozen=True, slots=True)
class RuntimeRequirements:
    structured_output: bool = True
    max_input_tokens: int | None = None
    preferred_capabilities: tuple[str, ...] = ()

    @property
    def unknown_capabilities(self) -> tuple[str, ...]:
        """Preferences no target can be declared to have: recorded, warned about, never refused."""
        return tuple(c for c in self.preferred_capabilities if c not in KNOWN_PREFERENCES)


@dataclass(frozen=True, slots=True)
class Validators:
    """Schemas compiled once at load; never per request."""

    input: Validator | None
    data: Validator
    meta: Validator
    error: Validator
    context: Validator | None = None
    """``schema.json#/input/properties/_context`` (context-protocol §3.2), applied to ``_context``."""


class EmitSchema(Protocol):
    """One declared ``context.emits`` entry, as far as the contract checks it."""

    @property
    def validator(self) -> Validator | None: ...


class EmitRules(Protocol):
    """A module's ``context`` section, as far as the contract checks ``_emitted_context``."""

    @property
    def emits(self) -> Sequence[object]: ...

    def emitted(self, kind: str) -> EmitSchema | None: ...


class ModuleContract(Protocol):
    """The narrow view of a module that parse/wrap/validate/repair read."""

    @property
    def name(self) -> str: ...
    @property
    def tier(self) -> Tier: ...
    @property
    def schema(self) -> dict[str, Any]: ...
    @property
    def data_schema(self) -> dict[str, Any]: ...
    @property
    def keeps_confidence_in_data(self) -> bool: ...
    @property
    def overflow(self) -> OverflowPolicy: ...
    @property
    def failure(self) -> FailurePolicy: ...
    @property
    def compat(self) -> CompatPolicy: ...
    @property
    def risk_rule(self) -> RiskRule: ...
    @property
    def runtime(self) -> RuntimeRequirements: ...
    @property
    def validators(self) -> Validators: ...
    @property
    def context(self) -> EmitRules: ...
