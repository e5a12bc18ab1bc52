"""Hostile model answers, hostile module inputs and hostile module schemas against a served proxy
(issue #10 findings 3, 4, 6 and 10)."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import aiohttp
import yaml

from proxy.contract.engine import OFF_LOOP_CHARS
from proxy.contract.errors import http_status
from proxy.jsonshape import MAX_JSON_DEPTH
from tests.conftest import SCHEMA, write_module
from tests.fake_upstream import FakeUpstream
from tests.proxy_server import UPSTREAM_KEY, UPSTREAM_KEY_ENV, ServedProcess, proxy_process
from tests.security.conftest import security_policy
from tests.security.harness import Canary
from tests.support.polling import until

REVIEW_INPUT = {"code": "def f(x):\n    return x\n", "language": "python"}
FENCE_BOMB = "```" + " " * 40_000 + "x"


async def execute(served: ServedProcess, module: str, value: Any) -> tuple[int, dict[str, Any]]:
    """``value`` is the input, or its JSON text (for depths the stdlib encoder cannot write)."""
    text = value if isinstance(value, str) else json.dumps(value)
    async with (
        aiohttp.ClientSession() as session,
        session.post(
            f"{served.url}/v1/modules/{module}/execute",
            data='{"input": ' + text + "}",
            headers={"Content-Type": "application/json"},
        ) as resp,
    ):
        return resp.status, await resp.json()


async def chat(served: ServedProcess, module: str, content: str) -> tuple[int, dict[str, Any]]:
    body = {"model": f"module:{module}", "messages": [{"role": "user", "content": content}]}
    async with (
        aiohttp.ClientSession() as session,
        session.post(f"{served.url}/v1/chat/completions", json=body) as resp,
    ):
        return resp.status, await resp.json()


def with_nested(depth: int) -> str:
    """The review input with an ``extra`` field nesting ``depth`` objects, as JSON text."""
    return json.dumps(REVIEW_INPUT)[:-1] + ', "extra": ' + '{"a": ' * depth + "1" + "}" * depth + "}"


# -- finding 3: parse time ----------------------------------------------------------------------


async def test_a_fence_bomb_answer_is_a_prompt_parse_error(
    served: ServedProcess, fake_upstream: FakeUpstream
) -> None:
    fake_upstream.set_default_reply("cheap", FENCE_BOMB)
    fake_upstream.set_default_reply("strong", FENCE_BOMB)
    status, env = await execute(served, "code-reviewer", REVIEW_INPUT)
    assert env["ok"] is False and env["error"]["code"] == "E1000"
    assert status == 200  # a failure of the model's output is an answer: ok false, HTTP 200


async def test_healthz_answers_while_a_large_hostile_answer_is_checked(
    served: ServedProcess, fake_upstream: FakeUpstream
) -> None:
    """The contract work on a long answer runs off the event loop: /healthz keeps answering
    between the moment the upstream answered and the moment the module answer arrives."""
    hostile = "[] " * 1_000_000 + FENCE_BOMB
    assert len(hostile) > OFF_LOOP_CHARS
    fake_upstream.set_default_reply("cheap", hostile)
    fake_upstream.set_default_reply("strong", hostile)
    async with aiohttp.ClientSession() as session:
        call = asyncio.create_task(execute(served, "code-reviewer", REVIEW_INPUT))
        await until(
            lambda: fake_upstream.count("/v1/chat/completions"), "the upstream call", timeout=10, step=0.005
        )
        answered_meanwhile = 0
        while not call.done():
            async with session.get(f"{served.url}/healthz") as resp:
                assert resp.status == 200
            if not call.done():
                answered_meanwhile += 1
        _, env = await call
    assert env["error"]["code"] == "E1000"
    assert answered_meanwhile >= 3


# -- finding 4: remote $ref -----------------------------------------------------------------------


def ref_module(root: Path, ref: str) -> Path:
    schema = json.loads(json.dumps(SCHEMA))
    schema["data"]["properties"]["extra"] = {"$ref": ref}
    return write_module(root, "reffy", schema=schema)


async def test_validate_refuses_a_remote_ref_and_never_fetches_it(tmp_path: Path, canary: Canary) -> None:
    for ref in (f"URL:{canary.url}/x.json", f"{canary.url}/x.json", f"//{canary.host}:{canary.port}/x"):
        path = ref_module(tmp_path / str(abs(hash(ref))), ref)
        result = await asyncio.to_thread(
            subprocess.run,
            [sys.executable, "-m", "proxy", "validate", str(path)],
            capture_output=True,
            text=True,
            check=False,
        )
        output = result.stdout + result.stderr
        assert result.returncode == 1, output
        assert str(path / "schema.json") in output
        assert "$ref at #/data/properties/extra/$ref" in output


async def test_serve_refuses_a_remote_ref_module_and_never_fetches_it(
    tmp_path: Path, fake_upstream: FakeUpstream, canary: Canary
) -> None:
    modules = tmp_path / "modules"
    ref_module(modules, f"URL:{canary.url}/x.json")
    write_module(modules, "fine")
    policy = tmp_path / "policy.yaml"
    policy.write_text(yaml.safe_dump(security_policy(fake_upstream)))
    async with (
        proxy_process("--policy", str(policy), env={UPSTREAM_KEY_ENV: UPSTREAM_KEY}, modules=modules) as proc,
        aiohttp.ClientSession() as session,
        session.get(f"{proc.url}/v1/modules") as resp,
    ):
        listed = [m["id"] for m in (await resp.json())["data"]]
    assert listed == ["fine"]


# -- finding 6: token cap for every input form ----------------------------------------------------


async def test_plain_text_over_the_token_cap_is_refused_before_any_upstream_call(
    served: ServedProcess, fake_upstream: FakeUpstream
) -> None:
    text = "an idea " * 4_000  # 32,000 bytes, about 8,000 tokens; idea-explorer accepts 4,000
    status, env = await chat(served, "idea-explorer", text)
    assert status == http_status("E1005")
    assert env["error"]["code"] == "E1005"
    assert env["error"]["details"]["max_input_tokens"] == 4000
    assert fake_upstream.count("/v1/chat/completions") == 0
    status, env = await chat(served, "idea-explorer", json.dumps({"query": text}))
    assert env["error"]["code"] == "E1005"
    assert fake_upstream.count("/v1/chat/completions") == 0


# -- finding 10: depth ----------------------------------------------------------------------------


async def test_a_deeply_nested_input_is_e1001_on_execute_and_chat(
    served: ServedProcess, fake_upstream: FakeUpstream
) -> None:
    deep = with_nested(1000)
    status, env = await execute(served, "code-reviewer", deep)
    assert (status, env["error"]["code"]) == (400, "E1001")
    assert env["error"]["details"]["max_depth"] == MAX_JSON_DEPTH
    status, env = await chat(served, "code-reviewer", deep)
    assert (status, env["error"]["code"]) == (400, "E1001")
    assert fake_upstream.count("/v1/chat/completions") == 0
    _, env = await execute(served, "code-reviewer", with_nested(MAX_JSON_DEPTH - 1))
    assert env["error"]["code"] == "E1000"  # at the bound the input is sent (the fake's answer is prose)
    assert fake_upstream.count("/v1/chat/completions") > 0


async def test_a_deeply_nested_model_answer_is_an_e1000_envelope(
    served: ServedProcess, fake_upstream: FakeUpstream
) -> None:
    for depth in (300, 2000):
        answer = json.dumps({"ok": True, "meta": {"confidence": 0.9, "risk": "low", "explain": "e"}})[:-1]
        answer += ', "data": ' + "[" * depth + "]" * depth + "}"
        fake_upstream.set_default_reply("cheap", answer)
        fake_upstream.set_default_reply("strong", answer)
        status, env = await execute(served, "code-reviewer", REVIEW_INPUT)
        assert env["error"]["code"] == "E1000", env
        assert "too deeply nested" in env["error"]["message"]
        assert status == 200  # a failure of the model's output is an answer: ok false, HTTP 200


# -- JSON the proxy cannot write back ------------------------------------------------------------------

UNWRITABLE = {
    "a lone surrogate": '"rationale": "looks fine \\ud800"',
    "an integer of 400 digits": '"line": 1' + "0" * 400,
}


async def test_an_answer_holding_json_the_proxy_cannot_write_is_e1000_not_500(
    served: ServedProcess, fake_upstream: FakeUpstream
) -> None:
    """orjson refuses a lone surrogate and a number beyond a double; the parser fell back to the
    stdlib decoder, which takes both, and the accepted envelope then failed to serialise: 500 on
    execute, chat and responses. Such an answer is E1000 (200, ``ok: false``) like any text that
    is not JSON the proxy can carry."""
    from tests.security.test_contract_honesty import success_case

    _, value, example = success_case("code-reviewer")
    text = json.dumps(example)
    line = f'"line": {example["data"]["issues"][0]["line"]}'
    rationale = f'"rationale": {json.dumps(example["data"]["rationale"])}'
    for what, evil in UNWRITABLE.items():
        answer = text.replace(rationale if "rationale" in evil else line, evil, 1)
        assert answer != text
        fake_upstream.set_default_reply("cheap", answer)
        fake_upstream.set_default_reply("strong", answer)
        status, env = await execute(served, "code-reviewer", value)
        assert status == 200, (what, status, env)
        assert env["ok"] is False and env["error"]["code"] == "E1000", (what, env)
        async with (
            aiohttp.ClientSession() as session,
            session.post(
                f"{served.url}/v1/chat/completions",
                json={
                    "model": "module:code-reviewer",
                    "messages": [{"role": "user", "content": json.dumps(value)}],
                },
            ) as resp,
        ):
            assert resp.status == 200, (what, await resp.text())


async def test_a_passthrough_chat_body_too_deep_to_forward_is_a_400(
    served: ServedProcess, fake_upstream: FakeUpstream
) -> None:
    """A chat body is re-encoded for the provider, and orjson writes at most 254 levels: a body
    nested deeper used to be a 500; it is the caller's 400, and nothing is sent upstream."""
    deep = '{"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "hi"}], "metadata": '
    body = deep + '{"a": ' * 300 + "1" + "}" * 300 + "}"
    async with (
        aiohttp.ClientSession() as session,
        session.post(
            f"{served.url}/v1/chat/completions", data=body, headers={"Content-Type": "application/json"}
        ) as resp,
    ):
        status, answer = resp.status, await resp.json()
    assert status == 400
    assert answer["error"]["code"] == "too_deeply_nested"
    assert fake_upstream.count("/v1/chat/completions") == 0
