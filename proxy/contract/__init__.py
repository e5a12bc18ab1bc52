"""The Cognitive Modules contract engine: parse, v2.1 wrap, validate, repair, error taxonomy."""

from proxy.contract.engine import ContractResult, check_answer, run_contract
from proxy.contract.repair import Repair
from proxy.contract.validate import validate_answer, validate_envelope
from proxy.json_schema import Violation

__all__ = [
    "ContractResult",
    "Repair",
    "Violation",
    "check_answer",
    "run_contract",
    "validate_answer",
    "validate_envelope",
]
