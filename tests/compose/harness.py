"""A proxy over a directory of test modules, each module answered by its own fake model."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import aiohttp

from tests.fake_upstream import FakeUpstream
from tests.proxy_server import RunningProxy, running_proxy, upstream_policy


def model_of(module: str) -> str:
    return f"m-{module}"


def composition_policy(fake: FakeUpstream, modules: list[str], **extra: Any) -> dict[str, Any]:
    """One rung per module, each with its own fake model; every module starts on its rung, so a
    test scripts a module's answers by scripting its model."""
    return upstream_policy(
        fake,
        ladder=[{"name": f"r-{m}", "targets": [f"up/{model_of(m)}"]} for m in modules],
        modules={m: {"start": f"r-{m}"} for m in modules},
        tiers={
            "exec": {"min_confidence": 0.9, "max_risk": "low", "exhausted": "reject"},
            "decision": {"min_confidence": 0.7, "max_risk": "medium", "exhausted": "review"},
            "exploration": {"min_confidence": 0.3, "max_risk": "high", "exhausted": "accept"},
        },
        aliases={},
        failover={"retries": 0, "timeout": {"per_try_s": 5, "total_s": 10}},
        **extra,
    )


@asynccontextmanager
async def composed(
    tmp_path: Path, fake: FakeUpstream, modules_dir: Path, names: list[str], **extra: Any
) -> AsyncIterator[RunningProxy]:
    async with running_proxy(
        tmp_path, composition_policy(fake, names, **extra), modules=(modules_dir,)
    ) as proxy:
        yield proxy


async def execute(proxy: RunningProxy, module: str, value: Any) -> tuple[int, dict[str, Any], Any]:
    async with (
        aiohttp.ClientSession() as session,
        session.post(f"{proxy.base}/modules/{module}/execute", json={"input": value}) as resp,
    ):
        return resp.status, dict(resp.headers), await resp.json()


async def get_json(proxy: RunningProxy, path: str) -> tuple[int, Any]:
    async with aiohttp.ClientSession() as session, session.get(proxy.url + path) as resp:
        return resp.status, await resp.json()


def sent_to(fake: FakeUpstream, module: str) -> list[dict[str, Any]]:
    """The chat bodies the fake received for ``module``'s model."""
    return [r.json for r in fake.requests if r.model == model_of(module)]


def prompt_of(body: dict[str, Any]) -> str:
    return "\n".join(str(m.get("content")) for m in body["messages"])


def steps_of(cognitive_or_body: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {a["step"]: a for a in cognitive_or_body["attempts"] if "step" in a}


def dumps(value: Any) -> str:
    return json.dumps(value)


async def chat(proxy: RunningProxy, module: str, value: Any, **body: Any) -> tuple[int, Any]:
    """Module mode over chat completions: the reply carries the ``cognitive`` block."""
    payload = {
        "model": f"module:{module}",
        "messages": [{"role": "user", "content": json.dumps(value)}],
        **body,
    }
    async with (
        aiohttp.ClientSession() as session,
        session.post(f"{proxy.base}/chat/completions", json=payload) as resp,
    ):
        return resp.status, await resp.json()


def envelope_of(reply: dict[str, Any]) -> dict[str, Any]:
    content: str = reply["choices"][0]["message"]["content"]
    parsed: dict[str, Any] = json.loads(content)
    return parsed
