"""A proxy with its review console (admin listener, admin key) in front of the fake upstream,
a reviewer's HTTP session to it, and the answers that go to review."""

from __future__ import annotations

import json
import re
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp

from tests.fake_upstream import FakeUpstream
from tests.proxy_server import RunningProxy, free_port, running_proxy, upstream_policy

ADMIN = "sk-admin-console-key"
CLIENT = "sk-client-console-key"
REVIEW_INPUT = {"code": "def f(x):\n    return x\n", "language": "python"}
HIDDEN_CSRF = re.compile(r'name="csrf" value="([^"]*)"')


def envelope(confidence: float = 0.95, risk: str = "high", **data: Any) -> dict[str, Any]:
    """A code-reviewer answer; high risk on both rungs sends it to review (tier decision)."""
    body: dict[str, Any] = {"issues": [], "summary": "s", "verdict": "approve", "rationale": "r"}
    body.update(data)
    return {"ok": True, "meta": {"confidence": confidence, "risk": risk, "explain": "e"}, "data": body}


async def send_to_review(px: RunningProxy, fake: FakeUpstream, answer: dict[str, Any] | None = None) -> str:
    """One module call both rungs answer with ``answer`` (high risk): its trace id, decided review."""
    return await send_to_review_at(px.base, fake, answer)


async def send_to_review_at(base: str, fake: FakeUpstream, answer: dict[str, Any] | None = None) -> str:
    """``send_to_review`` to the API at ``base`` (``.../v1``)."""
    reply = json.dumps(answer or envelope())
    fake.script("cheap", reply)
    fake.script("strong", reply)
    async with (
        aiohttp.ClientSession() as session,
        session.post(
            base + "/modules/code-reviewer/execute",
            json={"input": REVIEW_INPUT},
            headers={"Authorization": f"Bearer {CLIENT}"},
        ) as resp,
    ):
        assert resp.headers["X-Cognitive-Decision"] == "review", await resp.text()
        return resp.headers["X-Cognitive-Trace-Id"]


@dataclass
class Reviewer:
    """An admin listener's address and a browser-like session to it (cookies kept)."""

    url: str
    http: aiohttp.ClientSession

    async def page(self, path: str) -> tuple[int, str]:
        async with self.http.get(self.url + path, allow_redirects=False) as resp:
            return resp.status, await resp.text()

    async def csrf(self, path: str) -> str:
        status, text = await self.page(path)
        assert status == 200, (status, text[:300])
        found = HIDDEN_CSRF.search(text)
        assert found, text[:500]
        return found.group(1)

    async def post(self, path: str, form: dict[str, str]) -> tuple[int, str, aiohttp.ClientResponse]:
        async with self.http.post(self.url + path, data=form, allow_redirects=False) as resp:
            return resp.status, await resp.text(), resp

    async def login(self, key: str = ADMIN) -> int:
        token = await self.csrf("/review/login")
        status, _, _ = await self.post("/review/session", {"csrf": token, "key": key})
        return status


@dataclass
class Console(Reviewer):
    """A reviewer of the proxy ``px`` (served in this process)."""

    px: RunningProxy


@asynccontextmanager
async def console_proxy(tmp_path: Path, fake: FakeUpstream, **policy: Any) -> AsyncIterator[Console]:
    port = free_port()
    async with (
        running_proxy(
            tmp_path,
            upstream_policy(fake, **policy),
            api_keys=frozenset({CLIENT}),
            admin_keys=frozenset({ADMIN}),
            admin_port=port,
        ) as px,
        aiohttp.ClientSession(cookie_jar=aiohttp.CookieJar(unsafe=True)) as http,
    ):
        yield Console(url=f"http://127.0.0.1:{port}", http=http, px=px)
