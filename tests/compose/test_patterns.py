"""Composites end to end: a real proxy, a fake upstream, every step a full module call."""

from __future__ import annotations

from pathlib import Path

from tests.compose.build import answer, make_module
from tests.compose.harness import chat, composed, envelope_of, execute, prompt_of, sent_to, steps_of
from tests.fake_upstream import FakeUpstream, Fault


async def test_sequential_dataflow_maps_chains_and_merges(
    tmp_path: Path, fake_upstream: FakeUpstream
) -> None:
    mods = tmp_path / "modules"
    make_module(mods, "first")
    make_module(mods, "second")
    make_module(
        mods,
        "pipe",
        composition={
            "pattern": "sequential",
            "requires": [{"name": "first", "version": ">=1.0.0"}, {"name": "second", "version": "^1.0.0"}],
            "dataflow": [
                {"from": "input", "to": "first", "mapping": {"text": "$.doc.body"}},
                {
                    "from": "first.output",
                    "to": "second",
                    "mapping": {"summary": "$.data.summary", "meta": "$.meta"},
                },
                {"from": ["first.output", "second.output"], "to": "output", "aggregate": "merge"},
            ],
        },
    )
    fake_upstream.set_default_reply("m-first", answer(0.8, "low", summary="first summary", score=1))
    fake_upstream.set_default_reply("m-second", answer(0.6, "medium", findings=["f"], score=2))
    async with composed(tmp_path, fake_upstream, mods, ["first", "second", "pipe"]) as proxy:
        status, reply = await chat(proxy, "pipe", {"doc": {"body": "hello world"}})
    assert status == 200
    env = envelope_of(reply)
    assert env["ok"] is True
    assert env["data"]["summary"] == "first summary" and env["data"]["findings"] == ["f"]
    assert env["data"]["score"] == 2  # merge: the later step wins on a conflict
    assert env["meta"]["confidence"] == 0.6 and env["meta"]["risk"] == "medium"  # min, max
    first_input = sent_to(fake_upstream, "first")[0]["messages"][1]["content"]
    assert '"text": "hello world"' in first_input and "doc" not in first_input
    second_input = sent_to(fake_upstream, "second")[0]["messages"][1]["content"]
    assert '"summary": "first summary"' in second_input and '"confidence": 0.8' in second_input
    assert not sent_to(fake_upstream, "pipe")  # pure dataflow: no model call of its own
    steps = steps_of(reply["cognitive"])
    assert list(steps) == ["first", "second"]
    assert steps["first"]["attempts"][0]["target"] == "up/m-first" and steps["first"]["decision"] == "accept"
    assert reply["cognitive"]["module"] == "pipe"


async def test_parallel_steps_run_concurrently_and_aggregate_as_array(
    tmp_path: Path, fake_upstream: FakeUpstream
) -> None:
    mods = tmp_path / "modules"
    names = ["sec", "perf", "style"]
    for name in names:
        make_module(mods, name)
    make_module(
        mods,
        "multi",
        composition={
            "pattern": "parallel",
            "requires": [{"name": n} for n in names],
            "dataflow": [
                {"from": "input", "to": names, "mapping": {"code": "$.code"}},
                {"from": [f"{n}.output" for n in names], "to": "output", "aggregate": "array"},
            ],
        },
    )
    for i, name in enumerate(names):  # each answer is held until all three are in flight
        fake_upstream.set_default_reply(f"m-{name}", Fault.slow(0.3, answer(0.5 + i / 10, summary=name)))
    async with composed(tmp_path, fake_upstream, mods, [*names, "multi"]) as proxy:
        status, _, env = await execute(proxy, "multi", {"code": "x = 1"})
    assert status == 200 and env["ok"] is True
    assert [d["summary"] for d in env["data"]["results"]] == names
    assert env["meta"]["confidence"] == 0.5
    assert fake_upstream.count(path="/v1/chat/completions") == 3
    assert fake_upstream.max_in_flight >= 2


