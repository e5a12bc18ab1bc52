"""Context protocol security, through a real ``cogproxy serve`` with raw sockets: credentials in
``_context`` never reach the upstream (nor the logs), and one client cannot read another's
session context."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml

from tests.context.helpers import FIX, LOGIN, REVIEWER, reviewer_answer, sent_inputs
from tests.fake_upstream import FakeUpstream
from tests.proxy_server import UPSTREAM_KEY, UPSTREAM_KEY_ENV, ServedProcess, proxy_process
from tests.security.conftest import security_policy
from tests.security.harness import raw_http, request_bytes

SECRETS = ("hunter2-very-secret", "sk-live0123456789abcdef", "eyJhbGciOiJIUzI1NiJ9.payload.sig")


async def call(served: ServedProcess, value: Any, headers: dict[str, str]) -> tuple[int, dict[str, Any]]:
    port = int(served.url.rsplit(":", 1)[1])
    body = json.dumps({"input": value}).encode()
    raw = request_bytes(
        "POST",
        f"/v1/modules/{REVIEWER}/execute",
        headers={"Content-Type": "application/json", **headers},
        body=body,
    )
    response = await raw_http("127.0.0.1", port, raw)
    return response.status, json.loads(response.body)


async def test_credentials_in_context_never_reach_the_upstream(
    served: ServedProcess, fake_upstream: FakeUpstream
) -> None:
    fake_upstream.script("cheap", reviewer_answer(1, "code_review"))
    context = {
        "conversation_history": [
            {"role": "user", "content": f"my password is fine, key {SECRETS[1]}"},
            {"role": "assistant", "content": f"Authorization: Bearer {SECRETS[2]}"},
        ],
        "previous_result": {
            "module": REVIEWER,
            "data": {"password": SECRETS[0], "db": {"apiKey": SECRETS[0], "host": "db.local"}},
        },
        "user_profile": {"token": SECRETS[0]},  # undeclared: dropped whole
    }
    status, envelope = await call(served, {**LOGIN, "_context": context}, {})
    assert status == 200, envelope
    sent = json.dumps([r.json for r in fake_upstream.requests])
    for secret in SECRETS:
        assert secret not in sent
    model_context = sent_inputs(fake_upstream)[0]["_context"]
    assert model_context["previous_result"]["data"] == {
        "password": "[REDACTED]",
        "db": {"apiKey": "[REDACTED]", "host": "db.local"},
    }
    assert "user_profile" not in model_context
    assert model_context["conversation_history"][0]["content"] == "my password is fine, key [REDACTED]"
    out, err = await served.stop()
    for secret in SECRETS:
        assert secret not in out + err
    assert "proxy.context_redacted" in out + err  # names are logged, values never


async def test_one_client_cannot_read_another_clients_session(
    fake_upstream: FakeUpstream, tmp_path: Path
) -> None:
    path = tmp_path / "policy.yaml"
    path.write_text(yaml.safe_dump(security_policy(fake_upstream)))
    fake_upstream.script("cheap", reviewer_answer(2, "code_review"), reviewer_answer(0, "code_review"))
    fake_upstream.script("cheap", reviewer_answer(1, "verify_fix"))
    env = {UPSTREAM_KEY_ENV: UPSTREAM_KEY}
    async with proxy_process("--policy", str(path), "--api-keys", "sk-client-a,sk-client-b", env=env) as px:
        session = {"X-Cognitive-Session": "shared-name"}
        status, _ = await call(px, LOGIN, {**session, "Authorization": "Bearer sk-client-a"})
        assert status == 200
        status, _ = await call(px, FIX, {**session, "Authorization": "Bearer sk-client-b"})
        assert status == 200
        status, _ = await call(px, FIX, {**session, "Authorization": "Bearer sk-client-a"})
        assert status == 200
    _first, other_client, same_client = sent_inputs(fake_upstream)
    assert "_context" not in other_client  # client b named client a's session: nothing to read
    assert same_client["_context"]["session_state"]["issues_found"] == 2
