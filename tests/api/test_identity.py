"""One client identity for every feature (issue 26.3, 27.3): with client keys, the key's
identity; without, one anonymous client whatever bearer is sent. Records are keyed by (identity,
trace id): a client's choice of ``X-Request-Id`` never reaches another client's record. Generated
trace ids come from the OS's CSPRNG."""

from __future__ import annotations

import random
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import openai
import pytest

from proxy.clients import ClientIdentity
from tests.api.test_feedback import feedback
from tests.api.test_modules import REVIEW_INPUT, envelope
from tests.api.test_stream_recovery import SSE, _call, _execute_url
from tests.api.test_streaming import answer
from tests.fake_upstream import FakeUpstream
from tests.proxy_server import UPSTREAM_KEY, UPSTREAM_KEY_ENV, RunningProxy, running_proxy, upstream_policy
from tests.support.redis_db import fresh_db
from tests.support.redis_server import redis_url

REDIS_URL = redis_url(9)
VICTIM = "victim-trace-0001"


async def call(
    session: aiohttp.ClientSession, px: RunningProxy, key: str | None, request_id: str | None = None
) -> dict[str, str]:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    if request_id is not None:
        headers["X-Request-Id"] = request_id
    async with session.post(
        px.base + "/modules/code-reviewer/execute", json={"input": REVIEW_INPUT}, headers=headers
    ) as resp:
        assert resp.status == 200, await resp.text()
        return dict(resp.headers)


@pytest.fixture
async def clean_redis() -> AsyncIterator[None]:
    async with fresh_db(9):
        yield


@pytest.mark.parametrize("store", ["memory", "redis"])
async def test_two_clients_choosing_the_same_request_id_keep_their_own_records(
    fake_upstream: FakeUpstream, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, store: str, clean_redis: Any
) -> None:
    monkeypatch.setenv(UPSTREAM_KEY_ENV, UPSTREAM_KEY)
    extra: dict[str, Any] = {"redis_url": REDIS_URL} if store == "redis" else {}
    keys = frozenset({"sk-alice-1", "sk-bob-1"})
    async with (
        running_proxy(tmp_path, upstream_policy(fake_upstream), api_keys=keys, **extra) as px,
        aiohttp.ClientSession() as session,
    ):
        fake_upstream.script("cheap", envelope(0.92))
        fake_upstream.script("cheap", envelope(0.81))
        assert (await call(session, px, "sk-alice-1", VICTIM))["X-Cognitive-Trace-Id"] == VICTIM
        assert (await call(session, px, "sk-bob-1", VICTIM))["X-Cognitive-Trace-Id"] == VICTIM
        body = {"trace_id": VICTIM, "verdict": "incorrect"}
        status, alice = await feedback(session, px, body, "sk-alice-1")
        assert status == 200 and alice["confidence"] == 0.92 and alice["replaced"] is False, alice
        status, bob = await feedback(session, px, {**body, "verdict": "correct"}, "sk-bob-1")
        assert status == 200 and bob["confidence"] == 0.81 and bob["replaced"] is False, bob
        status, again = await feedback(session, px, body, "sk-alice-1")
        assert status == 200 and again["confidence"] == 0.92 and again["replaced"] is True


