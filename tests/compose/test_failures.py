"""Failure propagation (composition.md §7), timeouts, unavailable composites, context modes."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import aiohttp

from tests.compose.build import answer, make_module
from tests.compose.harness import composed, execute, get_json, sent_to
from tests.fake_upstream import FakeUpstream, Fault


def _two_steps(mods: Path, second: dict[str, Any], **composition: Any) -> None:
    make_module(mods, "first")
    make_module(mods, "second")
    make_module(mods, "backup")
    make_module(
        mods,
        "pipe",
        composition={
            "requires": [{"name": "first"}, {"name": "second", **second}],
            "dataflow": [
                {"from": "input", "to": "first"},
                {"from": "first.output", "to": "second"},
                {"from": ["first.output", "second.output"], "to": "output", "aggregate": "merge"},
            ],
            **composition,
        },
    )


NAMES = ["first", "backup", "pipe", "second"]
"""A provider failure moves a call to the next rung: the failing module's rung comes last."""


async def test_a_failing_optional_step_is_null_with_a_warning(
    tmp_path: Path, fake_upstream: FakeUpstream
) -> None:
    _two_steps(tmp_path / "m", {"optional": True})
    fake_upstream.set_default_reply("m-first", answer(0.8, summary="one"))
    fake_upstream.script("m-second", Fault.http(500))
    async with composed(tmp_path, fake_upstream, tmp_path / "m", NAMES) as proxy:
        status, _, env = await execute(proxy, "pipe", {"x": 1})
    assert status == 200 and env["ok"] is True
    assert env["data"] == {"rationale": "because", "summary": "one"}
    assert len(env["_warnings"]) == 1 and env["_warnings"][0].startswith(
        "second: optional step failed (E4001"
    )


async def test_a_failed_required_step_uses_its_fallback(tmp_path: Path, fake_upstream: FakeUpstream) -> None:
    _two_steps(tmp_path / "m", {"fallback": "backup"})
    fake_upstream.set_default_reply("m-first", answer(0.8, summary="one"))
    fake_upstream.script("m-second", Fault.http(500))
    fake_upstream.set_default_reply("m-backup", answer(0.7, findings=["from backup"]))
    async with composed(tmp_path, fake_upstream, tmp_path / "m", NAMES) as proxy:
        status, _, env = await execute(proxy, "pipe", {"x": 1})
    assert status == 200 and env["ok"] is True
    assert env["data"]["findings"] == ["from backup"] and env["meta"]["confidence"] == 0.7
    assert "fallback backup used" in env["_warnings"][0]
    assert len(sent_to(fake_upstream, "backup")) == 1


async def test_a_partial_failure_is_e2002_with_partial_data_per_step(
    tmp_path: Path, fake_upstream: FakeUpstream
) -> None:
    _two_steps(tmp_path / "m", {})
    fake_upstream.set_default_reply("m-first", answer(0.8, "low", summary="one"))
    fake_upstream.script("m-second", Fault.http(500))
    async with composed(tmp_path, fake_upstream, tmp_path / "m", NAMES) as proxy:
        status, headers, env = await execute(proxy, "pipe", {"x": 1})
    assert status == 200 and env["ok"] is False
    assert env["error"]["code"] == "E2002" and env["error"]["message"] == "Composition partially failed"
    assert env["error"]["details"]["failed_step"] == "second"
    assert env["error"]["details"]["step_error"]["code"] == "E4001"
    assert env["partial_data"] == {"first": {"rationale": "because", "summary": "one"}, "second": None}
    assert env["meta"]["confidence"] == 0.8 and "Step second failed (E4001)" in env["meta"]["explain"]
    assert headers["X-Cognitive-Decision"] == "reject"


async def test_a_failing_first_required_step_aborts_with_its_own_error(
    tmp_path: Path, fake_upstream: FakeUpstream
) -> None:
    _two_steps(tmp_path / "m", {})
    fake_upstream.script("m-first", Fault.http(500))
    async with composed(
        tmp_path, fake_upstream, tmp_path / "m", ["second", "backup", "pipe", "first"]
    ) as proxy:
        status, _, env = await execute(proxy, "pipe", {"x": 1})
    assert status == 503 and env["error"]["code"] == "E4001"
    assert not sent_to(fake_upstream, "second")


