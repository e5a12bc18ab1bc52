"""Module policies and tools (conformance Level 3): what the provider sees, what the answer may do,
and which targets may serve a module."""

from __future__ import annotations

from pathlib import Path

import aiohttp

from proxy.contract.errors import BY_CODE
from tests.compose.build import answer, make_module
from tests.compose.harness import chat, composed, envelope_of, execute, sent_to
from tests.fake_upstream import FakeUpstream
from tests.proxy_server import running_proxy, upstream_policy


def _tool(name: str) -> dict[str, object]:
    return {"type": "function", "function": {"name": name, "parameters": {"type": "object"}}}


async def _metric(url: str, line: str) -> bool:
    async with aiohttp.ClientSession() as session, session.get(url + "/metrics") as resp:
        return line in await resp.text()


async def test_denied_tools_are_stripped_from_the_upstream_request(
    tmp_path: Path, fake_upstream: FakeUpstream
) -> None:
    mods = tmp_path / "m"
    make_module(
        mods, "tooled", tools={"policy": "deny_by_default", "allowed": ["search"], "denied": ["write_file"]}
    )
    make_module(mods, "toolless")
    fake_upstream.set_default_reply("m-tooled", answer(0.9))
    fake_upstream.set_default_reply("m-toolless", answer(0.9))
    tools = [_tool("search"), _tool("write_file"), _tool("shell")]
    async with composed(tmp_path, fake_upstream, mods, ["tooled", "toolless"]) as proxy:
        status, _ = await chat(proxy, "tooled", {"x": 1}, tools=tools)
        plain_status, _ = await chat(proxy, "toolless", {"x": 1}, tools=tools)
        counted = await _metric(proxy.url, 'cognitive_tools_stripped_total{module="tooled"} 2.0')
    assert status == 200 and plain_status == 200
    sent = sent_to(fake_upstream, "tooled")[0]
    assert [t["function"]["name"] for t in sent["tools"]] == ["search"]
    assert "tools" not in sent_to(fake_upstream, "toolless")[0]  # deny_by_default: none reach the model
    assert counted


async def test_a_call_to_a_denied_tool_in_the_answer_fails_the_contract(
    tmp_path: Path, fake_upstream: FakeUpstream
) -> None:
    mods = tmp_path / "m"
    make_module(mods, "tooled", tools={"policy": "allow_by_default", "denied": ["shell"]})
    fake_upstream.set_default_reply("m-tooled", answer(0.95))
    fake_upstream.tool_calls["m-tooled"] = ["search", "shell"]
    async with composed(tmp_path, fake_upstream, mods, ["tooled"]) as proxy:
        status, reply = await chat(proxy, "tooled", {"x": 1}, tools=[_tool("search"), _tool("shell")])
        fake_upstream.tool_calls["m-tooled"] = ["search"]
        allowed_status, allowed = await chat(proxy, "tooled", {"x": 1}, tools=[_tool("search")])
    env = envelope_of(reply)
    assert status == 200 and env["ok"] is False and env["error"]["code"] == "E4007"
    assert "shell" in env["error"]["message"] and "search" not in env["error"]["message"]
    assert reply["cognitive"]["attempts"][0]["error"] == "contract:E4007"
    assert allowed_status == 200 and envelope_of(allowed)["ok"] is True


async def test_network_deny_refuses_url_inputs_before_any_upstream_call(
    tmp_path: Path, fake_upstream: FakeUpstream
) -> None:
    mods = tmp_path / "m"
    make_module(mods, "offline-only", policies={"network": "deny"})
    make_module(mods, "online")
    fake_upstream.set_default_reply("m-online", answer(0.9))
    fake_upstream.set_default_reply("m-offline-only", answer(0.9))
    media = {"image": {"type": "url", "url": "https://example.com/cat.png"}, "note": "see https://x.y"}
    async with composed(tmp_path, fake_upstream, mods, ["offline-only", "online"]) as proxy:
        status, _, env = await execute(proxy, "offline-only", media)
        inline_status, _, _ = await execute(
            proxy, "offline-only", {"image": {"type": "base64", "data": "AAAA"}}
        )
        online_status, _, _ = await execute(proxy, "online", media)
    assert status == 403 and env["error"]["code"] == "E4007"
    assert "input.image.url is a network URL" in env["error"]["message"]
    assert inline_status == 200 and online_status == 200
    assert [r.model for r in fake_upstream.requests] == ["m-offline-only", "m-online"]


async def test_targets_without_a_required_capability_are_skipped(
    tmp_path: Path, fake_upstream: FakeUpstream
) -> None:
    mods = tmp_path / "m"
    make_module(mods, "structured")
    make_module(mods, "loose", runtime_requirements={"structured_output": False})
    fake_upstream.set_default_reply("plain", answer(0.9))
    fake_upstream.set_default_reply("json", answer(0.9))
    policy = upstream_policy(
        fake_upstream,
        ladder=[{"name": "only", "targets": ["up/plain", "up/json"]}],
        capabilities={"up/plain": ["long_context"], "up": ["structured_output", "json_mode"]},
        aliases={},
    )
    async with running_proxy(tmp_path, policy, modules=(mods,)) as proxy:
        status, _, _ = await execute(proxy, "structured", {"x": 1})
        loose_status, _, _ = await execute(proxy, "loose", {"x": 1})
    assert status == 200 and loose_status == 200
    assert [r.model for r in fake_upstream.requests] == ["json", "plain"]


async def test_no_capable_target_is_e4001_naming_the_capability(
    tmp_path: Path, fake_upstream: FakeUpstream
) -> None:
    """error-codes.md has no capability code: no provider can serve the module, E4001 (E4003 is
    CONTEXT_OVERFLOW); the status is the taxonomy's for E4001."""
    mods = tmp_path / "m"
    make_module(mods, "structured")
    policy = upstream_policy(fake_upstream, capabilities={"up": ["long_context"], "anth": ["vision"]})
    async with running_proxy(tmp_path, policy, modules=(mods,)) as proxy:
        status, _, env = await execute(proxy, "structured", {"x": 1})
    assert env["error"]["code"] == "E4001" and status == BY_CODE["E4001"].http_status == 503
    assert "missing capability structured_output" in env["error"]["message"]
    assert env["error"]["details"]["missing_capabilities"] == ["structured_output"]
    assert env["error"]["details"]["reason"] == "capability_unavailable"
    assert "capabilities" in env["error"]["suggestion"]
    assert not fake_upstream.requests


async def test_preferred_capabilities_order_a_rungs_targets(
    tmp_path: Path, fake_upstream: FakeUpstream
) -> None:
    mods = tmp_path / "m"
    make_module(mods, "sighted", runtime_requirements={"preferred_capabilities": ["vision"]})
    make_module(mods, "plain")
    fake_upstream.set_default_reply("text-model", answer(0.9))
    fake_upstream.set_default_reply("vision-model", answer(0.9))
    policy = upstream_policy(
        fake_upstream,
        ladder=[{"name": "only", "targets": ["up/text-model", "up/vision-model"]}],
        capabilities={"up/vision-model": ["structured_output", "vision"], "up": ["structured_output"]},
        aliases={},
    )
    async with running_proxy(tmp_path, policy, modules=(mods,)) as proxy:
        await execute(proxy, "sighted", {"x": 1})
        await execute(proxy, "plain", {"x": 1})
    assert [r.model for r in fake_upstream.requests] == ["vision-model", "text-model"]
