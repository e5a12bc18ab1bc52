"""The decision as LangChain sees it (langchain-openai's ChatOpenAI against a live proxy): the
headers with ``include_response_headers=True``, and ``system_fingerprint`` on every answer,
streamed or not, which LangChain keeps in ``response_metadata``."""

from __future__ import annotations

import ast
import asyncio
import functools
import io
import json
from pathlib import Path

import yaml
from langchain_core.messages import AIMessageChunk
from langchain_openai import ChatOpenAI

from tests.conftest import ROOT
from tests.proxy_server import running_proxy

CASE = ROOT / "modules" / "code-reviewer" / "tests" / "case_minor_issues.input.json"


def decision_of(fingerprint: str) -> dict[str, str]:
    """docs/http-api.md's one-liner for reading ``cogproxy:decision=...;tier=...``."""
    return dict(part.split("=", 1) for part in fingerprint.removeprefix("cogproxy:").split(";"))


async def test_langchain_reads_the_decision_from_headers_and_from_a_stream(tmp_path: Path) -> None:
    policy = yaml.safe_load((ROOT / "policies" / "demo.yaml").read_text())
    async with running_proxy(tmp_path, policy) as px:
        llm = ChatOpenAI(
            model="module:code-reviewer",
            base_url=px.base,
            api_key="unused",  # type: ignore[arg-type]
            include_response_headers=True,
            max_retries=0,
        )
        message = await llm.ainvoke(CASE.read_text())
        assert message.response_metadata["headers"]["x-cognitive-decision"] == "escalated"
        assert decision_of(message.response_metadata["system_fingerprint"])["decision"] == "escalated"
        assert json.loads(str(message.content))["ok"] is True

        plain = ChatOpenAI(model="module:code-reviewer", base_url=px.base, api_key="unused", max_retries=0)  # type: ignore[arg-type]
        final: AIMessageChunk | None = None
        async for chunk in plain.astream(json.dumps({"code": "x = 1"})):
            final = chunk if final is None else final + chunk
        assert final is not None
        seen = decision_of(final.response_metadata["system_fingerprint"])
        assert seen["decision"] == "review" and seen["tier"] == "decision"
        assert float(seen["confidence"]) < 0.5


async def test_the_documented_langchain_snippet_prints_the_decision(tmp_path: Path) -> None:
    """docs/http-api.md's LangChain snippet, as written (but for the port): a made-up input goes
    to review, read from the headers, from the fingerprint and from a stream's last chunk."""
    text = (ROOT / "docs" / "http-api.md").read_text(encoding="utf-8")
    code = (
        text.split("Reading the decision from LangChain", 1)[1].split("```python\n", 1)[1].split("```", 1)[0]
    )
    assert "http://localhost:8080/v1" in code
    policy = yaml.safe_load((ROOT / "policies" / "demo.yaml").read_text())
    async with running_proxy(tmp_path, policy) as px:
        runnable = compile(code.replace("http://localhost:8080/v1", px.base), "docs/http-api.md", "exec")
        out = io.StringIO()
        await asyncio.to_thread(exec, runnable, {"print": functools.partial(print, file=out)})
    headers, fingerprint, streamed = out.getvalue().splitlines()
    assert headers == "review" and streamed == "review"
    assert ast.literal_eval(fingerprint)["decision"] == "review"
