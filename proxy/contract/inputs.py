"""Input validation against ``schema.json#/input``, before any model is called."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import orjson

from proxy.contract.errors import DETAIL_VIOLATIONS_MAX, MESSAGE_VIOLATIONS_MAX, Code, error_envelope
from proxy.json_schema import check
from proxy.jsonshape import MAX_JSON_DEPTH, deeper_than

if TYPE_CHECKING:
    from proxy.contract.rules import ModuleContract

# A deliberately simple, provider-independent estimate: about four bytes of JSON per token.
BYTES_PER_TOKEN = 4


TEXT_KEYS = ("$ARGUMENTS", "query")


def text_input(text: str) -> dict[str, str]:
    """Plain text as module input: ``{"$ARGUMENTS": text, "query": text}``, as the reference
    runtime does."""
    return dict.fromkeys(TEXT_KEYS, text)


def estimate_tokens(value: Any) -> int:
    """Tokens of ``value`` as JSON; a plain-text input counts its text once (it is one text)."""
    if isinstance(value, dict) and tuple(value) == TEXT_KEYS:
        text, query = value.values()
        if isinstance(text, str) and text == query:
            value = text
    return math.ceil(len(orjson.dumps(value)) / BYTES_PER_TOKEN)


def check_input(
    module: ModuleContract, value: Any, *, schema: bool = True, sized: Callable[[Any], Any] | None = None
) -> dict[str, Any] | None:
    """The E1xxx error envelope for a bad input, or None when the input may be sent.

    E1001 for an input that is not an object or nests deeper than ``MAX_JSON_DEPTH``; E1005 when
    it exceeds ``max_input_tokens`` (every input form, plain text included; ``sized`` gives what is
    counted when it differs from ``value``: media inputs stubbed, their bytes are no prompt text; it
    is called only on an input that passed the shape checks, so it may walk it); then, with
    ``schema``, the input schema: E1002 when every problem is a missing required field, E1003
    when every problem is a type mismatch, E1001 otherwise.
    """
    if not isinstance(value, dict):
        return error_envelope(
            Code.INVALID_INPUT,
            "The module input must be a JSON object",
            suggestion='Send {"input": {...}} with an object that matches the input schema',
        )
    if deeper_than(value):
        return error_envelope(
            Code.INVALID_INPUT,
            f"The module input nests objects and arrays more than {MAX_JSON_DEPTH} levels deep",
            suggestion="Flatten the input",
            details={"max_depth": MAX_JSON_DEPTH},
        )
    limit = module.runtime.max_input_tokens
    if limit is not None:
        tokens = estimate_tokens(value if sized is None else sized(value))
        if tokens > limit:
            return error_envelope(
                Code.INPUT_TOO_LARGE,
                f"The input is about {tokens} tokens; module {module.name!r} accepts at most {limit}",
                details={"estimated_tokens": tokens, "max_input_tokens": limit},
            )
    if not schema or module.validators.input is None:
        return None
    problems = check(module.validators.input, value, "input")
    if not problems:
        return None
    rules = {p.rule for p in problems}
    code = (
        Code.MISSING_REQUIRED_FIELD
        if rules == {"required"}
        else Code.TYPE_MISMATCH
        if rules == {"type"}
        else Code.INVALID_INPUT
    )
    listing = "; ".join(str(p) for p in problems[:MESSAGE_VIOLATIONS_MAX])
    listed = [{"path": p.path, "message": p.message} for p in problems[:DETAIL_VIOLATIONS_MAX]]
    return error_envelope(
        code,
        f"Input does not match the input schema of module {module.name!r}: {listing}",
        explain=f"Input validation failed (caller error): {problems[0]}",
        suggestion=f"Fix {problems[0].path} and send the request again",
        details={"violations": listed},
    )
