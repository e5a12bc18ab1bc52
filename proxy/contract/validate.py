"""Stage 3: validation of an envelope against the v2.2 envelope contract and a module's schemas.

``validate_envelope`` is the module-independent, normative check (spec §0.1 success/failure
rules, the shipped ``response-envelope.schema.json``, non-empty ``data.rationale``); the
``conformance`` command runs the official vectors through it. ``validate_answer`` adds the
module's meta/data/error schemas (compiled at load with the tier's strictness) and the overflow
rules. Every failure is a ``Violation`` whose ``code`` is the most specific taxonomy code; the
envelope the caller sees still carries E3001 (spec §4.1), the specific codes go in its details.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from typing import TYPE_CHECKING, Any

from proxy import schemas
from proxy.contract.errors import Code
from proxy.json_schema import Validator, Violation, check, compile_schema

if TYPE_CHECKING:
    from proxy.contract.rules import ModuleContract

SUCCESS_KEYS = frozenset({"ok", "meta", "data"})
FAILURE_KEYS = frozenset({"ok", "meta", "error", "partial_data"})


@dataclass(frozen=True, slots=True)
class StandardValidators:
    success: Validator
    """The normative envelope's ``oneOf`` branch for ``ok: true`` (``SuccessEnvelope``)."""
    failure: Validator
    """Its branch for ``ok: false`` (``FailureEnvelope``)."""
    meta: Validator
    data: Validator
    error: Validator


def _definition(doc: dict[str, Any], name: str) -> dict[str, Any]:
    return {"definitions": doc["definitions"], "$ref": f"#/definitions/{name}"}


@cache
def standard() -> StandardValidators:
    """The normative validators, compiled once per process from the shipped envelope schema."""
    doc = schemas.load("response-envelope.schema.json")
    return StandardValidators(
        success=compile_schema(_definition(doc, "SuccessEnvelope")),
        failure=compile_schema(_definition(doc, "FailureEnvelope")),
        meta=compile_schema(_definition(doc, "Meta")),
        data=compile_schema(_definition(doc, "Data")),
        error=compile_schema(_definition(doc, "Error")),
    )


def standard_meta_schema() -> dict[str, Any]:
    """The standard meta schema (spec §3.2), used for modules that declare none."""
    meta: dict[str, Any] = schemas.load("response-envelope.schema.json")["definitions"]["Meta"]
    return meta


def _classify(v: Violation) -> Violation:
    code = Code.SCHEMA_VALIDATION_FAILED
    if v.path == "data.rationale" or (v.path == "data" and "'rationale'" in v.message):
        code = Code.MISSING_RATIONALE
    elif v.rule == "enum":
        code = Code.INVALID_ENUM
    elif v.rule == "maxItems" and v.path.endswith("extensions.insights"):
        code = Code.OVERFLOW_LIMIT
    if code == v.code:
        return v
    return Violation(v.path, v.message, v.rule, code)


def _shape(envelope: dict[str, Any]) -> list[Violation]:
    """Spec §0.1: which top-level fields a success or failure envelope must and must not have."""
    out: list[Violation] = []
    ok = envelope.get("ok")
    if "ok" not in envelope:
        out.append(Violation("ok", "is required", "required"))
    elif not isinstance(ok, bool):
        out.append(Violation("ok", "must be a boolean", "type"))
    if "meta" not in envelope:
        out.append(Violation("meta", "is required", "required"))
    if ok is True:
        if "data" not in envelope:
            out.append(Violation("data", "is required when ok is true", "required"))
        out += [
            Violation(k, "must not be present when ok is true", "additionalProperties")
            for k in ("error", "partial_data")
            if k in envelope
        ]
        allowed = SUCCESS_KEYS
    elif ok is False:
        if "error" not in envelope:
            out.append(Violation("error", "is required when ok is false", "required"))
        if "data" in envelope:
            out.append(
                Violation(
                    "data",
                    "must not be present when ok is false (use partial_data)",
                    "additionalProperties",
                )
            )
        allowed = FAILURE_KEYS
    else:
        allowed = SUCCESS_KEYS | FAILURE_KEYS
    out += [
        Violation(k, "is not a field of the v2.2 envelope", "additionalProperties")
        for k in envelope
        if k not in allowed and k not in ("data", "error", "partial_data")
    ]
    return out