async def test_conditional_routing_on_a_steps_meta(tmp_path: Path, fake_upstream: FakeUpstream) -> None:
    mods = tmp_path / "modules"
    for name in ("quick", "deep", "explore"):
        make_module(mods, name)
    make_module(
        mods,
        "smart",
        composition={
            "pattern": "conditional",
            "requires": [{"name": n} for n in ("quick", "deep", "explore")],
            "dataflow": [{"from": "input", "to": "quick"}],
            "routing": [
                {"condition": "$.quick.meta.confidence > 0.9", "next": None},
                {"condition": "$.quick.meta.confidence > 0.5", "next": "deep"},
                {"condition": "$.quick.meta.confidence <= 0.5", "next": "explore"},
            ],
        },
    )
    fake_upstream.script("m-quick", answer(0.95, summary="quick"), answer(0.6, summary="quick"))
    fake_upstream.set_default_reply("m-deep", answer(0.85, "medium", summary="deep"))
    async with composed(tmp_path, fake_upstream, mods, ["quick", "deep", "explore", "smart"]) as proxy:
        _, _, confident = await execute(proxy, "smart", {"q": 1})
        _, _, routed = await execute(proxy, "smart", {"q": 2})
    assert confident["data"]["summary"] == "quick" and confident["meta"]["confidence"] == 0.95
    assert routed["data"]["summary"] == "deep" and routed["meta"]["risk"] == "medium"
    assert len(sent_to(fake_upstream, "deep")) == 1 and not sent_to(fake_upstream, "explore")


async def test_iterative_runs_until_the_condition_holds(tmp_path: Path, fake_upstream: FakeUpstream) -> None:
    mods = tmp_path / "modules"
    make_module(mods, "refine")
    make_module(
        mods,
        "loop",
        composition={
            "pattern": "iterative",
            "requires": [{"name": "refine"}],
            "iterate": {
                "module": "refine",
                "until": "$.meta.confidence > 0.9",
                "max_iterations": 4,
                "mapping": {"draft": "$.previous.data.summary", "text": "$.input.text"},
            },
        },
    )
    fake_upstream.script(
        "m-refine",
        answer(0.5, summary="draft 1"),
        answer(0.7, summary="draft 2"),
        answer(0.95, summary="final"),
    )
    async with composed(tmp_path, fake_upstream, mods, ["refine", "loop"]) as proxy:
        _, _, env = await execute(proxy, "loop", {"text": "t"})
    assert env["data"]["summary"] == "final" and env["meta"]["confidence"] == 0.95
    bodies = sent_to(fake_upstream, "refine")
    assert len(bodies) == 3
    assert '"draft": "draft 2"' in bodies[2]["messages"][1]["content"]


async def test_call_directives_run_first_and_inject_results(
    tmp_path: Path, fake_upstream: FakeUpstream
) -> None:
    mods = tmp_path / "modules"
    make_module(mods, "helper")
    make_module(
        mods,
        "main",
        prompt=(
            "Review the text.\n@call:helper($.doc)\n"
            "Helper risk: {{helper.meta.risk}}. Helper summary: {{helper.data.summary}}. "
            "Answer with meta confidence risk explain and data rationale."
        ),
    )
    fake_upstream.set_default_reply("m-helper", answer(0.9, "medium", summary="helper says hi"))
    fake_upstream.set_default_reply("m-main", answer(0.8, summary="main"))
    async with composed(tmp_path, fake_upstream, mods, ["helper", "main"]) as proxy:
        status, reply = await chat(proxy, "main", {"doc": {"text": "the text"}})
    assert status == 200 and envelope_of(reply)["data"]["summary"] == "main"
    system = sent_to(fake_upstream, "main")[0]["messages"][0]["content"]
    assert "Helper risk: medium. Helper summary: helper says hi." in system
    assert "@call" not in prompt_of(sent_to(fake_upstream, "main")[0])
    helper_input = sent_to(fake_upstream, "helper")[0]["messages"][1]["content"]
    assert '"text": "the text"' in helper_input and "doc" not in helper_input
    assert [r.model for r in fake_upstream.requests] == ["m-helper", "m-main"]  # the call ran first
    attempts = reply["cognitive"]["attempts"]
    assert attempts[0]["target"] == "up/m-main" and attempts[1]["step"] == "helper"
    assert reply["cognitive"]["meta"]["confidence"] == 0.8  # the composite's own answer
