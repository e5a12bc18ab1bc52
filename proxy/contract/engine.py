"""The contract engine: the model's raw text + the module -> the final envelope and a record.

    raw text --parse--> object --v2.1 wrap--> envelope --validate--> ok
                                                  |  fail
                                               repair --validate--> ok (repairs recorded)
                                                  |  still fails
                                               E3001 + partial_data (the model's original data,
                                               only where failure.partial_allowed)

Output the provider reports as cut (``finish_reason: "length"``) is E2003 whatever it holds: it is
not the model's whole answer. Otherwise unparseable output is E1000 (``parse_failure``, the one
builder for every parse reason). Both are outcomes of the model's output, sent with HTTP 200 and
a suggestion for the operator. A model's own failure envelope (``ok: false``) is a valid answer
and keeps its code. Every error envelope has confidence 0.0, so routing treats it like any other
low-confidence answer.
"""

from __future__ import annotations

import asyncio
import copy
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from proxy.contract.emitted import split_emitted
from proxy.contract.errors import Code, error_envelope
from proxy.contract.parse import ParseFailure, parse_json_object
from proxy.contract.repair import Repair, repair
from proxy.contract.validate import validate_answer
from proxy.contract.wrap import wrap_v21
from proxy.json_schema import Violation

if TYPE_CHECKING:
    from proxy.contract.rules import ModuleContract

_MAX_LISTED_VIOLATIONS = 20
CUT_FINISH_REASON = "length"
"""OpenAI's finish_reason for output stopped at the token limit (Anthropic max_tokens maps to it)."""
PARSE_SUGGESTION = (
    "Operator: raise the output token limit (max_tokens), enable reask in the policy, "
    "or check that the module prompt asks for one JSON envelope"
)
# Answers longer than this are checked in a worker thread: parsing, validation and repair are
# linear, but a multi-megabyte answer still costs tens of milliseconds that would stall every
# other request (and /healthz) on the event loop. Shorter answers are cheaper inline than a hop.
OFF_LOOP_CHARS = 64 * 1024
WHOLE_ANSWER_TIERS = frozenset({"exec"})
"""Tiers whose envelope must be the whole answer (or alone in one fence). An envelope with prose
around it may quote the (prompt-injected) input rather than be the model's own answer: on a tier
that acts on the answer, that is refused rather than guessed."""
NOT_ALONE = (
    "not alone: prose surrounds the envelope, which may quote the input; the exec tier takes only "
    "an answer that is the envelope itself (or the envelope alone in one fenced block)"
)


@dataclass(frozen=True, slots=True)
class ContractResult:
    """What the engine answers with, and what happened on the way."""

    envelope: dict[str, Any]
    repairs: tuple[Repair, ...] = ()
    violations: tuple[Violation, ...] = ()
    error_code: str | None = None
    """The code of a contract failure (E1000, E2003, E3001); None when the answer passed."""
    emitted: dict[str, Any] | None = None
    """The answer's declared, valid ``_emitted_context`` (success answers only)."""

    @property
    def passed(self) -> bool:
        return self.error_code is None


def _original_data(answer: dict[str, Any]) -> dict[str, Any]:
    for key in ("data", "partial_data"):
        if isinstance(answer.get(key), dict):
            value: dict[str, Any] = answer[key]
            return value
    return answer


def allowed_partial(module: ModuleContract, data: Any) -> dict[str, Any] | None:
    """``data`` as the ``partial_data`` of a failure the proxy builds, or None when the module
    forbids it (``failure.partial_allowed: false``, spec v2.2 §0.1 failure rule 5)."""
    if not module.failure.partial_allowed or not isinstance(data, dict):
        return None
    return copy.deepcopy(data)


def _schema_failure(
    answer: dict[str, Any], violations: list[Violation], repairs: tuple[Repair, ...], module: ModuleContract
) -> ContractResult:
    first = violations[0]
    listed = violations[:_MAX_LISTED_VIOLATIONS]
    envelope = error_envelope(
        Code.SCHEMA_VALIDATION_FAILED,
        f"Model output does not match the module contract after repair: {first}"
        + (f" (and {len(violations) - 1} more)" if len(violations) > 1 else ""),
        explain=f"Output schema validation failed after repair pass: {first}",
        details={"violations": [{"path": v.path, "message": v.message, "code": v.code} for v in listed]},
        partial_data=allowed_partial(module, _original_data(answer)),
    )
    return ContractResult(envelope, repairs, tuple(violations), Code.SCHEMA_VALIDATION_FAILED)


