"""The Cognitive Modules error taxonomy (error-codes.md) and the one mapping code -> HTTP status.

Every error the proxy answers with is built here: ``error_envelope`` gives the v2.2 failure
envelope with the recommended confidence/risk for the code's category, ``recoverable`` and a
``suggestion`` from the taxonomy, and ``http_status`` is the only place a code becomes a status.

A status says what the proxy and the caller did, never what a model wrote: an envelope's
``Origin`` decides whether its code is looked up at all (a model's own failure envelope, or the
contract's verdict on the model's output, is an outcome of a module that ran: 200).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Any

EXPLAIN_MAX = 280  # meta.explain: the spec's bound
# Schema violations of a caller's input: named in the error message (readable in one line), and
# listed in ``error.details.violations`` (enough to fix a whole object, bounded for a hostile one).
MESSAGE_VIOLATIONS_MAX = 10
DETAIL_VIOLATIONS_MAX = 20


class Origin(StrEnum):
    """Who produced a module answer's final envelope."""

    CALLER = "caller"
    """The request broke the module's input contract (E1xxx) or was not a JSON object."""
    MODEL = "model"
    """The model's own answer, success or failure envelope, as it passed the contract."""
    CONTRACT = "contract"
    """The contract's verdict on the model's output (E1000 unparseable, E2003 cut, E3001)."""
    POLICY = "policy"
    """The routing policy refused the answer (E2001)."""
    RUNTIME = "runtime"
    """The proxy or its providers (E2002 deadline, E4000 internal, E4001/E4002 providers)."""


_MODULE_RAN = frozenset({Origin.MODEL, Origin.CONTRACT})


class Category(StrEnum):
    INPUT = "input"
    PROCESSING = "processing"
    OUTPUT = "output"
    RUNTIME = "runtime"


@dataclass(frozen=True, slots=True)
class ErrorSpec:
    """One row of the taxonomy."""

    code: str
    name: str
    description: str
    recoverable: bool | None  # None: "Maybe" in the taxonomy; the field is then left out
    http_status: int
    suggestion: str | None = None

    @property
    def category(self) -> Category:
        return _CATEGORY_BY_DIGIT[self.code[1]]


_CATEGORY_BY_DIGIT = {
    "1": Category.INPUT,
    "2": Category.PROCESSING,
    "3": Category.OUTPUT,
    "4": Category.RUNTIME,
}