async def test_without_client_keys_every_bearer_is_the_one_anonymous_client(
    fake_upstream: FakeUpstream, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The SDK's placeholder key owns nothing: a plain curl without a bearer judges its answer
    and resumes its stream."""
    monkeypatch.setenv(UPSTREAM_KEY_ENV, UPSTREAM_KEY)
    async with (
        running_proxy(tmp_path, upstream_policy(fake_upstream)) as px,
        aiohttp.ClientSession() as session,
    ):
        fake_upstream.script("cheap", envelope(0.92))
        sdk = openai.AsyncOpenAI(base_url=px.base, api_key="unused")
        raw = await sdk.chat.completions.with_raw_response.create(
            model="module:code-reviewer", messages=[{"role": "user", "content": '{"code": "x = 1"}'}]
        )
        await sdk.close()
        trace = raw.headers["X-Cognitive-Trace-Id"]
        status, judged = await feedback(session, px, {"trace_id": trace, "verdict": "correct"})
        assert status == 200, judged
        assert (await feedback(session, px, {"trace_id": trace, "verdict": "correct"}, "other"))[0] == 200

        fake_upstream.script("cheap", answer(0.92))
        _, events = await _call(_execute_url(px.url), {**SSE, "Authorization": "Bearer unused"})
        recovery = {
            **SSE,
            "X-Cognitive-Recovery-Session": events[0][1]["session_id"],
            "X-Cognitive-Recovery-Seq": "1",
        }
        status, resumed = await _call(_execute_url(px.url), recovery)
        assert status == 200 and resumed[0][1]["resume_from_seq"] == 2, resumed


async def test_trace_not_found_names_the_identity_rule(fake_upstream: FakeUpstream, tmp_path: Path) -> None:
    async with (
        running_proxy(tmp_path, upstream_policy(fake_upstream)) as px,
        aiohttp.ClientSession() as session,
    ):
        status, body = await feedback(session, px, {"trace_id": "never-seen", "verdict": "correct"})
    message = body["error"]["message"]
    assert status == 404 and "made by another client" in message
    assert "without client keys every caller is one client" in message, message


async def test_generated_trace_ids_do_not_come_from_random(
    fake_upstream: FakeUpstream, tmp_path: Path
) -> None:
    """Mersenne Twister is rebuilt from its outputs: a generated id must not follow ``random``'s
    state (re-seeding it the same way twice gives two different ids)."""
    async with (
        running_proxy(tmp_path, upstream_policy(fake_upstream)) as px,
        aiohttp.ClientSession() as session,
    ):
        ids = []
        for _ in range(2):
            random.seed(1234)
            async with session.get(px.url + "/healthz") as resp:
                ids.append(resp.headers["X-Cognitive-Trace-Id"])
    assert ids[0] != ids[1] and all(len(i) == 32 and int(i, 16) >= 0 for i in ids)


async def test_an_admin_names_the_client_when_several_answers_carry_the_trace_id(
    fake_upstream: FakeUpstream, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(UPSTREAM_KEY_ENV, UPSTREAM_KEY)
    identities = {"sk-alice-1": ClientIdentity("alice"), "sk-bob-1": ClientIdentity("bob")}
    async with (
        running_proxy(
            tmp_path,
            upstream_policy(fake_upstream),
            api_keys=frozenset(identities),
            client_identities=identities,
            admin_keys=frozenset({"sk-admin-1"}),
        ) as px,
        aiohttp.ClientSession() as session,
    ):
        fake_upstream.script("cheap", envelope(0.92))
        fake_upstream.script("cheap", envelope(0.81))
        await call(session, px, "sk-alice-1", VICTIM)
        await call(session, px, "sk-bob-1", VICTIM)
        body = {"trace_id": VICTIM, "verdict": "correct"}
        status, ambiguous = await feedback(session, px, body, "sk-admin-1")
        assert status == 409 and "alice, bob" in ambiguous["error"]["message"], ambiguous
        status, judged = await feedback(session, px, {**body, "client": "bob"}, "sk-admin-1")
        assert status == 200 and judged["confidence"] == 0.81
        status, refused = await feedback(session, px, {**body, "client": "bob"}, "sk-alice-1")
        assert status == 400 and refused["error"]["param"] == "client"  # a client judges its own only
        status, _ = await feedback(session, px, {**body, "client": "carol"}, "sk-admin-1")
        assert status == 404


@pytest.mark.parametrize("trace_id", ["victim-trace-0001\n", "victim-trace-0001\r", "vïctim", "x" * 129, ""])
async def test_a_trace_id_that_is_not_one_is_refused_not_normalised(
    fake_upstream: FakeUpstream, tmp_path: Path, trace_id: str
) -> None:
    """A trailing newline passed ``$`` (the regex end also matches before a final ``\\n``)."""
    async with (
        running_proxy(tmp_path, upstream_policy(fake_upstream)) as px,
        aiohttp.ClientSession() as session,
    ):
        status, body = await feedback(session, px, {"trace_id": trace_id, "verdict": "correct"})
        assert status == 400 and body["error"]["param"] == "trace_id", body
        async with session.get(px.url + "/healthz", headers={"X-Request-Id": trace_id.strip() + "é"}) as resp:
            generated = resp.headers["X-Cognitive-Trace-Id"]
        assert len(generated) == 32 and generated != trace_id.strip()
