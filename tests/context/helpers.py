"""Shared pieces of the context-protocol tests: answers for interactive-reviewer, and reading the
module input the proxy sent upstream out of the fake's request log."""

from __future__ import annotations

import json
from typing import Any

import aiohttp

from tests.fake_upstream import FakeUpstream
from tests.support.redis_server import redis_url

REDIS_URL = redis_url(15)
REVIEWER = "interactive-reviewer"
LOGIN = {"code": "def login(u, p): ...", "file": "login.py"}
FIX = {"code": "# Fix the SQL injection", "file": "login.py"}


def reviewer_answer(
    issues: int, action: str, *, confidence: float = 0.9, risk: str = "medium", emitted: Any = None
) -> str:
    """An interactive-reviewer answer that emits its session state."""
    state = {"files_reviewed": ["login.py"], "issues_found": issues, "last_action": action}
    return json.dumps(
        {
            "ok": True,
            "meta": {"confidence": confidence, "risk": risk, "explain": f"{issues} issues"},
            "data": {
                "issues": [{"description": f"issue {i}", "risk": risk} for i in range(issues)],
                "summary": f"{issues} issues",
                "rationale": "reasons",
            },
            "_emitted_context": {"session_state": state} if emitted is None else emitted,
        }
    )


def sent_inputs(fake: FakeUpstream) -> list[dict[str, Any]]:
    """The module input of every chat request the proxy sent upstream, in order."""
    out = []
    for record in fake.requests:
        if record.path != "/v1/chat/completions" or not isinstance(record.json, dict):
            continue
        user = next(m for m in record.json["messages"] if m["role"] == "user")["content"]
        out.append(json.loads(user.split("```json\n", 1)[1].rsplit("\n```", 1)[0]))
    return out


async def execute(
    base: str, module: str, value: Any, headers: dict[str, str] | None = None
) -> tuple[int, dict[str, str], dict[str, Any]]:
    async with aiohttp.ClientSession() as session:
        resp = await session.post(
            f"{base}/v1/modules/{module}/execute", json={"input": value}, headers=headers or {}
        )
        return resp.status, dict(resp.headers), await resp.json()


EARLIER = [{"role": "user" if i % 2 == 0 else "assistant", "content": f"turn {i}"} for i in range(7)]
"""Seven earlier chat messages: more than interactive-reviewer's ``max_turns: 5``."""


async def chat_after_earlier_turns(base: str) -> tuple[aiohttp.ClientResponse, dict[str, Any]]:
    """A chat-completions call of interactive-reviewer whose messages hold ``EARLIER`` then the
    module input; the response and its body."""
    body = {
        "model": f"module:{REVIEWER}",
        "messages": [*EARLIER, {"role": "user", "content": json.dumps(FIX)}],
    }
    async with aiohttp.ClientSession() as session:
        resp = await session.post(base + "/chat/completions", json=body)
        assert resp.status == 200, await resp.text()
        reply: dict[str, Any] = await resp.json()
    return resp, reply
