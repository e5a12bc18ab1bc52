"""The Module value object: one loaded, validated module with its compiled validators."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any, Literal

from proxy.compose.directives import CallDirective
from proxy.compose.spec import Composition
from proxy.contract.rules import (
    CompatPolicy,
    FailurePolicy,
    OverflowPolicy,
    RiskRule,
    RuntimeRequirements,
    Tier,
    Validators,
)
from proxy.module.context_spec import NO_CONTEXT, ContextSpec

Strictness = Literal["high", "medium", "low"]
EnumStrategy = Literal["strict", "extensible"]
ResponseMode = Literal["sync", "streaming", "both"]


class ModuleFormat(StrEnum):
    V22 = "v2.2"
    V21 = "v2.1"
    V1 = "v1"


@dataclass(frozen=True, slots=True)
class ToolPolicy:
    """``tools`` of module.yaml: which of a client's tools may reach the model for this module."""

    policy: Literal["allow_by_default", "deny_by_default"] = "deny_by_default"
    allowed: frozenset[str] = frozenset()
    denied: frozenset[str] = frozenset()

    def permits(self, name: str) -> bool:
        if name in self.denied:
            return False
        return name in self.allowed or self.policy == "allow_by_default"


@dataclass(frozen=True, slots=True)
class Module:
    """A loaded module. Immutable: a reload builds a new one."""

    name: str
    version: str
    responsibility: str
    tier: Tier
    format: ModuleFormat
    path: Path
    prompt: str
    schema: dict[str, Any] = field(repr=False)
    """The whole schema.json document (``output`` already aliased to ``data``)."""
    strictness: Strictness
    enum_strategy: EnumStrategy
    unknown_tag: str
    overflow: OverflowPolicy
    failure: FailurePolicy
    compat: CompatPolicy
    risk_rule: RiskRule
    runtime: RuntimeRequirements
    response_mode: ResponseMode
    excludes: tuple[str, ...]
    tests: tuple[tuple[Path, Path], ...]
    validators: Validators = field(repr=False)
    manifest: dict[str, Any] = field(repr=False)
    """The manifest as written (module.yaml or MODULE.md front matter)."""
    context: ContextSpec = NO_CONTEXT
    """The ``context`` section: what the module accepts in ``_context`` and emits."""
    input_modalities: frozenset[str] = frozenset({"text"})
    """``modalities.input`` (spec v2.5 §2.2): media inputs are read only when it names more than text."""

    @property
    def takes_media(self) -> bool:
        return bool(self.input_modalities - {"text"})

    composition: Composition | None = None
    calls: tuple[CallDirective, ...] = ()
    """The prompt's ``@call`` directives (their lines are already out of ``prompt``)."""
    tools: ToolPolicy = ToolPolicy()
    decision_fields: tuple[str, ...] = ()
    """``meta.decision_fields``: the data fields a shadow judge must agree on (empty: declared none)."""
    policies: tuple[tuple[str, str], ...] = ()
    """``policies`` as declared (``network: deny``...); only declared entries are enforced."""

    @property
    def is_composite(self) -> bool:
        return self.composition is not None or bool(self.calls)

    @property
    def network_denied(self) -> bool:
        return ("network", "deny") in self.policies

    def dependencies(self) -> tuple[str, ...]:
        """Every module this one may call: composition steps, then ``@call`` targets."""
        names = list(self.composition.steps) if self.composition else []
        names += [c.name for c in self.calls]
        return tuple(dict.fromkeys(names))

    @property
    def input_schema(self) -> dict[str, Any] | None:
        value = self.schema.get("input")
        return value if isinstance(value, dict) else None

    @property
    def data_schema(self) -> dict[str, Any]:
        value = self.schema.get("data")
        return value if isinstance(value, dict) else {}

    @property
    def judged_fields(self) -> tuple[str, ...]:
        """The data fields an answer is judged on: ``meta.decision_fields``, else the fields the
        data schema marks required."""
        if self.decision_fields:
            return self.decision_fields
        required = self.data_schema.get("required")
        return tuple(str(name) for name in required) if isinstance(required, list) else ()

    @property
    def keeps_confidence_in_data(self) -> bool:
        """Whether a v2.1 payload's ``data.confidence`` stays in data after promotion to meta."""
        props = self.data_schema.get("properties")
        return not isinstance(props, dict) or "confidence" in props

    def summary(self) -> dict[str, Any]:
        """The manifest summary served by ``GET /v1/modules/{name}``."""
        return {
            "name": self.name,
            "version": self.version,
            "responsibility": self.responsibility,
            "tier": self.tier,
            "format": str(self.format),
            "schema_strictness": self.strictness,
            "enums": {"strategy": self.enum_strategy, "unknown_tag": self.unknown_tag},
            "overflow": {
                "enabled": self.overflow.enabled,
                "max_items": self.overflow.max_items,
                "require_suggested_mapping": self.overflow.require_suggested_mapping,
            },
            "failure": {"partial_allowed": self.failure.partial_allowed},
            "risk_rule": self.risk_rule,
            "response_mode": self.response_mode,
            "excludes": list(self.excludes),
            "input_schema": self.input_schema,
            "context": self.context.summary(),
            "modalities": {"input": sorted(self.input_modalities)},
            **({"composition": self._composition_summary()} if self.is_composite else {}),
        }

    def _composition_summary(self) -> dict[str, Any]:
        c = self.composition
        return {
            "pattern": c.pattern if c else "sequential",
            "requires": [
                {"name": r.name, "version": str(r.version), "optional": r.optional, "fallback": r.fallback}
                for r in (c.requires if c else ())
            ],
            "max_depth": c.max_depth if c else None,
            "timeout_ms": c.timeout_ms if c else None,
            "calls": [d.name for d in self.calls],
            "context_mode": self.context.mode,
        }
