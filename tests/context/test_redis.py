"""Context in Redis, through real ``cogproxy serve`` processes: replicas share sessions and the
result cache; a session survives a restart; keys are namespaced, prefixed and expire as declared.
Also the spec §8.1 example on `make run`'s policy (the offline provider)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml

from tests.conftest import ROOT, write_module
from tests.context.helpers import FIX, LOGIN, REDIS_URL, REVIEWER, execute, reviewer_answer, sent_inputs
from tests.fake_upstream import FakeUpstream
from tests.proxy_server import UPSTREAM_KEY, UPSTREAM_KEY_ENV, proxy_process, upstream_policy
from tests.support.polling import eventually

SESSION = {"X-Cognitive-Session": "review-1"}
ENV = {UPSTREAM_KEY_ENV: UPSTREAM_KEY}


async def cache_keys(redis_db: Any) -> set[bytes]:
    return set(await redis_db.keys("cogproxy:ctx:*:cache:*"))


def policy_file(tmp_path: Path, fake: FakeUpstream, **extra: Any) -> str:
    path = tmp_path / "policy.yaml"
    path.write_text(yaml.safe_dump(upstream_policy(fake, **extra)))
    return str(path)


async def test_two_replicas_share_context_and_cache_through_redis(
    fake_upstream: FakeUpstream, tmp_path: Path, redis_db: Any
) -> None:
    policy = policy_file(tmp_path, fake_upstream, cache={"modules": {REVIEWER: {"ttl_s": 600}}})
    fake_upstream.script("cheap", reviewer_answer(2, "code_review"), reviewer_answer(1, "verify_fix"))
    args = ("--policy", policy, "--redis-url", REDIS_URL)
    async with proxy_process(*args, env=ENV) as a, proxy_process(*args, env=ENV) as b:
        _, headers, first = await execute(a.url, REVIEWER, LOGIN, SESSION)
        assert headers["X-Cognitive-Cache"] == "miss"
        _, _, second = await execute(b.url, REVIEWER, FIX, SESSION)
        context = sent_inputs(fake_upstream)[1]["_context"]
        assert context["previous_result"]["data"] == first["data"]
        assert context["session_state"] == first["_emitted_context"]["session_state"]
        assert second["_emitted_context"]["session_state"]["last_action"] == "verify_fix"
        # Without a session (no context), the same input on the other replica is a shared cache hit.
        fake_upstream.script("cheap", reviewer_answer(0, "code_review"))
        # The two session calls' entries land in the background too: let them, then take the set.
        cached_before = await eventually(
            lambda: cache_keys(redis_db),
            "the session calls' cache entries",
            ready=lambda keys: len(keys) >= 2,
            step=0.01,
        )
        _, miss, answered = await execute(b.url, REVIEWER, {"code": "x = 1"})
        # cache writes do not wait: poll for this call's entry
        await eventually(
            lambda: cache_keys(redis_db),
            "this call's cache entry",
            ready=lambda keys: bool(keys - cached_before),
            step=0.01,
        )
        _, hit, cached = await execute(a.url, REVIEWER, {"code": "x = 1"})
        assert (miss["X-Cognitive-Cache"], hit["X-Cognitive-Cache"]) == ("miss", "hit")
        assert cached["data"] == answered["data"]
    assert fake_upstream.count("/v1/chat/completions") == 3


async def test_session_state_survives_a_restart(
    fake_upstream: FakeUpstream, tmp_path: Path, redis_db: Any
) -> None:
    policy = policy_file(tmp_path, fake_upstream)
    fake_upstream.script("cheap", reviewer_answer(2, "code_review"), reviewer_answer(1, "verify_fix"))
    args = ("--policy", policy, "--redis-url", REDIS_URL)
    async with proxy_process(*args, env=ENV) as first:
        await execute(first.url, REVIEWER, LOGIN, SESSION)
    assert first.proc.returncode is not None
    async with proxy_process(*args, env=ENV) as second:
        await execute(second.url, REVIEWER, FIX, SESSION)
    state = sent_inputs(fake_upstream)[1]["_context"]["session_state"]
    assert state == {"files_reviewed": ["login.py"], "issues_found": 2, "last_action": "code_review"}


async def test_keys_are_prefixed_namespaced_and_expire_as_declared(
    fake_upstream: FakeUpstream, tmp_path: Path, redis_db: Any
) -> None:
    emits = [{"type": "user_profile", "ttl": -1}, {"type": "session_state", "ttl": 120}]
    write_module(tmp_path / "mods", "profiler", manifest={"context": {"emits": emits}})
    answer = {
        "ok": True,
        "meta": {"confidence": 0.9, "risk": "low", "explain": "e"},
        "data": {"result": "r", "rationale": "r"},
        "_emitted_context": {"user_profile": {"locale": "en"}, "session_state": {"step": 1}},
    }
    fake_upstream.script("cheap", json.dumps(answer))
    args = (
        "--policy",
        policy_file(tmp_path, fake_upstream),
        "--redis-url",
        REDIS_URL,
        "--modules",
        str(tmp_path / "mods"),
    )
    async with proxy_process(*args, env=ENV) as px:
        headers = {**SESSION, "X-Cognitive-User": "user-7", "Authorization": "Bearer sk-client-a"}
        _, _, envelope = await execute(px.url, "profiler", {"code": "x"}, headers)
    assert envelope["_emitted_context"] == answer["_emitted_context"]
    keys = sorted(await redis_db.keys("cogproxy:ctx:*"))
    assert len(keys) == 3  # the profile, the session state and the session's last result
    assert "sk-client-a" not in "".join(await redis_db.keys("*"))  # the client key is hashed, never stored
    (profile,) = [k for k in keys if k.endswith(":user-7:user_profile")]
    (state,) = [k for k in keys if k.endswith(":review-1:session_state")]
    assert json.loads(await redis_db.get(profile)) == {"locale": "en"}
    assert await redis_db.ttl(profile) == -1  # persistent: no expiry
    assert 0 < await redis_db.ttl(state) <= 120
    assert len({k.split(":")[2] for k in keys}) == 1  # one client namespace


async def test_the_spec_example_runs_on_the_offline_demo_policy(tmp_path: Path, redis_db: Any) -> None:
    """`make run`'s policy: the second turn is accepted and the session state is the second
    turn's, stored in Redis next to the module's last result."""
    cases = ROOT / "modules" / REVIEWER / "tests"
    login = json.loads((cases / "case_login.input.json").read_text())
    fix = json.loads((cases / "case_fix.input.json").read_text())
    args = ("--policy", str(ROOT / "policies" / "demo.yaml"), "--redis-url", REDIS_URL)
    async with proxy_process(*args) as px:
        status, headers, first = await execute(px.url, REVIEWER, {**login, "_context": {}}, SESSION)
        assert (status, headers["X-Cognitive-Decision"]) == (200, "accept")
        assert first["_emitted_context"]["session_state"]["issues_found"] == 2
        status, headers, second = await execute(px.url, REVIEWER, fix, SESSION)
        assert (status, headers["X-Cognitive-Decision"]) == (200, "accept")
        assert second["_emitted_context"]["session_state"]["last_action"] == "verify_fix"
    keys = await redis_db.keys("*")
    (state,) = [k for k in keys if k.endswith("review-1:session_state")]
    assert json.loads(await redis_db.get(state))["last_action"] == "verify_fix"
    (result,) = [k for k in keys if k.endswith(f"review-1:result:{REVIEWER}")]
    assert json.loads(await redis_db.get(result))["data"] == second["data"]
