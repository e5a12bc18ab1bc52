"""The README's five-minute tour, on the embedded default (demo policy, offline provider)."""

from __future__ import annotations

import asyncio
import functools
import io
import json
import re
import shlex
import shutil
from pathlib import Path

import pytest
import yaml

from tests.conftest import ROOT
from tests.proxy_server import cognitive_of, running_proxy
from tests.support.snippets import block_after, run_snippet


async def test_five_minute_tour_on_the_demo_policy(tmp_path: Path) -> None:
    policy = yaml.safe_load((ROOT / "policies" / "demo.yaml").read_text())
    async with running_proxy(tmp_path, policy) as px:
        client = px.client(api_key="anything")
        reply = await client.chat.completions.create(
            model="gpt-4o-mini", messages=[{"role": "user", "content": "Hello!"}]
        )
        assert "offline demo provider" in (reply.choices[0].message.content or "")

        stream = await client.chat.completions.create(
            model="gpt-4o-mini", messages=[{"role": "user", "content": "Hello!"}], stream=True
        )
        assert "offline demo provider" in "".join([c.choices[0].delta.content or "" async for c in stream])

        code = json.loads((ROOT / "modules/code-simplifier/tests/case1.input.json").read_text())
        raw = await client.chat.completions.with_raw_response.create(
            model="module:code-simplifier", messages=[{"role": "user", "content": json.dumps(code)}]
        )
        assert raw.headers["x-cognitive-decision"] == "accept"
        assert json.loads(raw.parse().choices[0].message.content or "")["ok"] is True

        review = json.loads((ROOT / "modules/code-reviewer/tests/case_minor_issues.input.json").read_text())
        raw = await client.chat.completions.with_raw_response.create(
            model="module:code-reviewer", messages=[{"role": "user", "content": json.dumps(review)}]
        )
        assert raw.headers["x-cognitive-decision"] == "escalated"
        assert raw.headers["x-cognitive-model"] == "offline/large"
        attempts = cognitive_of(raw.parse())["attempts"]
        assert [a["outcome"] for a in attempts] == ["escalate", "accept"]

        mine = {"code": "def add(a, b):\n    return a+b\n", "language": "python"}
        raw = await client.chat.completions.with_raw_response.create(
            model="module:code-reviewer", messages=[{"role": "user", "content": json.dumps(mine)}]
        )
        assert raw.headers["x-cognitive-decision"] == "review"
        assert json.loads(raw.parse().choices[0].message.content or "")["meta"]["explain"] == (
            "offline demo: no model was called"
        )

        models = [m.id for m in (await client.models.list()).data]
        assert {"gpt-4o-mini", "gpt-4o", "module:code-reviewer"} <= set(models)


def readme_block(marker: str, lang: str) -> str:
    """The first ```lang block of README.md after ``marker``."""
    return block_after(ROOT / "README.md", marker, lang)


def matches(documented: str, printed: str) -> bool:
    """A documented output line against a printed one; ``…`` stands for anything."""
    pattern = ".*".join(re.escape(part) for part in documented.split("…"))
    return re.fullmatch(pattern, printed) is not None


async def test_the_readme_tour_prints_what_the_readme_says(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The tour's code block, exactly as written (but for the port), prints the README's
    output block line for line."""
    code = readme_block("## A five-minute tour", "python")
    documented = readme_block("<!-- tour-output -->", "text").splitlines()
    policy = yaml.safe_load((ROOT / "policies" / "demo.yaml").read_text())
    monkeypatch.chdir(ROOT)  # the tour opens golden cases by their path in the repository
    async with running_proxy(tmp_path, policy) as px:
        assert "http://localhost:8080/v1" in code
        runnable = compile(code.replace("http://localhost:8080/v1", px.base), "README.md", "exec")
        out = io.StringIO()  # the tour's own prints, apart from the proxy's log lines
        await asyncio.to_thread(exec, runnable, {"print": functools.partial(print, file=out)})
    printed = out.getvalue().splitlines()
    assert len(printed) == len(documented), printed
    for want, got in zip(documented, printed, strict=True):
        assert matches(want, got), (want, got)


async def test_the_readme_curl_lines_answer(tmp_path: Path) -> None:
    """The tour's `curl` lines, against the same demo proxy."""
    curl = shutil.which("curl")
    assert curl is not None, "curl is not installed (make doc-tools installs it)"
    lines = readme_block("The same without the SDK", "sh").strip().splitlines()
    policy = yaml.safe_load((ROOT / "policies" / "demo.yaml").read_text())
    outputs = []
    async with running_proxy(tmp_path, policy) as px:
        for line in lines:
            argv = shlex.split(line.replace("localhost:8080", px.url.removeprefix("http://")))
            assert argv[0] == "curl"
            proc = await asyncio.create_subprocess_exec(
                curl, "--fail-with-body", *argv[1:], stdout=asyncio.subprocess.PIPE
            )
            out, _ = await proc.communicate()
            assert proc.returncode == 0, (line, out)
            outputs.append(out)
    assert b"X-Cognitive-Decision: review" in outputs[0] and b'"ok":true' in outputs[0]
    assert b'"status":"ready"' in outputs[1].replace(b" ", b"")
    assert b"cognitive_requests_total" in outputs[2]


async def test_the_readme_session_example_carries_context_to_the_second_call(tmp_path: Path) -> None:
    """The two-call `interactive-reviewer` session of "Bundled modules", run by bash as written
    (but for the port): each call emits its session_state, the second one after the fix."""
    assert shutil.which("curl") and shutil.which("jq"), "curl and jq are needed (make doc-tools)"
    script = readme_block("## Bundled modules", "sh")
    policy = yaml.safe_load((ROOT / "policies" / "demo.yaml").read_text())
    async with running_proxy(tmp_path, policy) as px:
        out = await run_snippet(script, px.url)
    decoder, text, emitted = json.JSONDecoder(), out.decode().strip(), []
    while text:
        value, end = decoder.raw_decode(text)
        emitted.append(value)
        text = text[end:].strip()
    assert [e["session_state"]["last_action"] for e in emitted] == ["code_review", "verify_fix"]