_SPECS = (
    ErrorSpec(
        "E1000", "PARSE_ERROR", "JSON parsing failed", False, 400, "Send a body that is one JSON object"
    ),
    ErrorSpec(
        "E1001",
        "INVALID_INPUT",
        "Input does not match schema",
        True,
        400,
        "Fix the input so that it matches the module's input schema",
    ),
    ErrorSpec(
        "E1002",
        "MISSING_REQUIRED_FIELD",
        "Required field is missing",
        True,
        400,
        "Add the missing field to the input",
    ),
    ErrorSpec(
        "E1003",
        "TYPE_MISMATCH",
        "Field type does not match schema",
        True,
        400,
        "Send the field with the type the input schema declares",
    ),
    ErrorSpec("E1004", "UNSUPPORTED_VALUE", "Value not supported", None, 400),
    ErrorSpec(
        "E1005",
        "INPUT_TOO_LARGE",
        "Input exceeds max_input_tokens",
        True,
        400,
        "Shorten the input or split it into several calls",
    ),
    ErrorSpec("E1006", "INVALID_REFERENCE", "Referenced resource not found", True, 400),
    # spec v2.5 §7.1 (E1010-E1013, E4011) and §4.5.2-§4.5.3 (E1014-E1017, named here: the spec
    # gives their codes and meanings but no names).
    ErrorSpec(
        "E1010",
        "UNSUPPORTED_MEDIA_TYPE",
        "Media type not supported by module",
        True,
        415,
        "Send one of the media types the module's modalities allow",
    ),
    ErrorSpec("E1011", "MEDIA_TOO_LARGE", "Media exceeds size limit", True, 413, "Send smaller media"),
    ErrorSpec(
        "E1012",
        "MEDIA_FETCH_FAILED",
        "Failed to fetch media from URL",
        True,
        422,
        "Send a public https URL, or the media inline as base64",
    ),
    ErrorSpec("E1013", "MEDIA_DECODE_FAILED", "Failed to decode base64 media", True, 400),
    ErrorSpec(
        "E1014",
        "MEDIA_TYPE_MISMATCH",
        "Media content does not match declared type",
        True,
        415,
        "Declare the media type the content really has",
    ),
    ErrorSpec("E1015", "MEDIA_DIMENSIONS_TOO_LARGE", "Image width or height above 8192", True, 400),
    ErrorSpec("E1016", "MEDIA_DIMENSIONS_TOO_SMALL", "Image width or height below 10", True, 400),
    ErrorSpec("E1017", "MEDIA_TOO_MANY_PIXELS", "Image has more than 67,108,864 pixels", True, 400),
    ErrorSpec(
        "E2001",
        "LOW_CONFIDENCE",
        "Confidence below threshold",
        True,
        200,
        "Provide more context, or route the call to a stronger model",
    ),
    ErrorSpec(
        "E2002",
        "TIMEOUT",
        "Execution timeout exceeded",
        None,
        200,
        "Retry with a longer deadline (failover.timeout.total_s) or a faster rung",
    ),
    ErrorSpec(
        "E2003",
        "TOKEN_LIMIT",
        "Token limit reached during generation",
        True,
        200,
        "Raise the output token limit (max_tokens) or shorten the input",
    ),
    ErrorSpec("E2004", "NO_ACTION_POSSIBLE", "Cannot perform requested action", False, 200),
    ErrorSpec("E2005", "SEMANTIC_CONFLICT", "Action would violate constraints", None, 200),
    ErrorSpec("E2006", "AMBIGUOUS_INPUT", "Input is ambiguous", True, 200),
    ErrorSpec("E2007", "INSUFFICIENT_CONTEXT", "Need more context to proceed", True, 200),
    # v2.5 §7.1 streaming codes; E4012 is named in §3.2.6.4 but missing from the code tables.
    ErrorSpec(
        "E2010",
        "STREAM_INTERRUPTED",
        "Stream was interrupted",
        True,
        200,
        "Resume with the session id and the last seq received (X-Cognitive-Recovery-Session/-Seq)",
    ),
    ErrorSpec("E2011", "STREAM_TIMEOUT", "Stream exceeded timeout", None, 200),
    ErrorSpec("E3001", "SCHEMA_VALIDATION_FAILED", "Output does not match schema", False, 200),
    ErrorSpec("E3002", "PARTIAL_RESULT", "Only partial result available", None, 200),
    ErrorSpec("E3003", "MISSING_RATIONALE", "Rationale field is empty or missing", False, 200),
    ErrorSpec("E3004", "OVERFLOW_LIMIT", "Too many insights in extensions", False, 200),
    ErrorSpec("E3005", "INVALID_ENUM", "Enum value not in allowed set", False, 200),
    ErrorSpec("E3006", "CONSTRAINT_VIOLATION", "Output violates declared constraints", False, 200),
    ErrorSpec(
        "E4000",
        "INTERNAL_ERROR",
        "Unexpected internal error",
        False,
        500,
        "Report the trace id to the proxy's operator; the proxy log has the cause",
    ),
    ErrorSpec(
        "E4001",
        "PROVIDER_UNAVAILABLE",
        "LLM provider is unavailable",
        True,
        503,
        "Retry later; every provider target for this call failed",
    ),
    ErrorSpec(
        "E4002",
        "RATE_LIMITED",
        "Rate limit exceeded",
        True,
        429,
        "Wait for the Retry-After interval before retrying",
    ),
    ErrorSpec("E4003", "CONTEXT_OVERFLOW", "Context window exceeded", None, 502),
    ErrorSpec("E4004", "CIRCULAR_DEPENDENCY", "Circular module dependency detected", False, 500),
    ErrorSpec("E4005", "MAX_DEPTH_EXCEEDED", "Maximum call depth exceeded", False, 500),
    ErrorSpec(
        "E4006",
        "MODULE_NOT_FOUND",
        "Requested module not installed",
        True,
        404,
        "List the installed modules with GET /v1/modules",
    ),
    ErrorSpec("E4007", "PERMISSION_DENIED", "Policy blocks this operation", False, 403),
    ErrorSpec(
        "E4010",
        "STREAMING_NOT_SUPPORTED",
        "Streaming-only module asked for a sync answer",
        False,
        406,
        "Ask for streaming (Accept: text/event-stream or X-Cognitive-Response-Mode: streaming)",
    ),
    ErrorSpec(
        "E4012",
        "RECOVERY_NOT_SUPPORTED",
        "Stream recovery is not enabled on this runtime",
        False,
        400,
        "Retry without recovery context (a new stream)",
    ),
    ErrorSpec(
        "E4011",
        "MULTIMODAL_NOT_SUPPORTED",
        "Runtime doesn't support multimodal",
        False,
        422,
        "Declare the modality for a target of the policy (modalities:), or send text only",
    ),
)

BY_CODE: dict[str, ErrorSpec] = {s.code: s for s in _SPECS}
BY_NAME: dict[str, ErrorSpec] = {s.name: s for s in _SPECS}

# error-codes.md "Legacy Code Mapping": legacy names that differ from the taxonomy's own names.
_LEGACY_ALIASES = {
    "UNSUPPORTED_LANGUAGE": "E1004",
    "NO_SIMPLIFICATION_POSSIBLE": "E2004",
    "BEHAVIOR_CHANGE_REQUIRED": "E2005",
    "OUTPUT_SCHEMA_VIOLATION": "E3001",
}


