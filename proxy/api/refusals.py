"""Refusals on module routes, as envelopes: a request refused before its module ran (the body
limit, the in-flight body budget, an encoding the proxy does not read, a key it does not know, a
method the route does not take) is answered with the v2.2 failure envelope, never OpenAI's error
body. The HTTP status stays the refusal's own (401, 413, 503 with ``Retry-After`` ...): clients
act on it; the envelope's code says what happened, from one table."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final

from aiohttp import web

from proxy.api.envelopes import refused_envelope
from proxy.api.errors import ApiError
from proxy.contract.errors import Code, error_envelope

EXECUTE_ROUTE: Final = "/v1/modules/{name}/execute"
MODULE_ROUTES: Final = frozenset({EXECUTE_ROUTE})
"""Routes whose every answer is an envelope (the chat route answers module calls in OpenAI's
format: its errors are OpenAI's)."""

TOO_LARGE = "request_too_large"
_BY_API_CODE: Mapping[str, str] = {
    TOO_LARGE: Code.INPUT_TOO_LARGE,  # Code.MEDIA_TOO_LARGE for a module taking media
    "body_budget_exhausted": Code.RATE_LIMITED,  # come back after Retry-After, as for a limit
    "rate_limited": Code.RATE_LIMITED,
    "rate_limit_exceeded": Code.RATE_LIMITED,
    "budget_exceeded": Code.RATE_LIMITED,
    "unsupported_encoding": Code.UNSUPPORTED_VALUE,
    "method_not_allowed": Code.UNSUPPORTED_VALUE,
    "expectation_failed": Code.UNSUPPORTED_VALUE,  # an Expect other than 100-continue
    "invalid_request_target": Code.UNSUPPORTED_VALUE,
    "invalid_encoding": Code.PARSE_ERROR,
    "invalid_json": Code.PARSE_ERROR,
    "too_deeply_nested": Code.PARSE_ERROR,
    "request_timeout": Code.PARSE_ERROR,  # the body never arrived whole
}
_BY_STATUS: Mapping[int, str] = {
    401: Code.PERMISSION_DENIED,
    403: Code.PERMISSION_DENIED,
    429: Code.RATE_LIMITED,
}


def refusal_code(error: ApiError, *, takes_media: bool) -> str:
    """The taxonomy code of a refusal on a module route. Bytes refused for their size are media
    (E1011) when the module takes media: the body is refused before it is parsed, and a module
    with media inputs is sent megabytes only as media."""
    if error.code == TOO_LARGE and takes_media:
        return Code.MEDIA_TOO_LARGE
    code = _BY_API_CODE.get(error.code or "") or _BY_STATUS.get(error.status)
    if code is not None:
        return code
    return Code.INVALID_INPUT if 400 <= error.status < 500 else Code.INTERNAL_ERROR


def refusal_response(error: ApiError, *, takes_media: bool, trace_id: str | None) -> web.Response:
    envelope = error_envelope(refusal_code(error, takes_media=takes_media), error.message)
    return refused_envelope(envelope, error.status, trace_id, error.headers)
