"""`X-Cognitive-Context` and `cognitive.context`: the context types a module call showed the model
and where each came from, visible offline (#31.9)."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path
from typing import Any
from urllib.parse import unquote

import aiohttp
import pytest
import yaml

from proxy.context.used import CONTEXT_HEADER, MAX_LISTED, MAX_NAME_CHARS, ContextUsed, Used, context_used
from tests.api.test_modules import envelope
from tests.context.helpers import FIX, LOGIN, REVIEWER, chat_after_earlier_turns, execute, reviewer_answer
from tests.fake_upstream import FakeUpstream
from tests.paths import ROOT
from tests.proxy_server import RunningProxy, running_proxy
from tests.stream.client import read_sse
from tests.support.snippets import block_after, run_snippet

SESSION = {"X-Cognitive-Session": "seen-1"}
HISTORY = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]
STATE = {"issues_found": 2}
# (what the model is shown, what was built, its sources, the client's _context, unreadable) -> header
CASES = [
    ({}, {}, {}, {}, set(), "none"),
    ({"conversation_history": HISTORY}, {"conversation_history": HISTORY},
     {"conversation_history": "messages"}, {}, set(), "conversation_history=messages;turns=2"),
    ({"session_state": STATE}, {"session_state": STATE}, {"session_state": "session"}, {}, set(),
     "session_state=session"),
    ({"user_profile": STATE}, {"user_profile": STATE}, {"user_profile": "user"}, {}, set(),
     "user_profile=user"),
    ({"session_state": STATE}, {}, {}, {"session_state": STATE}, set(), "session_state=client"),
    ({"session_state": STATE}, {"session_state": {"a": 1}}, {"session_state": "session"},
     {"session_state": STATE}, set(), "session_state=session+client"),
    # the client replaced a built list whole: only the client's value was shown
    ({"conversation_history": HISTORY}, {"conversation_history": HISTORY[:1]},
     {"conversation_history": "messages"}, {"conversation_history": HISTORY}, set(),
     "conversation_history=client"),
    # a built list, a client object: the client's object replaced it, nothing was merged
    ({"session_state": STATE}, {"session_state": [1]}, {"session_state": "session"},
     {"session_state": STATE}, set(), "session_state=client"),
    ({}, {}, {"session_state": "session"}, {}, {"session_state"}, "session_state=unavailable"),
    ({"session_state": STATE}, {}, {}, {"session_state": STATE}, {"session_state"}, "session_state=client"),
]  # fmt: skip


@pytest.mark.parametrize(("shown", "built", "sources", "client", "unavailable", "header"), CASES)
def test_the_header_names_each_type_shown_and_its_source(
    shown: dict[str, Any],
    built: dict[str, Any],
    sources: dict[str, str],
    client: dict[str, Any],
    unavailable: set[str],
    header: str,
) -> None:
    assert context_used(shown, built, sources, client, unavailable).header() == header


def test_the_header_carries_no_value_and_stays_bounded() -> None:
    """Values never appear; odd type names are percent-encoded and cut; past MAX_LISTED types one
    ``*omitted=N`` item counts the rest."""
    secret = {"token": "sk-live-123", "note": "a, b=c"}
    used = context_used({"session_state": secret}, {}, {}, {"session_state": secret}, set())
    assert used.header() == "session_state=client"
    odd = Used('a b,c="d"\r\nX-Evil: 1' + "x" * 200, "client")
    assert re.fullmatch(r"[A-Za-z0-9_.%-]+=client", odd.item())
    assert len(odd.item().split("=")[0]) == MAX_NAME_CHARS
    many = ContextUsed(tuple(Used(f"t{i}", "session") for i in range(MAX_LISTED + 5)))
    items = many.header().split(", ")
    assert len(items) == MAX_LISTED + 1 and items[-1] == "*omitted=5"
    huge = ContextUsed(tuple(Used("y" * 500, "session+client", 10**6) for _ in range(1000)))
    assert len(huge.header()) < 2048


@pytest.mark.parametrize(
    "name", ["\u00e9" * 40, "\u6587\u8108" * 30, "ab" + "\U0001f600" * 20, "x\ud800y" * 10]
)
def test_a_cut_type_name_ends_on_a_whole_character(name: str) -> None:
    """Adversarial pass #29: the percent-encoded name was cut at MAX_NAME_CHARS mid-escape
    ("...%C3%") or mid-character; a lone surrogate (the module loader refuses one) raised in quote().
    The cut name decodes, strictly, to a prefix of the name."""
    encoded = Used(name, "session").item().removesuffix("=session")
    assert len(encoded) <= MAX_NAME_CHARS
    decoded = unquote(encoded, errors="strict")
    assert decoded and name.replace("\ud800", "?").startswith(decoded)


async def test_the_second_call_of_a_session_names_what_the_first_left(
    px: RunningProxy, fake_upstream: FakeUpstream
) -> None:
    fake_upstream.script("cheap", reviewer_answer(2, "code_review"), reviewer_answer(1, "verify_fix"))
    _, first, _ = await execute(px.url, REVIEWER, LOGIN, SESSION)
    assert first[CONTEXT_HEADER] == "none"
    _, second, _ = await execute(px.url, REVIEWER, {**FIX, "_context": {"session_state": STATE}}, SESSION)
    assert second[CONTEXT_HEADER] == "session_state=session+client, previous_result=session"


async def test_a_chat_call_names_its_history_in_the_header_and_the_cognitive_block(
    px: RunningProxy, fake_upstream: FakeUpstream
) -> None:
    fake_upstream.script("cheap", reviewer_answer(1, "verify_fix"))
    resp, reply = await chat_after_earlier_turns(px.base)
    assert resp.headers[CONTEXT_HEADER] == "conversation_history=messages;turns=5"
    assert reply["cognitive"]["context"] == [
        {"type": "conversation_history", "source": "messages", "turns": 5}
    ]


async def test_streamed_calls_name_their_context_on_the_last_chunk(
    px: RunningProxy, fake_upstream: FakeUpstream
) -> None:
    """A stream's headers leave before the context is built: its last chunk carries it, on chat
    (SSE ``chat.completion.chunk``) and on execute (spec v2.5 chunks)."""
    fake_upstream.script("cheap", reviewer_answer(1, "verify_fix"), reviewer_answer(1, "verify_fix"))
    chat = {
        "model": f"module:{REVIEWER}",
        "stream": True,
        "messages": [*HISTORY, {"role": "user", "content": json.dumps(FIX)}],
    }
    async with aiohttp.ClientSession() as session:
        resp = await session.post(px.base + "/chat/completions", json=chat)
        assert resp.status == 200
        lines = [line.decode().strip() for line in [raw async for raw in resp.content]]
        resp = await session.post(
            f"{px.url}/v1/modules/{REVIEWER}/execute",
            json={"input": {**FIX, "_context": {"session_state": STATE}}},
            headers={"Accept": "text/event-stream"},
        )
        assert resp.status == 200
        events = await read_sse(resp)
    chunks = [json.loads(line[6:]) for line in lines if line.startswith("data: {")]
    assert chunks[-1]["cognitive"]["context"] == [
        {"type": "conversation_history", "source": "messages", "turns": 2}
    ]
    assert events[-1][1]["cognitive"]["context"] == [{"type": "session_state", "source": "client"}]


async def test_a_module_without_context_says_none(px: RunningProxy, fake_upstream: FakeUpstream) -> None:
    fake_upstream.script("cheap", envelope(0.9))
    _, headers, answer = await execute(px.url, "code-reviewer", {"code": "x = 1"}, SESSION)
    assert answer["ok"] is True and headers[CONTEXT_HEADER] == "none"


async def test_the_docs_session_example_shows_the_context_the_second_call_used(tmp_path: Path) -> None:
    """docs/context.md's two-call session, run by bash as written (but for the port) against the
    demo policy's offline provider, prints the documented headers: the second call names the
    session_state and previous_result the first one left."""
    assert shutil.which("curl"), "curl is needed (make doc-tools)"
    page = ROOT / "docs" / "context.md"
    script = block_after(page, "**Seeing the context a call used.**", "sh")
    documented = block_after(page, "<!-- context-output -->", "text").splitlines()
    policy = yaml.safe_load((ROOT / "policies" / "demo.yaml").read_text())
    async with running_proxy(tmp_path, policy) as px:
        out = await run_snippet(script, px.url)
    assert out.decode().replace("\r", "").splitlines() == documented
