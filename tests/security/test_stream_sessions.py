"""Stream sessions through a served proxy: a session id alone never opens another client's
answer, and a guessed id starts a stream of its own."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import yaml
from yarl import URL

from tests.api.test_modules import REVIEW_INPUT
from tests.api.test_streaming import answer
from tests.fake_upstream import FakeUpstream
from tests.proxy_server import UPSTREAM_KEY, UPSTREAM_KEY_ENV, ServedProcess, proxy_process
from tests.security.conftest import security_policy
from tests.security.harness import raw_http, request_bytes

SECRET = "Only the first client may read this rationale."
EXECUTE = "/v1/modules/code-reviewer/execute"


def _events(body: bytes) -> list[dict[str, object]]:
    return [json.loads(line[6:]) for line in body.decode().splitlines() if line.startswith("data: ")]


@pytest.fixture
async def keyed(fake_upstream: FakeUpstream, tmp_path: Path) -> AsyncIterator[ServedProcess]:
    """A served proxy with two client keys: sessions belong to a key's identity (without client
    keys every caller is one client, ``tests/api/test_identity.py``)."""
    path = tmp_path / "policy.yaml"
    path.write_text(yaml.safe_dump(security_policy(fake_upstream)))
    args = ("--policy", str(path), "--api-keys", "sk-first,sk-second")
    async with proxy_process(*args, env={UPSTREAM_KEY_ENV: UPSTREAM_KEY}) as served:
        yield served


async def _stream(served: ServedProcess, headers: dict[str, str]) -> tuple[int, bytes]:
    url = URL(served.url)
    assert url.host is not None and url.port is not None
    body = json.dumps({"input": REVIEW_INPUT}).encode()
    headers = {"Accept": "text/event-stream", "Content-Type": "application/json", **headers}
    raw = await raw_http(url.host, url.port, request_bytes("POST", EXECUTE, headers=headers, body=body))
    return raw.status, raw.body


async def test_a_session_id_alone_does_not_open_another_clients_stream(
    keyed: ServedProcess, fake_upstream: FakeUpstream
) -> None:
    fake_upstream.script("cheap", answer(0.92, rationale=SECRET))
    status, body = await _stream(keyed, {"Authorization": "Bearer sk-first"})
    assert status == 200 and SECRET.encode() in body.replace(b"\\", b"")
    sid = str(_events(body)[0]["session_id"])
    for thief, refused in (({"Authorization": "Bearer sk-second"}, 403), ({}, 401)):
        recovery = {"X-Cognitive-Recovery-Session": sid, "X-Cognitive-Recovery-Seq": "0", **thief}
        status, stolen = await _stream(keyed, recovery)
        assert status == refused and json.loads(stolen)["error"]["code"] == "E4007"
        assert b"rationale" not in stolen and b"Only the first" not in stolen
    assert fake_upstream.count("/v1/chat/completions") == 1


async def test_a_guessed_session_id_starts_a_new_stream(
    served: ServedProcess, fake_upstream: FakeUpstream
) -> None:
    fake_upstream.script("cheap", answer(0.92, rationale=SECRET))
    status, first = await _stream(served, {"Authorization": "Bearer sk-first"})
    sid = str(_events(first)[0]["session_id"])
    guessed = sid[:-1] + ("0" if sid[-1] != "0" else "1")
    fake_upstream.script("cheap", answer(0.92, rationale="Someone else's own answer."))
    recovery = {"Authorization": "Bearer sk-first", "X-Cognitive-Recovery-Session": guessed}
    status, body = await _stream(served, {**recovery, "X-Cognitive-Recovery-Seq": "1"})
    events = _events(body)
    assert status == 200 and events[0]["session_id"] not in (sid, guessed)
    assert SECRET.encode() not in body
