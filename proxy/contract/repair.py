"""Stage 4: the repair pass (spec v2.2 §4.1). Format only, never semantics.

What it may do: fill missing ``meta`` fields with conservative defaults, truncate
``meta.explain`` to 280 code points, trim whitespace of control-plane strings (``meta`` and
``error``), normalise enum values that differ from a declared value only by case or whitespace,
and drop a ``partial_data`` that is null or not allowed. What it never does: change a value's
type (a confidence of ``"0.85"`` stays a string and stays invalid), invent an enum value, add a
field outside ``meta``, or touch free-text business data (trimming ``data.code`` would change
indentation, i.e. behaviour). The input is not modified; the repaired copy is returned.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from proxy.contract.enums import normalize_enums
from proxy.contract.errors import EXPLAIN_MAX
from proxy.contract.risk import RISKS, aggregate_risk
from proxy.contract.wrap import NO_EXPLANATION, explain_from

if TYPE_CHECKING:
    from proxy.contract.rules import ModuleContract

DEFAULT_CONFIDENCE = 0.5
_TRIMMED_META = ("risk", "explain", "trace_id", "model")


@dataclass(frozen=True, slots=True)
class Repair:
    """One change the contract engine made to the model's answer."""

    kind: str
    path: str
    detail: str = ""


def _data_confidence(data: Any) -> float | None:
    """``data.confidence`` when it is a confidence (a number in [0, 1], not a bool), else None."""
    value = data.get("confidence") if isinstance(data, dict) else None
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value <= 1:
        return None
    return float(value)


def _fill_meta(env: dict[str, Any], meta: dict[str, Any], module: ModuleContract | None) -> list[Repair]:
    ok = env["ok"]
    data = env.get("data")
    error = env.get("error")
    out: list[Repair] = []
    if "confidence" not in meta:
        stated = _data_confidence(data) if ok else None
        if stated is not None:  # the model's own number, misplaced (the reference runtime's repair)
            meta["confidence"] = stated
            out.append(Repair("meta_default", "meta.confidence", f"{stated} from data.confidence"))
        else:
            meta["confidence"] = DEFAULT_CONFIDENCE if ok else 0.0
            out.append(Repair("meta_default", "meta.confidence", str(meta["confidence"])))
    if "risk" not in meta:
        rule = module.risk_rule if module else "max_changes_risk"
        meta["risk"] = aggregate_risk(data, rule) if ok else "high"
        out.append(Repair("meta_default", "meta.risk", f"{meta['risk']} ({rule})"))
    if "explain" not in meta:
        source = (
            data.get("rationale")
            if ok and isinstance(data, dict)
            else error.get("message")
            if isinstance(error, dict)
            else None
        )
        meta["explain"] = explain_from(source)
        detail = "from rationale" if meta["explain"] != NO_EXPLANATION else "placeholder"
        out.append(Repair("meta_default", "meta.explain", detail))
    return out


def _trim(container: dict[str, Any], keys: tuple[str, ...], prefix: str) -> list[Repair]:
    out = []
    for key in keys:
        value = container.get(key)
        if isinstance(value, str) and value != value.strip():
            container[key] = value.strip()
            out.append(Repair("whitespace_trimmed", f"{prefix}.{key}"))
    return out


def repair(
    envelope: dict[str, Any], module: ModuleContract | None = None
) -> tuple[dict[str, Any], list[Repair]]:
    """Return a repaired copy of ``envelope`` and what was changed (empty when nothing could be)."""
    env = copy.deepcopy(envelope)
    if not isinstance(env.get("ok"), bool):
        return env, []  # without ok there is no telling success from failure: not repairable
    repairs: list[Repair] = []
    if "meta" not in env:
        env["meta"] = {}
        repairs.append(Repair("meta_default", "meta", "created"))
    meta = env["meta"]
    if isinstance(meta, dict):
        repairs += _trim(meta, _TRIMMED_META, "meta")
        repairs += _fill_meta(env, meta, module)
        risk_fixes: list[str] = []
        meta["risk"] = normalize_enums(meta["risk"], {"enum": list(RISKS)}, {}, "meta.risk", risk_fixes)
        repairs += [Repair("enum_normalized", p) for p in risk_fixes]
        explain = meta.get("explain")
        if isinstance(explain, str) and len(explain) > EXPLAIN_MAX:
            # rstrip: a cut at a space would leave trailing whitespace for the next pass to trim
            meta["explain"] = explain[:EXPLAIN_MAX].rstrip()
            repairs.append(Repair("explain_truncated", "meta.explain", f"{len(explain)} -> {EXPLAIN_MAX}"))
    error = env.get("error")
    if isinstance(error, dict):
        repairs += _trim(error, ("code", "message"), "error")
    if "partial_data" in env and (
        env["partial_data"] is None or env["ok"] or (module and not module.failure.partial_allowed)
    ):
        del env["partial_data"]
        repairs.append(Repair("partial_data_removed", "partial_data"))
    if module is not None:
        fixes: list[str] = []
        if env["ok"] and "data" in env:
            env["data"] = normalize_enums(env["data"], module.data_schema, module.schema, "data", fixes)
        elif isinstance(error, dict) and isinstance(module.schema.get("error"), dict):
            env["error"] = normalize_enums(error, module.schema["error"], module.schema, "error", fixes)
        repairs += [Repair("enum_normalized", p) for p in fixes]
    return env, repairs