def validate_envelope(envelope: Any) -> list[Violation]:
    """Normative envelope check; an empty list means the envelope is valid v2.2."""
    if not isinstance(envelope, dict):
        return [Violation("", "the envelope must be a JSON object", "type")]
    std = standard()
    out = _shape(envelope)
    if "meta" in envelope:
        out += check(std.meta, envelope["meta"], "meta")
    ok = envelope.get("ok")
    if ok is True and "data" in envelope:
        data = envelope["data"]
        out += check(std.data, data, "data")
        rationale = data.get("rationale") if isinstance(data, dict) else None
        if isinstance(rationale, str) and not rationale.strip():
            out.append(Violation("data.rationale", "must not be empty", "minLength"))
    if ok is False and "error" in envelope:
        out += check(std.error, envelope["error"], "error")
    if "partial_data" in envelope and not isinstance(envelope["partial_data"], dict):
        out.append(Violation("partial_data", "must be an object (omit it instead of null)", "type"))
    if not out:
        # Backstop: the normative schema must agree with the piecewise checks above. Its oneOf
        # branches hold ``ok`` to ``const`` true and false, and ``ok`` is a boolean here (else
        # ``_shape`` objected): only ``ok``'s branch can match, the one checked (a third of the cost).
        out += check(std.success if ok is True else std.failure, envelope, "")
    return [_classify(v) for v in out]


def _overflow(data: dict[str, Any], module: ModuleContract) -> list[Violation]:
    extensions = data.get("extensions")
    insights = extensions.get("insights") if isinstance(extensions, dict) else None
    if not isinstance(insights, list):
        return []
    out: list[Violation] = []
    limit = module.overflow.limit
    if len(insights) > limit:
        why = (
            f"overflow.max_items is {limit}"
            if module.overflow.enabled
            else "overflow is disabled for this module"
        )
        out.append(
            Violation(
                "data.extensions.insights",
                f"has {len(insights)} insights; {why}",
                "maxItems",
                Code.OVERFLOW_LIMIT,
            )
        )
    if module.overflow.require_suggested_mapping:
        for i, insight in enumerate(insights):
            mapping = insight.get("suggested_mapping") if isinstance(insight, dict) else None
            if not (isinstance(mapping, str) and mapping.strip()):
                out.append(
                    Violation(
                        f"data.extensions.insights[{i}].suggested_mapping",
                        "is required (overflow.require_suggested_mapping)",
                        "required",
                    )
                )
    return out


def validate_answer(envelope: Any, module: ModuleContract) -> list[Violation]:
    """Envelope rules plus the module's own contract; empty means the answer is valid."""
    out = validate_envelope(envelope)
    if not isinstance(envelope, dict):
        return out
    v = module.validators
    if isinstance(envelope.get("meta"), dict):
        out += check(v.meta, envelope["meta"], "meta")
    ok = envelope.get("ok")
    if ok is True and "data" in envelope:
        out += check(v.data, envelope["data"], "data")
        if isinstance(envelope["data"], dict):
            out += _overflow(envelope["data"], module)
    elif ok is False:
        if "error" in envelope and module.failure.must_return_error_schema:
            out += check(v.error, envelope["error"], "error")
        if "partial_data" in envelope and not module.failure.partial_allowed:
            out.append(
                Violation(
                    "partial_data",
                    "is not allowed (failure.partial_allowed is false)",
                    "additionalProperties",
                )
            )
    seen: set[tuple[str, str]] = set()
    unique = []
    for item in map(_classify, out):
        # The envelope schema and the module schema often report the same field twice.
        if (item.path, item.rule) not in seen:
            seen.add((item.path, item.rule))
            unique.append(item)
    return unique
