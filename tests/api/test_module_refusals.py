"""Module routes answer the spec's envelope for every refusal, also those made before the module
runs: the body limit and the in-flight body budget (E1011 when the module takes media, else
E1005), the budget being busy (E4002 with Retry-After), an encoding the proxy does not read
(E1004), a client key the proxy does not know (E4007)."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest

from proxy.api.errors import ApiError
from proxy.api.refusals import refusal_code
from proxy.contract.errors import Code, http_status
from tests.fake_upstream import FakeUpstream
from tests.media import samples
from tests.proxy_server import running_proxy, upstream_policy

MiB = 1024 * 1024


def big_image_body(size: int) -> bytes:
    """An execute body for image-describer with one inline image of ``size`` bytes."""
    item = {"type": "base64", "media_type": "image/png", "data": samples.b64(b"\x89PNG" + b"\0" * size)}
    return orjson.dumps({"input": {"prompt": "What is this?", "images": [item]}})


async def post(
    url: str, module: str, body: bytes, headers: dict[str, str] | None = None
) -> tuple[int, Any, Any]:
    async with (
        aiohttp.ClientSession() as session,
        session.post(
            f"{url}/v1/modules/{module}/execute",
            data=io.BytesIO(body),
            headers={"Content-Type": "application/json", **(headers or {})},
        ) as resp,
    ):
        return resp.status, resp.headers, orjson.loads(await resp.read())


def assert_envelope(doc: Any, code: str) -> None:
    assert doc["ok"] is False and doc["error"]["code"] == code, doc
    assert doc["meta"]["confidence"] == 0.0 and doc["meta"]["trace_id"], doc


@pytest.mark.parametrize(
    ("settings", "phrase"),
    [({}, "too large"), ({"max_body_bytes": 64 * MiB, "max_inflight_body_bytes": 32 * MiB}, "too costly")],
)
async def test_a_21_mib_inline_image_is_e1011_as_an_envelope(
    fake_upstream: FakeUpstream, tmp_path: Path, settings: dict[str, Any], phrase: str
) -> None:
    async with running_proxy(tmp_path, upstream_policy(fake_upstream), **settings) as proxy:
        status, headers, doc = await post(proxy.url, "image-describer", big_image_body(21 * MiB))
    assert_envelope(doc, Code.MEDIA_TOO_LARGE)
    assert status == http_status(Code.MEDIA_TOO_LARGE) == 413 and phrase in doc["error"]["message"]
    assert headers["X-Cognitive-Decision"] == "reject"
    assert fake_upstream.requests == []


async def test_a_text_module_body_past_the_limit_is_e1005(
    fake_upstream: FakeUpstream, tmp_path: Path
) -> None:
    body = orjson.dumps({"input": {"code": "x" * 2 * MiB, "language": "python"}})
    async with running_proxy(tmp_path, upstream_policy(fake_upstream), max_body_bytes=MiB) as proxy:
        status, _, doc = await post(proxy.url, "code-reviewer", body)
    assert_envelope(doc, Code.INPUT_TOO_LARGE)
    assert status == 413  # the refusal's own status: the body, not its schema


async def test_an_unknown_encoding_and_an_unknown_key_are_envelopes(
    fake_upstream: FakeUpstream, tmp_path: Path
) -> None:
    body = orjson.dumps({"input": {"code": "x", "language": "python"}})
    async with running_proxy(tmp_path, upstream_policy(fake_upstream), api_keys=frozenset({"sk-a"})) as proxy:
        status, _, doc = await post(
            proxy.url, "code-reviewer", body, {"Authorization": "Bearer sk-a", "Content-Encoding": "br"}
        )
        assert_envelope(doc, Code.UNSUPPORTED_VALUE)
        assert status == 415
        status, _, doc = await post(proxy.url, "code-reviewer", body, {"Authorization": "Bearer sk-nope"})
        assert_envelope(doc, Code.PERMISSION_DENIED)
        assert status == 401
        # the OpenAI routes keep OpenAI's format
        async with aiohttp.ClientSession() as session, session.get(f"{proxy.url}/v1/models") as resp:
            assert resp.status == 401 and (await resp.json())["error"]["code"] == "invalid_api_key"


@pytest.mark.parametrize(
    ("error", "media", "code"),
    [
        (ApiError(413, "Request body too costly", code="request_too_large"), True, Code.MEDIA_TOO_LARGE),
        (ApiError(413, "Request body too costly", code="request_too_large"), False, Code.INPUT_TOO_LARGE),
        (ApiError(503, "busy", "server_error", "body_budget_exhausted"), True, Code.RATE_LIMITED),
        (ApiError(415, "br", code="unsupported_encoding"), False, Code.UNSUPPORTED_VALUE),
        (ApiError(400, "gzip", code="invalid_encoding"), False, Code.PARSE_ERROR),
        (ApiError(408, "slow", code="request_timeout"), False, Code.PARSE_ERROR),
        (ApiError(405, "GET", code="method_not_allowed"), False, Code.UNSUPPORTED_VALUE),
        (ApiError(403, "Host", "permission_error"), False, Code.PERMISSION_DENIED),
        (ApiError(422, "odd", code="something_new"), False, Code.INVALID_INPUT),
        (ApiError(401, "key", "authentication_error", "invalid_api_key"), False, Code.PERMISSION_DENIED),
        (ApiError(500, "odd", "server_error", "internal_error"), False, Code.INTERNAL_ERROR),
    ],
)
def test_every_refusal_has_one_code(error: ApiError, media: bool, code: str) -> None:
    assert refusal_code(error, takes_media=media) == code
