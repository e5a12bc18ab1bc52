"""Small v2.2 modules written to a temporary directory, for composition tests."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml

DATA_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["rationale"],
    "properties": {
        "rationale": {"type": "string"},
        "summary": {"type": "string"},
        "findings": {"type": "array", "items": {"type": "string"}},
        "score": {"type": "number"},
    },
}


def make_module(
    root: Path,
    name: str,
    *,
    version: str = "1.0.0",
    tier: str = "exploration",
    prompt: str = "Do the task. Answer with the envelope: meta confidence risk explain, data rationale.",
    **manifest: Any,
) -> Path:
    """Write module ``name`` under ``root``; extra keyword arguments go into module.yaml."""
    path = root / name
    path.mkdir(parents=True, exist_ok=True)
    doc = {
        "name": name,
        "version": version,
        "responsibility": f"test module {name}",
        "tier": tier,
        "schema_strictness": "low",
        "overflow": {"enabled": False},
        "enums": {"strategy": "strict"},
        "meta": {"risk_rule": "explicit"},
        **manifest,
    }
    (path / "module.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))
    (path / "prompt.md").write_text(prompt + "\n")
    schema = {
        "meta": {
            "type": "object",
            "required": ["confidence", "risk", "explain"],
            "properties": {
                "confidence": {"type": "number", "minimum": 0, "maximum": 1},
                "risk": {"type": "string", "enum": ["none", "low", "medium", "high"]},
                "explain": {"type": "string", "maxLength": 280},
            },
        },
        "input": {"type": "object"},
        "data": DATA_SCHEMA,
    }
    (path / "schema.json").write_text(json.dumps(schema))
    return path


def answer(confidence: float, risk: str = "low", **data: Any) -> str:
    """A v2.2 envelope as a model would write it."""
    return json.dumps(
        {
            "ok": True,
            "meta": {"confidence": confidence, "risk": risk, "explain": "e"},
            "data": {"rationale": "because", **data},
        }
    )
