"""Stage 2: v2.1 auto-wrap (spec v2.2 §4.2, §6.3).

A payload without ``ok``/``meta`` becomes a v2.2 envelope (a bare ``{"error": {...}}`` becomes a
failure envelope). ``meta`` is promoted from the data:
confidence from ``data.confidence`` (0.5 if none), risk by the module's risk rule (the default
rule is ``max(data.changes[*].risk)``, "medium" if none), explain from the first 200 characters
of ``data.rationale`` ("No explanation provided" if none). Values are copied, never coerced: a
confidence of ``"high"`` is promoted as is and fails validation afterwards.
"""

from __future__ import annotations

from typing import Any

from proxy.contract.risk import aggregate_risk

WRAP_EXPLAIN_CHARS = 200
NO_EXPLANATION = "No explanation provided"


def explain_from(text: Any) -> str:
    """``text[:200]`` when it is a non-empty string, else the spec's placeholder."""
    if isinstance(text, str) and text.strip():
        return text.strip()[:WRAP_EXPLAIN_CHARS]
    return NO_EXPLANATION


def is_v22_envelope(payload: dict[str, Any]) -> bool:
    return isinstance(payload.get("ok"), bool) and "meta" in payload


def wrap_v21(payload: dict[str, Any], risk_rule: str = "max_changes_risk") -> dict[str, Any] | None:
    """The v2.2 envelope for a v2.1 payload, or None when ``payload`` already is v2.2."""
    if is_v22_envelope(payload) or ("ok" in payload and not isinstance(payload["ok"], bool)):
        return None
    ok = payload.get("ok")
    # A legacy bare answer {"error": {...}} (no ok) is a failure, as in the reference runtime.
    legacy_error = ok is None and isinstance(payload.get("error"), dict) and "data" not in payload
    if ok is False or legacy_error:
        error = payload.get("error")
        message = error.get("message") if isinstance(error, dict) else None
        envelope: dict[str, Any] = {
            "ok": False,
            "meta": {"confidence": 0.0, "risk": "high", "explain": explain_from(message)},
            "error": error,
        }
        if "partial_data" in payload:
            envelope["partial_data"] = payload["partial_data"]
        return envelope
    # {"ok": true, "data": {...}} and {"data": {...}} carry the payload under data; anything
    # else without "ok" is a bare v2.1/v1 payload.
    data = payload.get("data", payload) if ok is True or set(payload) == {"data"} else payload
    meta: dict[str, Any] = {"confidence": 0.5, "risk": aggregate_risk(data, risk_rule)}
    if isinstance(data, dict):
        if "confidence" in data:
            meta["confidence"] = data["confidence"]
        meta["explain"] = explain_from(data.get("rationale"))
    else:
        meta["explain"] = NO_EXPLANATION
    return {"ok": True, "meta": meta, "data": data}