class Code(StrEnum):
    """The codes the proxy itself emits (it accepts every code of the taxonomy)."""

    PARSE_ERROR = "E1000"
    INVALID_INPUT = "E1001"
    MISSING_REQUIRED_FIELD = "E1002"
    TYPE_MISMATCH = "E1003"
    UNSUPPORTED_VALUE = "E1004"
    INPUT_TOO_LARGE = "E1005"
    UNSUPPORTED_MEDIA_TYPE = "E1010"
    MEDIA_TOO_LARGE = "E1011"
    MEDIA_FETCH_FAILED = "E1012"
    MEDIA_DECODE_FAILED = "E1013"
    MEDIA_TYPE_MISMATCH = "E1014"
    MEDIA_DIMENSIONS_TOO_LARGE = "E1015"
    MEDIA_DIMENSIONS_TOO_SMALL = "E1016"
    MEDIA_TOO_MANY_PIXELS = "E1017"
    LOW_CONFIDENCE = "E2001"
    TIMEOUT = "E2002"
    TOKEN_LIMIT = "E2003"
    STREAM_INTERRUPTED = "E2010"
    STREAM_TIMEOUT = "E2011"
    SCHEMA_VALIDATION_FAILED = "E3001"
    MISSING_RATIONALE = "E3003"
    OVERFLOW_LIMIT = "E3004"
    INVALID_ENUM = "E3005"
    INTERNAL_ERROR = "E4000"
    PROVIDER_UNAVAILABLE = "E4001"
    RATE_LIMITED = "E4002"
    CONTEXT_OVERFLOW = "E4003"
    CIRCULAR_DEPENDENCY = "E4004"
    MAX_DEPTH_EXCEEDED = "E4005"
    MODULE_NOT_FOUND = "E4006"
    PERMISSION_DENIED = "E4007"
    STREAMING_NOT_SUPPORTED = "E4010"
    RECOVERY_NOT_SUPPORTED = "E4012"
    MULTIMODAL_NOT_SUPPORTED = "E4011"


def to_numeric(code: str) -> str | None:
    """Map a legacy or taxonomy name (``PARSE_ERROR``) or an E-code to its E-code, else None."""
    if code in BY_CODE:
        return code
    if code in BY_NAME:
        return BY_NAME[code].code
    return _LEGACY_ALIASES.get(code)


def spec_for(code: str) -> ErrorSpec | None:
    numeric = to_numeric(code)
    return BY_CODE[numeric] if numeric else None


def http_status(code: str, origin: Origin = Origin.RUNTIME) -> int:
    """The HTTP status a module answer carrying ``code`` is sent with (docs/http-api.md "HTTP surface",
    *Status codes for module answers*).

    Answers from a module that ran (``Origin.MODEL``, ``Origin.CONTRACT``) are 200 whatever code
    they carry: a model that writes E4002 or E1001 must not pick a 429 or a 400. Unknown codes
    (module-specific ones such as E5001) are 200 too.
    """
    if origin in _MODULE_RAN:
        return 200
    spec = spec_for(code)
    return spec.http_status if spec else 200


def _recommended_meta(spec: ErrorSpec, explain: str) -> dict[str, Any]:
    # error-codes.md "Confidence Values for Errors" / "Risk Levels for Errors".
    confidence = 0.0
    return {"confidence": confidence, "risk": "high", "explain": explain[:EXPLAIN_MAX]}


def error_envelope(
    code: str,
    message: str,
    *,
    explain: str | None = None,
    suggestion: str | None = None,
    details: dict[str, Any] | None = None,
    partial_data: dict[str, Any] | None = None,
    meta: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """A v2.2 failure envelope for ``code`` with the taxonomy's recommended meta.

    ``explain`` defaults to a sentence that says whose fault it is (spec §5.2): input errors are
    the caller's, runtime errors are the system's.
    """
    spec = spec_for(code)
    if spec is None:
        raise ValueError(f"unknown error code {code!r}")
    if explain is None:
        who = {
            Category.INPUT: "Caller error",
            Category.PROCESSING: "Module could not complete the task",
            Category.OUTPUT: "Model output rejected",
            Category.RUNTIME: "System failure",
        }[spec.category]
        explain = f"{who}: {message}"
    error: dict[str, Any] = {"code": spec.code, "message": message}
    if spec.recoverable is not None:
        error["recoverable"] = spec.recoverable
    hint = suggestion or spec.suggestion
    if hint:
        error["suggestion"] = hint
    error["details"] = {"name": spec.name, **(details or {})}
    envelope: dict[str, Any] = {
        "ok": False,
        "meta": meta if meta is not None else _recommended_meta(spec, explain),
        "error": error,
    }
    if partial_data is not None:
        envelope["partial_data"] = partial_data
    return envelope
