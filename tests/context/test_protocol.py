"""The context protocol end to end, through the real proxy in front of the scripted fake upstream:
built context (previous_result, session_state, conversation_history), validation, emitted
context and the warnings a caller gets."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from tests.conftest import MODULES, write_module
from tests.context.helpers import (
    EARLIER,
    FIX,
    LOGIN,
    REVIEWER,
    chat_after_earlier_turns,
    execute,
    reviewer_answer,
    sent_inputs,
)
from tests.fake_upstream import FakeUpstream
from tests.proxy_server import UPSTREAM_KEY, UPSTREAM_KEY_ENV, RunningProxy, running_proxy, upstream_policy
from tests.stream.client import read_sse

SESSION = {"X-Cognitive-Session": "review-1"}


async def test_second_call_in_a_session_gets_the_first_calls_result_and_state(
    px: RunningProxy, fake_upstream: FakeUpstream
) -> None:
    fake_upstream.script("cheap", reviewer_answer(2, "code_review"), reviewer_answer(1, "verify_fix"))
    status, headers, first = await execute(px.url, REVIEWER, {**LOGIN, "_context": {}}, SESSION)
    assert status == 200 and headers["X-Cognitive-Decision"] == "accept"
    assert first["_emitted_context"] == {
        "session_state": {"files_reviewed": ["login.py"], "issues_found": 2, "last_action": "code_review"}
    }
    status, _, second = await execute(px.url, REVIEWER, FIX, SESSION)
    assert status == 200
    sent_first, sent_second = sent_inputs(fake_upstream)
    assert "_context" not in sent_first  # nothing to give on the first turn
    context = sent_second["_context"]
    assert context["previous_result"]["module"] == REVIEWER
    assert context["previous_result"]["data"] == first["data"]
    assert context["previous_result"]["meta"]["confidence"] == first["meta"]["confidence"]
    assert context["session_state"] == first["_emitted_context"]["session_state"]
    assert second["_emitted_context"]["session_state"]["last_action"] == "verify_fix"


async def test_sessions_do_not_see_each_other(px: RunningProxy, fake_upstream: FakeUpstream) -> None:
    fake_upstream.script("cheap", reviewer_answer(2, "code_review"), reviewer_answer(0, "code_review"))
    await execute(px.url, REVIEWER, LOGIN, {"X-Cognitive-Session": "a"})
    await execute(px.url, REVIEWER, FIX, {"X-Cognitive-Session": "b"})
    assert "_context" not in sent_inputs(fake_upstream)[1]


async def test_session_id_in_the_body_names_the_session(
    px: RunningProxy, fake_upstream: FakeUpstream
) -> None:
    fake_upstream.script("cheap", reviewer_answer(2, "code_review"), reviewer_answer(1, "verify_fix"))
    await execute(px.url, REVIEWER, {**LOGIN, "_context": {"session_id": "body-1"}})
    await execute(px.url, REVIEWER, {**FIX, "_context": {"session_id": "body-1"}})
    second = sent_inputs(fake_upstream)[1]
    assert second["_context"]["session_state"]["issues_found"] == 2
    assert "session_id" not in second["_context"]


async def test_client_context_wins_field_by_field(px: RunningProxy, fake_upstream: FakeUpstream) -> None:
    fake_upstream.script("cheap", reviewer_answer(2, "code_review"), reviewer_answer(1, "verify_fix"))
    await execute(px.url, REVIEWER, LOGIN, SESSION)
    client = {"session_state": {"issues_found": 7}}
    await execute(px.url, REVIEWER, {**FIX, "_context": client}, SESSION)
    state = sent_inputs(fake_upstream)[1]["_context"]["session_state"]
    assert state == {"files_reviewed": ["login.py"], "issues_found": 7, "last_action": "code_review"}


async def test_conversation_history_comes_from_the_chat_messages(
    px: RunningProxy, fake_upstream: FakeUpstream
) -> None:
    fake_upstream.script("cheap", reviewer_answer(1, "verify_fix"))
    await chat_after_earlier_turns(px.base)
    history = sent_inputs(fake_upstream)[0]["_context"]["conversation_history"]
    assert history == EARLIER[-5:]  # max_turns: 5, the oldest dropped first


async def test_undeclared_context_is_dropped_and_reported(
    px: RunningProxy, fake_upstream: FakeUpstream
) -> None:
    fake_upstream.script("cheap", reviewer_answer(0, "code_review"))
    value = {**LOGIN, "_context": {"environment": {"os": "linux"}, "session_state": {"issues_found": 1}}}
    status, _, envelope = await execute(px.url, REVIEWER, value)
    assert status == 200
    assert sent_inputs(fake_upstream)[0]["_context"] == {"session_state": {"issues_found": 1}}
    assert envelope["_warnings"] == [
        "_context.environment: not declared in context.accepts of 'interactive-reviewer'; dropped",
        "_emitted_context.session_state: not stored (its key needs a session or user id)",
    ]


async def test_context_of_a_module_that_declares_none_never_reaches_the_model(
    px: RunningProxy, fake_upstream: FakeUpstream
) -> None:
    fake_upstream.script(
        "cheap",
        json.dumps(
            {
                "ok": True,
                "meta": {"confidence": 0.9, "risk": "low", "explain": "e"},
                "data": {"issues": [], "summary": "s", "verdict": "approve", "rationale": "r"},
            }
        ),
    )
    value = {"code": "x = 1", "_context": {"session_state": {"a": 1}}}
    status, _, envelope = await execute(px.url, "code-reviewer", value)
    assert status == 200
    assert sent_inputs(fake_upstream)[0] == {"code": "x = 1"}
    assert envelope["_warnings"][0].startswith("_context.session_state: not declared")


async def test_schema_violation_in_context_is_e1001_with_its_path(
    px: RunningProxy, fake_upstream: FakeUpstream
) -> None:
    value = {**LOGIN, "_context": {"session_state": {"issues_found": "two"}}}
    status, _, envelope = await execute(px.url, REVIEWER, value)
    assert status == 400
    assert envelope["error"]["code"] == "E1001"
    assert envelope["error"]["details"]["violations"][0]["path"] == "_context.session_state.issues_found"
    assert fake_upstream.count("/v1/chat/completions") == 0


async def test_context_that_is_not_an_object_is_e1001(px: RunningProxy, fake_upstream: FakeUpstream) -> None:
    status, _, envelope = await execute(px.url, REVIEWER, {**LOGIN, "_context": ["x"]})
    assert (status, envelope["error"]["code"]) == (400, "E1001")
    assert fake_upstream.count() == 0


@pytest.mark.parametrize("session", ["a:b", "x" * 129, "with space", "*"])
async def test_malformed_session_ids_are_refused(
    px: RunningProxy, fake_upstream: FakeUpstream, session: str
) -> None:
    status, _, envelope = await execute(px.url, REVIEWER, LOGIN, {"X-Cognitive-Session": session})
    assert (status, envelope["error"]["code"]) == (400, "E1001")
    assert "X-Cognitive-Session" in envelope["error"]["message"]
    assert fake_upstream.count() == 0


async def test_missing_required_context_is_e1002_naming_it(
    fake_upstream: FakeUpstream, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(UPSTREAM_KEY_ENV, UPSTREAM_KEY)
    context = {"accepts": [{"type": "user_profile", "fields": ["expertise_level"], "required": True}]}
    write_module(tmp_path / "mods", "explainer", manifest={"context": context})
    async with running_proxy(tmp_path, upstream_policy(fake_upstream), modules=(tmp_path / "mods",)) as px:
        status, _, envelope = await execute(px.url, "explainer", {"code": "x"})
        assert (status, envelope["error"]["code"]) == (400, "E1002")
        assert "'user_profile'" in envelope["error"]["message"]
        assert envelope["error"]["details"]["missing_context"] == ["user_profile"]
        assert fake_upstream.count() == 0
        fake_upstream.script(
            "cheap",
            json.dumps(
                {
                    "ok": True,
                    "meta": {"confidence": 0.9, "risk": "low", "explain": "e"},
                    "data": {"result": "r", "rationale": "r"},
                }
            ),
        )
        profile = {"expertise_level": "expert", "email": "a@b.c"}
        status, _, envelope = await execute(
            px.url, "explainer", {"code": "x", "_context": {"user_profile": profile}}
        )
        assert status == 200
        assert sent_inputs(fake_upstream)[0]["_context"] == {"user_profile": {"expertise_level": "expert"}}
        assert "email" in envelope["_warnings"][0]


async def test_emitted_context_against_its_schema_fails_the_answer(
    px: RunningProxy, fake_upstream: FakeUpstream
) -> None:
    bad = reviewer_answer(1, "x", emitted={"session_state": {"issues_found": -1}})
    fake_upstream.script("cheap", bad)
    fake_upstream.script("strong", reviewer_answer(1, "code_review"))
    _status, headers, envelope = await execute(px.url, REVIEWER, LOGIN, SESSION)
    assert headers["X-Cognitive-Decision"] == "escalated"  # the contract failure escalated
    assert envelope["_emitted_context"]["session_state"]["issues_found"] == 1


async def test_undeclared_emitted_context_is_never_passed_on(
    px: RunningProxy, fake_upstream: FakeUpstream
) -> None:
    answer = reviewer_answer(1, "x", emitted={"user_profile": {"admin": True}})
    fake_upstream.script("cheap", answer)
    status, _, envelope = await execute(px.url, REVIEWER, LOGIN, SESSION)
    assert status == 200 and envelope["ok"] is True
    assert "_emitted_context" not in envelope


async def test_a_rejected_answer_emits_nothing(px: RunningProxy, fake_upstream: FakeUpstream) -> None:
    low = reviewer_answer(2, "code_review", confidence=0.1)
    fake_upstream.script("cheap", low)
    fake_upstream.script("strong", low)
    fake_upstream.script("cheap", reviewer_answer(0, "code_review"))
    _, headers, envelope = await execute(px.url, REVIEWER, LOGIN, SESSION)
    assert headers["X-Cognitive-Decision"] == "review"
    assert "_emitted_context" not in envelope
    await execute(px.url, REVIEWER, FIX, SESSION)
    assert "_context" not in sent_inputs(fake_upstream)[-1]


def test_bundled_example_declares_the_spec_context() -> None:
    from proxy.module.loader import load_module

    module = load_module(MODULES / REVIEWER)
    assert [a.type for a in module.context.accepts] == [
        "conversation_history",
        "session_state",
        "previous_result",
    ]
    assert module.context.emitted("session_state") is not None
    assert module.context.emitted("session_state").ttl == 3600  # type: ignore[union-attr]


async def test_deep_or_huge_context_is_refused_before_any_model_call(
    px: RunningProxy, fake_upstream: FakeUpstream
) -> None:
    deep: object = {}
    for _ in range(200):
        deep = {"a": deep}
    status, _, envelope = await execute(px.url, REVIEWER, {**LOGIN, "_context": {"session_state": deep}})
    assert (status, envelope["error"]["code"]) == (400, "E1001")
    huge = {"files_reviewed": ["f" * 9_000] * 50}  # each string under 10,000, together 450 KB
    status, _, envelope = await execute(px.url, REVIEWER, {**LOGIN, "_context": {"session_state": huge}})
    assert envelope["error"]["code"] == "E1005"
    assert envelope["error"]["details"]["max_context_bytes"] == 256 * 1024
    assert fake_upstream.count() == 0


async def test_chat_and_responses_module_calls_share_the_session(
    px: RunningProxy, fake_upstream: FakeUpstream
) -> None:
    fake_upstream.script("cheap", reviewer_answer(2, "code_review"), reviewer_answer(1, "verify_fix"))
    async with aiohttp.ClientSession(headers=SESSION) as session:
        chat = {"model": f"module:{REVIEWER}", "messages": [{"role": "user", "content": json.dumps(LOGIN)}]}
        assert (await session.post(px.base + "/chat/completions", json=chat)).status == 200
        responses = {"model": f"module:{REVIEWER}", "input": json.dumps(FIX)}
        resp = await session.post(px.base + "/responses", json=responses)
        assert resp.status == 200
        bad = await session.post(
            px.base + "/chat/completions", json=chat, headers={"X-Cognitive-User": "no spaces allowed"}
        )
        assert bad.status == 400 and (await bad.json())["error"]["code"] == "E1001"
    assert sent_inputs(fake_upstream)[1]["_context"]["session_state"]["issues_found"] == 2
    assert fake_upstream.count("/v1/chat/completions") == 2


async def test_a_streamed_call_checks_the_input_schema_without_its_context(
    fake_upstream: FakeUpstream, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The stream's early input check (for a 400 before the stream opens) leaves ``_context`` to
    the context step, as the sync path does: a closed input schema must not refuse it."""
    monkeypatch.setenv(UPSTREAM_KEY_ENV, UPSTREAM_KEY)
    modules = tmp_path / "modules"
    shutil.copytree(MODULES / REVIEWER, modules / REVIEWER)
    schema_path = modules / REVIEWER / "schema.json"
    schema = json.loads(schema_path.read_text())
    schema["input"]["additionalProperties"] = False
    schema_path.write_text(json.dumps(schema))
    fake_upstream.script("cheap", reviewer_answer(0, "code_review"))
    async with (
        running_proxy(tmp_path, upstream_policy(fake_upstream), modules=(modules,)) as px,
        aiohttp.ClientSession() as session,
    ):
        value = {**LOGIN, "_context": {"session_state": {"issues_found": 1}}}
        async with session.post(
            f"{px.base}/modules/{REVIEWER}/execute",
            json={"input": value},
            headers={"Accept": "text/event-stream", **SESSION},
        ) as answer:
            assert answer.status == 200, await answer.text()
            events = await read_sse(answer)
    assert events[-1][0] == "final"
    assert sent_inputs(fake_upstream)[0]["_context"] == {"session_state": {"issues_found": 1}}