async def test_a_step_timeout_cancels_the_step(tmp_path: Path, fake_upstream: FakeUpstream) -> None:
    _two_steps(tmp_path / "m", {"optional": True, "timeout_ms": 200})
    fake_upstream.set_default_reply("m-first", answer(0.8, summary="one"))
    fake_upstream.set_default_reply("m-second", Fault.slow(1.5, answer(0.9)))
    async with composed(tmp_path, fake_upstream, tmp_path / "m", NAMES) as proxy:
        status, _, env = await execute(proxy, "pipe", {"x": 1})
        assert fake_upstream.in_flight == 1  # answered while the slow call was still out: not waited for
    assert status == 200 and env["ok"] is True
    assert "E2002: Step 'second' exceeded its timeout of 200 ms" in env["_warnings"][0]


async def test_the_total_timeout_cancels_what_still_runs(tmp_path: Path, fake_upstream: FakeUpstream) -> None:
    _two_steps(tmp_path / "m", {}, timeout_ms=300)
    fake_upstream.set_default_reply("m-first", answer(0.8, summary="one"))
    fake_upstream.set_default_reply("m-second", Fault.slow(1.5, answer(0.9)))
    async with composed(tmp_path, fake_upstream, tmp_path / "m", NAMES) as proxy:
        status, _, env = await execute(proxy, "pipe", {"x": 1})
        assert fake_upstream.in_flight == 1
    assert status == 200 and env["error"]["code"] == "E2002"
    assert env["error"]["message"] == "Composition timed out after 300 ms"
    assert env["partial_data"]["first"] == {"rationale": "because", "summary": "one"}
    assert env["partial_data"]["second"] is None


async def test_an_unavailable_composite_answers_its_load_error_without_an_upstream_call(
    tmp_path: Path, fake_upstream: FakeUpstream
) -> None:
    mods = tmp_path / "m"
    make_module(mods, "a", composition={"requires": [{"name": "b"}]})
    make_module(mods, "b", prompt="@call:a($INPUT)\nAnswer: meta confidence risk explain, data rationale.")
    make_module(mods, "needs-ghost", composition={"requires": [{"name": "ghost", "version": ">=1.0.0"}]})
    make_module(mods, "fine")
    fake_upstream.set_default_reply("m-fine", answer(0.9))
    async with composed(tmp_path, fake_upstream, mods, ["a", "b", "needs-ghost", "fine"]) as proxy:
        status, headers, env = await execute(proxy, "a", {"x": 1})
        ghost_status, _, ghost = await execute(proxy, "needs-ghost", {"x": 1})
        fine_status, _, _ = await execute(proxy, "fine", {"x": 1})
        info_status, info = await get_json(proxy, "/v1/modules/a")
        ready_status, ready = await get_json(proxy, "/readyz")
        _, catalogue = await get_json(proxy, "/v1/modules")
    assert status == 500 and env["error"]["code"] == "E4004"
    assert "Circular dependency detected: a → b → a" in env["error"]["message"]
    assert headers["X-Cognitive-Decision"] == "reject"
    assert ghost_status == 404 and ghost["error"]["code"] == "E4006"
    assert "requires module 'ghost', which is not installed" in ghost["error"]["message"]
    assert fine_status == 200
    assert [r.model for r in fake_upstream.requests] == ["m-fine"]  # nothing else went upstream
    assert info_status == 200 and info["available"] is False
    assert info["load_error"] == {"code": "E4004", "message": "Circular dependency detected: a → b → a"}
    assert ready_status == 200 and ready["status"] == "ready"
    assert any("E4004: Circular dependency detected: a → b → a" in p for p in ready["module_problems"])
    assert {m["id"]: m["available"] for m in catalogue["data"]} == {
        "fine": True,
        "a": False,
        "b": False,
        "needs-ghost": False,
    }


