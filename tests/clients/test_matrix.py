"""The client matrix (issue #27): openai-python, langchain-openai and openai-node against the
offline demo, plain and module calls, sync and streamed. Each family's streamed content
concatenates to its sync content (for a module: the envelope, byte for byte but for the per-call
``trace_id`` and ``latency_ms``), and each can read the decision."""

from __future__ import annotations

import asyncio
import json
import shutil
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from langchain_core.messages import AIMessageChunk
from langchain_openai import ChatOpenAI

from tests.api.test_stream_contract import per_call_free
from tests.conftest import ROOT
from tests.proxy_server import RunningProxy, cognitive_of, running_proxy

CASE = (ROOT / "modules" / "code-reviewer" / "tests" / "case_minor_issues.input.json").read_text()
NODE_DIR = ROOT / "tests" / "node"
PLAIN = ("gpt-4o-mini", "Say hello.")
MODULE = ("module:code-reviewer", CASE)
CALLS = pytest.mark.parametrize(("model", "text"), [PLAIN, MODULE], ids=["plain", "module"])


def decision_of(fingerprint: str | None) -> dict[str, str]:
    """``cogproxy:decision=...;tier=...`` -> dict (the README's one-liner)."""
    assert fingerprint is not None and fingerprint.startswith("cogproxy:"), fingerprint
    return dict(part.split("=", 1) for part in fingerprint.removeprefix("cogproxy:").split(";"))


def same_answer(model: str, streamed: str, sync: str) -> None:
    if model.startswith("module:"):
        assert json.loads(streamed)["ok"] is True
        assert per_call_free(streamed) == per_call_free(sync)
    else:
        assert streamed == sync and sync


@pytest.fixture
async def demo(tmp_path: Path) -> AsyncIterator[RunningProxy]:
    policy = yaml.safe_load((ROOT / "policies" / "demo.yaml").read_text())
    async with running_proxy(tmp_path, policy) as proxy:
        yield proxy


@CALLS
async def test_openai_python(demo: RunningProxy, model: str, text: str) -> None:
    client = demo.client()
    messages: Any = [{"role": "user", "content": text}]
    raw = await client.chat.completions.with_raw_response.create(model=model, messages=messages)
    sync = raw.parse().choices[0].message.content or ""
    stream = await client.chat.completions.create(model=model, messages=messages, stream=True)
    chunks = [chunk async for chunk in stream]
    streamed = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    same_answer(model, streamed, sync)
    if model.startswith("module:"):
        assert raw.headers["x-cognitive-decision"] == "escalated"
        assert cognitive_of(raw.parse())["decision"] == "escalated"
        assert decision_of(chunks[-1].system_fingerprint)["decision"] == "escalated"
        reasoning = "".join(
            (c.choices[0].delta.model_extra or {}).get("reasoning_content") or "" for c in chunks if c.choices
        )
        assert "escalating to strong" in reasoning


@CALLS
async def test_langchain_openai(demo: RunningProxy, model: str, text: str) -> None:
    llm = ChatOpenAI(
        model=model,
        base_url=demo.base,
        api_key="unused",  # type: ignore[arg-type]
        include_response_headers=True,
        max_retries=0,
    )
    message = await llm.ainvoke(text)
    final: AIMessageChunk | None = None
    async for chunk in llm.astream(text):
        final = chunk if final is None else final + chunk
    assert final is not None
    same_answer(model, str(final.content), str(message.content))
    if model.startswith("module:"):
        assert message.response_metadata["headers"]["x-cognitive-decision"] == "escalated"
        assert decision_of(message.response_metadata["system_fingerprint"])["decision"] == "escalated"
        assert decision_of(final.response_metadata["system_fingerprint"])["decision"] == "escalated"


def node_missing() -> str | None:
    """Why the Node family cannot run here, or None."""
    if shutil.which("node") is None:
        return "node is not installed"
    if not (NODE_DIR / "node_modules" / "openai").is_dir():
        return "tests/node/node_modules is missing: run `make node-clients` (needs npm)"
    return None


@CALLS
async def test_openai_node(demo: RunningProxy, model: str, text: str) -> None:
    missing = node_missing()
    if missing is not None:
        pytest.skip(missing)
    node = await asyncio.create_subprocess_exec(
        "node",
        str(NODE_DIR / "matrix.mjs"),
        demo.base,
        model,
        text,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await node.communicate()
    assert node.returncode == 0, err.decode()
    seen = json.loads(out)
    same_answer(model, seen["streamed"], seen["sync"])
    if model.startswith("module:"):
        assert seen["sync_decision"] == "escalated"
        assert decision_of(seen["sync_fingerprint"])["decision"] == "escalated"
        assert decision_of(seen["stream_fingerprint"])["decision"] == "escalated"
        assert "escalating to strong" in seen["reasoning"]
