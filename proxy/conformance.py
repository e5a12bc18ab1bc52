"""``cogproxy conformance``: the official envelope test vectors through the proxy's validator."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from proxy.contract.errors import Code
from proxy.contract.validate import validate_envelope

OFFICIAL_VECTORS = Path(__file__).resolve().parent / "vectors"
"""The official v2.2 envelope vectors, vendored as package data (see ``vectors/SOURCE.md``)."""


@dataclass(frozen=True, slots=True)
class VectorOutcome:
    path: Path
    name: str
    problem: str | None

    @property
    def passed(self) -> bool:
        return self.problem is None


def _judge(vector: Any) -> tuple[str, str | None]:
    if not isinstance(vector, dict) or not isinstance(vector.get("$test"), dict) or "envelope" not in vector:
        return "?", "not a test vector (needs $test and envelope)"
    test = vector["$test"]
    name = str(test.get("name", "?"))
    expects = test.get("expects")
    violations = validate_envelope(vector["envelope"])
    if expects == "accept":
        return name, (f"should be accepted, was rejected: {violations[0]}" if violations else None)
    if expects == "reject":
        if not violations:
            return name, "should be rejected, was accepted"
        # The envelope-level code is always E3001 (spec §4.1); specific codes are details.
        wanted = test.get("error_codes") or []
        codes = {Code.SCHEMA_VALIDATION_FAILED.value} | {v.code for v in violations}
        if wanted and not codes & set(wanted):
            return name, f"rejected with {sorted(codes)}, expected one of {wanted}"
        return name, None
    return name, f"$test.expects must be accept or reject, not {expects!r}"


def run_vectors(directory: Path) -> list[VectorOutcome]:
    """Judge every ``*.json`` vector below ``directory``, in path order."""
    outcomes = []
    for path in sorted(directory.rglob("*.json")):
        try:
            vector = orjson.loads(path.read_bytes())
        except (OSError, orjson.JSONDecodeError) as exc:
            outcomes.append(VectorOutcome(path, path.stem, f"unreadable: {exc}"))
            continue
        name, problem = _judge(vector)
        outcomes.append(VectorOutcome(path, name, problem))
    return outcomes
