"""Finding 7: credentials inside an upstream's error text never reach a body the proxy writes.

The proxy's own texts (E4001 envelopes, 502/504 OpenAI errors, ``cognitive.attempts``) quote
upstream failures through ``proxy.redact``; an upstream's own 4xx body relayed on plain
passthrough stays verbatim (it is the upstream's answer, not the proxy's text).
"""

from __future__ import annotations

import json
from pathlib import Path

import orjson
import yaml

from tests.fake_upstream import FakeUpstream, Fault
from tests.proxy_server import UPSTREAM_KEY, UPSTREAM_KEY_ENV, proxy_process
from tests.security.conftest import security_policy
from tests.security.harness import raw_http, request_bytes

TOKEN = "sk-proj-LEAKEDabcdef0123456789"
BEARER = "Bearer eyJhbGciOiJIUzI1NiJ9.secretpayload"
SECRET_BODY = json.dumps({"error": {"message": f"bad auth {BEARER} for key {TOKEN}", "type": "server_error"}})
NO_RETRY = {"failover": {"retries": 0, "timeout": {"per_try_s": 5, "total_s": 10}}}


def assert_clean(body: bytes) -> None:
    assert TOKEN.encode() not in body and b"LEAKED" not in body, body
    assert b"secretpayload" not in body, body
    assert b"[REDACTED]" in body, body  # the message is still quoted, with the secret masked


async def test_upstream_secrets_are_redacted_in_every_proxy_written_body(
    fake_upstream: FakeUpstream, tmp_path: Path
) -> None:
    for model in ("cheap", "strong"):
        fake_upstream.set_default_reply(model, Fault.http(500, body=SECRET_BODY))
    path = tmp_path / "policy.yaml"
    path.write_text(yaml.safe_dump(security_policy(fake_upstream, **NO_RETRY)))
    async with proxy_process("--policy", str(path), env={UPSTREAM_KEY_ENV: UPSTREAM_KEY}) as served:
        port = int(served.url.rsplit(":", 1)[1])
        execute = request_bytes(
            "POST",
            "/v1/modules/code-reviewer/execute",
            headers={"Content-Type": "application/json"},
            body=orjson.dumps({"input": {"code": "x = 1", "language": "python"}}),
        )
        module_chat = request_bytes(
            "POST",
            "/v1/chat/completions",
            headers={"Content-Type": "application/json"},
            body=orjson.dumps(
                {"model": "module:code-reviewer", "messages": [{"role": "user", "content": "x = 1"}]}
            ),
        )
        passthrough = request_bytes(
            "POST",
            "/v1/chat/completions",
            headers={"Content-Type": "application/json"},
            body=orjson.dumps({"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "hi"}]}),
        )
        answer = await raw_http("127.0.0.1", port, execute)
        assert answer.status == 503
        assert orjson.loads(answer.body)["error"]["code"] == "E4001"
        assert_clean(answer.body)
        answer = await raw_http("127.0.0.1", port, module_chat)
        assert answer.status == 503
        assert_clean(answer.body)
        answer = await raw_http("127.0.0.1", port, passthrough)
        assert answer.status == 502
        assert orjson.loads(answer.body)["error"]["code"] == "upstream_error"
        assert_clean(answer.body)


async def test_an_upstream_4xx_body_is_relayed_verbatim_on_plain_passthrough(
    fake_upstream: FakeUpstream, tmp_path: Path
) -> None:
    fake_upstream.set_default_reply("cheap", Fault.http(400, body=SECRET_BODY))
    path = tmp_path / "policy.yaml"
    path.write_text(yaml.safe_dump(security_policy(fake_upstream, **NO_RETRY)))
    async with proxy_process("--policy", str(path), env={UPSTREAM_KEY_ENV: UPSTREAM_KEY}) as served:
        port = int(served.url.rsplit(":", 1)[1])
        answer = await raw_http(
            "127.0.0.1",
            port,
            request_bytes(
                "POST",
                "/v1/chat/completions",
                headers={"Content-Type": "application/json"},
                body=orjson.dumps({"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "hi"}]}),
            ),
        )
    assert answer.status == 400
    assert answer.body == SECRET_BODY.encode()