def _context_modules(mods: Path, mode: str) -> None:
    notes = {"accepts": [{"type": "notes"}], "emits": [{"type": "notes"}]}
    make_module(mods, "first", context=notes)
    make_module(mods, "second", context=notes)
    make_module(
        mods,
        "pipe",
        context={"mode": mode},
        composition={
            "requires": [{"name": "first"}, {"name": "second"}],
            "dataflow": [
                {"from": "input", "to": "first"},
                {"from": "input", "to": "second"},
                {"from": ["first.output", "second.output"], "to": "output"},
            ],
        },
    )


def _emitting(summary: str, note: str) -> str:
    envelope = json.loads(answer(0.8, summary=summary))
    envelope["_emitted_context"] = {"notes": {note: True}}
    return json.dumps(envelope)


def _context_sent(fake: FakeUpstream, module: str) -> Any:
    user = sent_to(fake, module)[0]["messages"][1]["content"]
    return json.loads(user.split("```json\n")[1].split("\n```")[0]).get("_context")


async def test_main_mode_shares_one_context_across_steps_and_with_the_parent(
    tmp_path: Path, fake_upstream: FakeUpstream
) -> None:
    _context_modules(tmp_path / "m", "main")
    fake_upstream.set_default_reply("m-first", _emitting("from first", "seen_by_first"))
    fake_upstream.set_default_reply("m-second", _emitting("from second", "seen_by_second"))
    async with composed(tmp_path, fake_upstream, tmp_path / "m", ["first", "second", "pipe"]) as proxy:
        _, _, env = await execute(proxy, "pipe", {"x": 1, "_context": {"notes": {"from_caller": True}}})
    assert _context_sent(fake_upstream, "first") == {"notes": {"from_caller": True}}
    # the earlier step's emission is visible to the later one
    assert _context_sent(fake_upstream, "second") == {"notes": {"from_caller": True, "seen_by_first": True}}
    # ... and to the parent, which returns what its steps added
    assert env["_emitted_context"] == {
        "notes": {"from_caller": True, "seen_by_first": True, "seen_by_second": True}
    }


async def test_fork_mode_gives_each_step_a_copy(tmp_path: Path, fake_upstream: FakeUpstream) -> None:
    _context_modules(tmp_path / "m", "fork")
    fake_upstream.set_default_reply("m-first", _emitting("from first", "seen_by_first"))
    fake_upstream.set_default_reply("m-second", _emitting("from second", "seen_by_second"))
    async with composed(tmp_path, fake_upstream, tmp_path / "m", ["first", "second", "pipe"]) as proxy:
        _, _, env = await execute(proxy, "pipe", {"x": 1, "_context": {"notes": {"from_caller": True}}})
    assert _context_sent(fake_upstream, "first") == {"notes": {"from_caller": True}}
    assert _context_sent(fake_upstream, "second") == {"notes": {"from_caller": True}}  # isolated copy
    assert "_emitted_context" not in env and env["ok"] is True


async def test_a_composites_cost_is_its_steps_cost(tmp_path: Path, fake_upstream: FakeUpstream) -> None:
    _two_steps(tmp_path / "m", {})
    fake_upstream.set_default_reply("m-first", answer(0.8, summary="one"))
    fake_upstream.set_default_reply("m-second", answer(0.8, summary="two"))
    price = {"input_per_mtok": 1_000_000, "output_per_mtok": 1_000_000}  # one dollar a token
    prices = {f"up/m-{m}": price for m in ("first", "second")}
    limits = {"global": {"usd_per_day": 1_000_000}}
    async with composed(
        tmp_path, fake_upstream, tmp_path / "m", NAMES, prices=prices, limits=limits
    ) as proxy:
        status, headers, _ = await execute(proxy, "pipe", {"x": 1})
        async with (
            aiohttp.ClientSession() as session,
            session.get(proxy.url + "/metrics") as resp,
        ):
            text = await resp.text()
    assert status == 200
    cost = float(headers["X-Cognitive-Cost-Usd"])
    assert cost > 0  # the composite made no call of its own: this is its steps' cost
    spent = [
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("cognitive_cost_usd_total{") and 'module="' in line
    ]
    assert abs(sum(spent) - cost) < 1e-6
