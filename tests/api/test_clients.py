"""The decision as LangChain sees it (langchain-openai's ChatOpenAI against a live proxy): the
headers with ``include_response_headers=True``, and ``system_fingerprint`` on every answer,
streamed or not, which LangChain keeps in ``response_metadata``."""

from __future__ import annotations

import json
from pathlib import Path

import yaml
from langchain_core.messages import AIMessageChunk
from langchain_openai import ChatOpenAI

from tests.conftest import ROOT
from tests.proxy_server import running_proxy

CASE = ROOT / "modules" / "code-reviewer" / "tests" / "case_minor_issues.input.json"


def decision_of(fingerprint: str) -> dict[str, str]:
    """The README's one-liner for reading ``cogproxy:decision=...;tier=...``."""
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