def parse_failure(reason: str) -> ContractResult:
    """E1000 for model output that holds no usable JSON object; ``reason`` says why."""
    envelope = error_envelope(
        Code.PARSE_ERROR,
        f"The model output is not valid JSON: {reason}",
        explain=f"The model's answer could not be parsed ({reason}); not the caller's fault.",
        suggestion=PARSE_SUGGESTION,
    )
    return ContractResult(envelope, (), (Violation("", reason, "parse", Code.PARSE_ERROR),), Code.PARSE_ERROR)


def cut_output() -> ContractResult:
    """E2003: the provider stopped the output at its token limit."""
    reason = "the provider stopped the output at its token limit (finish_reason length)"
    envelope = error_envelope(
        Code.TOKEN_LIMIT,
        f"The model output is incomplete: {reason}",
        explain="The model's answer was cut at the token limit; not the caller's fault.",
    )
    return ContractResult(
        envelope, (), (Violation("", reason, "length", Code.TOKEN_LIMIT),), Code.TOKEN_LIMIT
    )


def run_contract(
    raw_text: str, module: ModuleContract, *, finish_reason: str | None = None
) -> ContractResult:
    """Turn one model answer into the envelope the caller receives."""
    if finish_reason == CUT_FINISH_REASON:
        return cut_output()
    try:
        parsed = parse_json_object(raw_text)
    except ParseFailure as exc:
        return parse_failure(exc.reason)
    if not parsed.alone and module.tier in WHOLE_ANSWER_TIERS:
        return parse_failure(NOT_ALONE)
    return check_answer(parsed.value, module, extracted=parsed.method)


async def run_contract_off_loop(
    raw_text: str, module: ModuleContract, *, finish_reason: str | None = None
) -> ContractResult:
    """``run_contract``, in a worker thread when the answer is longer than ``OFF_LOOP_CHARS``."""
    if len(raw_text) > OFF_LOOP_CHARS:
        return await asyncio.to_thread(run_contract, raw_text, module, finish_reason=finish_reason)
    return run_contract(raw_text, module, finish_reason=finish_reason)


def check_answer(
    answer: dict[str, Any], module: ModuleContract, *, extracted: str = "strict"
) -> ContractResult:
    """Stages 2-5 on an already parsed object (used by golden tests and ``run_contract``)."""
    repairs: list[Repair] = []
    if extracted != "strict":
        repairs.append(Repair("json_extracted", "", extracted))
    split = split_emitted(answer, module)
    repairs += split.repairs
    candidate = answer = split.answer
    if module.compat.auto_wrap:
        wrapped = wrap_v21(answer, module.risk_rule)
        if wrapped is not None:
            if isinstance(wrapped.get("data"), dict) and not module.keeps_confidence_in_data:
                # The confidence was promoted to meta; the module's data schema has no such field.
                wrapped["data"] = {k: v for k, v in wrapped["data"].items() if k != "confidence"}
            candidate = wrapped
            repairs.append(Repair("v21_wrapped", "", "meta promoted from data"))
    violations = validate_answer(candidate, module) + list(split.violations)
    if not violations:
        return ContractResult(candidate, tuple(repairs), emitted=_if_success(candidate, split.emitted))
    repaired, fixes = repair(candidate, module)
    if fixes:
        after = validate_answer(repaired, module) + list(split.violations)
        if not after:
            emitted = _if_success(repaired, split.emitted)
            return ContractResult(repaired, tuple(repairs + fixes), emitted=emitted)
        violations = after
    return _schema_failure(candidate, violations, tuple(repairs + fixes), module)


def _if_success(envelope: dict[str, Any], emitted: dict[str, Any] | None) -> dict[str, Any] | None:
    """Context is emitted by answers, not by failures."""
    return emitted if envelope.get("ok") is True else None