def _schema_json_context(accepts: bool) -> tuple[dict[str, Any], dict[str, Any]]:
    """A module declaring ``_context`` in schema.json the way context-protocol §3.2 writes it."""
    from tests.conftest import SCHEMA

    schema = json.loads(json.dumps(SCHEMA))
    schema["input"]["properties"]["_context"] = {
        "type": "object",
        "properties": {"user_profile": {"$ref": "#/$defs/user_profile"}},
    }
    schema["$defs"]["user_profile"] = {
        "type": "object",
        "properties": {"expertise_level": {"enum": ["beginner", "intermediate", "expert"]}},
    }
    manifest = {"context": {"accepts": [{"type": "user_profile"}]}} if accepts else {}
    return schema, manifest


@pytest.mark.parametrize("accepts", [True, False], ids=["with-accepts", "schema-json-only"])
async def test_a_context_schema_in_schema_json_is_applied(
    fake_upstream: FakeUpstream, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, accepts: bool
) -> None:
    """context-protocol §3.2: ``schema.json#/input/properties/_context`` (with ``$defs``) is checked
    like ``accepts[].schema``: a violation is E1001 with its path and no upstream call."""
    monkeypatch.setenv(UPSTREAM_KEY_ENV, UPSTREAM_KEY)
    schema, manifest = _schema_json_context(accepts)
    write_module(tmp_path / "mods", "profiled", manifest=manifest, schema=schema)
    async with running_proxy(tmp_path, upstream_policy(fake_upstream), modules=(tmp_path / "mods",)) as px:
        bad = {"code": "x", "_context": {"user_profile": {"expertise_level": "guru"}}}
        status, _, envelope = await execute(px.url, "profiled", bad)
        assert (status, envelope["error"]["code"]) == (400, "E1001")
        paths = [v["path"] for v in envelope["error"]["details"]["violations"]]
        assert paths == ["_context.user_profile.expertise_level"]
        assert fake_upstream.count() == 0
        fake_upstream.script(
            "cheap",
            json.dumps(
                {
                    "ok": True,
                    "meta": {"confidence": 0.9, "risk": "low", "explain": "e"},
                    "data": {"result": "r", "rationale": "r"},
                }
            ),
        )
        good = {"code": "x", "_context": {"user_profile": {"expertise_level": "expert"}}}
        status, _, envelope = await execute(px.url, "profiled", good)
        assert status == 200, envelope
        assert sent_inputs(fake_upstream)[0]["_context"] == {"user_profile": {"expertise_level": "expert"}}
