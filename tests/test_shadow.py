"""Verdicts without humans (``feedback.shadow``): a real proxy in front of the fake upstream, the
cheap rung answering the client, the strong rung judging in the background.

The sampling rule is restated here (an 8-byte BLAKE2b of the trace id keyed with the SHA-256 of
the policy's ``seed``, as a fraction below the rate) so a change to it fails these tests rather
than silently following it.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml
from aiohttp import web
from prometheus_client.parser import text_string_to_metric_families

from proxy.api.app_keys import CLIENT_ACTIVITY, FEEDBACK, SHADOW
from proxy.clients import ANONYMOUS
from proxy.service.shadow import MAX_PENDING
from proxy.state.feedback import scan_records
from proxy.state.redis_client import RedisOptions
from tests.api.test_modules import REVIEW_INPUT, envelope
from tests.conftest import ProxyWith
from tests.fake_upstream import FakeUpstream
from tests.proxy_server import UPSTREAM_KEY, UPSTREAM_KEY_ENV, RunningProxy, proxy_process, upstream_policy
from tests.support.polling import eventually, until
from tests.support.redis_server import redis_url

JUDGED = "code-reviewer"


def shadow_policy(fake: FakeUpstream, **shadow: Any) -> dict[str, Any]:
    """code-reviewer accepted on the fast rung (up/cheap); the strong rung (up/strong) judges."""
    return upstream_policy(
        fake,
        modules={JUDGED: {"start": "fast", "min_confidence": 0.5, "exhausted": "accept"}},
        feedback={"shadow": {"judge_rung": "strong", **shadow}},
    )


SEED = "a seed the clients never see"


def in_sample(trace_id: str, rate: float, seed: str = SEED) -> bool:
    key = hashlib.sha256(seed.encode()).digest()
    digest = hashlib.blake2b(trace_id.encode(), digest_size=8, key=key).digest()
    return int.from_bytes(digest, "big") / 2**64 < rate


async def execute(session: aiohttp.ClientSession, px: RunningProxy, trace: str) -> tuple[int, bytes]:
    async with session.post(
        px.base + f"/modules/{JUDGED}/execute", json={"input": REVIEW_INPUT}, headers={"X-Request-Id": trace}
    ) as resp:
        return resp.status, await resp.read()


async def samples(
    session: aiohttp.ClientSession, px: RunningProxy
) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    async with session.get(px.url + "/metrics") as resp:
        text = await resp.text()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


async def value(session: aiohttp.ClientSession, px: RunningProxy, name: str, **labels: str) -> float:
    return (await samples(session, px)).get((name, tuple(sorted(labels.items()))), 0.0)


async def judged(session: aiohttp.ClientSession, px: RunningProxy, result: str) -> float:
    return await value(session, px, "cognitive_shadow_judgements_total", module=JUDGED, result=result)


async def test_rate_one_judges_every_accepted_cheap_answer_and_records_shadow_verdicts(
    proxy_with: ProxyWith, fake_upstream: FakeUpstream
) -> None:
    fake_upstream.set_default_reply("cheap", envelope(0.9))
    fake_upstream.script("strong", envelope(0.95), envelope(0.95), envelope(0.95, verdict="request_changes"))
    async with proxy_with(shadow_policy(fake_upstream, rate=1.0)) as px, aiohttp.ClientSession() as session:
        for i in range(3):
            status, _ = await execute(session, px, f"rate-one-{i}")
            assert status == 200
        await eventually(lambda: judged(session, px, "agree"), "two agreements", ready=lambda v: v == 2)
        await eventually(lambda: judged(session, px, "disagree"), "one disagreement", ready=lambda v: v == 1)
        store = px.app[FEEDBACK]
        records = [await store.get(ANONYMOUS, f"rate-one-{i}") for i in range(3)]
        assert [(r.verdict, r.source) for r in records if r] == [
            ("correct", "shadow"),
            ("correct", "shadow"),
            ("incorrect", "shadow"),
        ]
        assert records[2] is not None and records[2].note == "judged by up/strong; differs on verdict"
        assert fake_upstream.count(model="strong") == 3
        assert (
            await value(
                session, px, "cognitive_verdicts_total", module=JUDGED, source="shadow", verdict="correct"
            )
            == 2
        )
        reliability = "cognitive_feedback_total"
        human = {
            "module": JUDGED,
            "provider": "up",
            "model": "cheap",
            "scale": "reported",
            "bucket": "0.9",
            "verdict": "incorrect",
        }
        assert await value(session, px, reliability, **human) == 0  # the reliability counters are the humans'
        # a human's verdict replaces the shadow one, is compared with it, and is the answer's first human one
        async with session.post(
            px.base + "/feedback", json={"trace_id": "rate-one-2", "verdict": "incorrect"}
        ) as resp:
            assert resp.status == 200
        assert (
            await value(session, px, "cognitive_shadow_human_agreement_total", module=JUDGED, agree="true")
            == 1
        )
        assert await value(session, px, reliability, **human) == 1
        async with session.post(
            px.base + "/feedback", json={"trace_id": "rate-one-1", "verdict": "correct", "source": "shadow"}
        ) as resp:
            assert resp.status == 400  # the proxy's own judge's source


async def test_rate_zero_judges_nothing(proxy_with: ProxyWith, fake_upstream: FakeUpstream) -> None:
    fake_upstream.set_default_reply("cheap", envelope(0.9))
    async with proxy_with(shadow_policy(fake_upstream, rate=0.0)) as px, aiohttp.ClientSession() as session:
        for i in range(5):
            assert (await execute(session, px, f"rate-zero-{i}"))[0] == 200
        assert px.app[SHADOW].pending == 0  # nothing was queued for the judge
        assert fake_upstream.count(model="strong") == 0


async def test_a_rate_judges_exactly_the_sampled_trace_ids(
    proxy_with: ProxyWith, fake_upstream: FakeUpstream
) -> None:
    fake_upstream.set_default_reply("cheap", envelope(0.9))
    fake_upstream.set_default_reply("strong", envelope(0.95))
    traces = [f"seeded-{i}" for i in range(40)]
    chosen = {t for t in traces if in_sample(t, 0.3)}
    assert 5 < len(chosen) < 20  # the seed gives a proper subset
    policy = shadow_policy(fake_upstream, rate=0.3, seed=SEED)
    async with proxy_with(policy) as px, aiohttp.ClientSession() as session:
        for trace in traces:
            assert (await execute(session, px, trace))[0] == 200
        await eventually(
            lambda: judged(session, px, "agree"), "the sampled share", ready=lambda v: v == len(chosen)
        )
        store = px.app[FEEDBACK]
        sources = {t: (r.source if (r := await store.get(ANONYMOUS, t)) else None) for t in traces}
        assert {t for t, s in sources.items() if s == "shadow"} == chosen
        assert fake_upstream.count(model="strong") == len(chosen)


async def test_a_client_cannot_choose_trace_ids_the_judge_samples(
    proxy_with: ProxyWith, fake_upstream: FakeUpstream
) -> None:
    """Clients choose trace ids (X-Request-Id). Sampled by an unkeyed hash, a client tried ids
    until one fell in the sample and got every answer judged at rate 0.05 (found in an attack
    pass). Keyed with a key drawn at start (no ``seed``), ids chosen against the unkeyed rule, or
    against a seed the proxy does not use, are sampled like any others: about 5% of them."""
    fake_upstream.set_default_reply("cheap", envelope(0.9))
    fake_upstream.set_default_reply("strong", envelope(0.95))

    def unkeyed(trace: str) -> bool:
        return int.from_bytes(hashlib.sha256(trace.encode()).digest()[:8], "big") / 2**64 < 0.05

    candidates = (f"chosen-{i}" for i in range(100_000))
    picked = [t for t in candidates if unkeyed(t) and in_sample(t, 0.05, "a seed the client guessed")][:40]
    assert len(picked) == 40
    async with proxy_with(shadow_policy(fake_upstream, rate=0.05)) as px, aiohttp.ClientSession() as session:
        for trace in picked:
            assert (await execute(session, px, trace))[0] == 200
        judge, activity = px.app[SHADOW], px.app[CLIENT_ACTIVITY]
        await until(lambda: activity.in_flight == 0 and judge.pending == 0, "the judge's queue drained")
        # Binomial(40, 0.05): more than 12 happens with probability below 1e-6.
        assert judge.started <= 12, judge.started


async def test_the_daily_budget_stops_judging_and_counts_the_skips(
    proxy_with: ProxyWith, fake_upstream: FakeUpstream
) -> None:
    fake_upstream.set_default_reply("cheap", envelope(0.9))
    fake_upstream.set_default_reply("strong", envelope(0.95))
    policy = shadow_policy(fake_upstream, rate=1.0, budget_usd_per_day=0.01)
    policy["prices"] = {
        "up/strong": {"input_per_mtok": 100_000, "output_per_mtok": 100_000}
    }  # > $0.01 a call
    async with proxy_with(policy) as px, aiohttp.ClientSession() as session:
        assert (await execute(session, px, "budget-0"))[0] == 200
        await eventually(lambda: judged(session, px, "agree"), "the first judgement", ready=lambda v: v == 1)
        spent = await value(session, px, "cognitive_shadow_spend_usd_total")
        assert spent > 0.01
        for i in range(1, 4):
            assert (await execute(session, px, f"budget-{i}"))[0] == 200
        skipped = lambda: value(session, px, "cognitive_shadow_skipped_total", reason="over_budget")  # noqa: E731
        await eventually(skipped, "three skips", ready=lambda v: v == 3)
        assert fake_upstream.count(model="strong") == 1
        assert await value(session, px, "cognitive_shadow_spend_usd_total") == spent
        cost = await value(
            session,
            px,
            "cognitive_cost_usd_total",
            module=JUDGED,
            provider="up",
            model="strong",
            client="cogproxy-shadow",
        )
        assert cost == pytest.approx(spent)


def timeless(body: bytes) -> dict[str, Any]:
    """An answer without its one timing field (``meta.latency_ms``)."""
    doc: dict[str, Any] = json.loads(body)
    del doc["meta"]["latency_ms"]
    return doc


async def test_the_client_answer_is_identical_and_never_waits_for_the_judge(
    proxy_with: ProxyWith, fake_upstream: FakeUpstream
) -> None:
    fake_upstream.set_default_reply("cheap", envelope(0.9))
    fake_upstream.set_default_reply("strong", envelope(0.95, verdict="request_changes"))
    async with aiohttp.ClientSession() as session:
        async with proxy_with(shadow_policy(fake_upstream, rate=0.0)) as px:
            off = await execute(session, px, "same-trace")
        gate = fake_upstream.hold(model="strong")
        async with proxy_with(shadow_policy(fake_upstream, rate=1.0)) as px:
            on = await execute(session, px, "same-trace")  # completes while the judge is held
            assert on[0] == off[0] == 200
            assert timeless(on[1]) == timeless(off[1])
            assert json.loads(on[1])["data"]["verdict"] == "approve"  # the judge's never reaches it
            await eventually(gate.reached.wait, "the judge at the upstream, held")
            assert px.app[SHADOW].pending == 1
            assert await judged(session, px, "disagree") == 0
        # shutdown cancelled the held judgement cleanly: nothing pending, nothing recorded
        assert px.app[SHADOW].pending == 0
        gate.release()


async def passthrough(session: aiohttp.ClientSession, px: RunningProxy) -> int:
    """A chat call the proxy relays to the fake (``anth/claude-x``): a client request of another kind."""
    body = {"model": "claude", "messages": [{"role": "user", "content": "hi"}]}
    async with session.post(px.base + "/chat/completions", json=body) as resp:
        await resp.read()
        return resp.status


async def test_the_judge_never_starts_while_a_client_request_is_in_flight(
    proxy_with: ProxyWith, fake_upstream: FakeUpstream
) -> None:
    """A passthrough call held at the upstream is in flight; module calls answered meanwhile are
    queued for the judge, which starts none of them (each answer is a full request through the
    loop: an ungated judge would have started after the first) until the held call is answered."""
    fake_upstream.set_default_reply("cheap", envelope(0.9))
    fake_upstream.set_default_reply("strong", envelope(0.95))
    async with proxy_with(shadow_policy(fake_upstream, rate=1.0)) as px, aiohttp.ClientSession() as session:
        judge, activity = px.app[SHADOW], px.app[CLIENT_ACTIVITY]
        assert (await execute(session, px, "warm"))[0] == 200  # the judge now watches the clients
        await eventually(lambda: judged(session, px, "agree"), "the first judgement", ready=lambda v: v == 1)
        gate = fake_upstream.hold(model="claude-x")
        held = asyncio.create_task(passthrough(session, px))
        await eventually(gate.reached.wait, "the passthrough call held at the upstream")
        for i in range(3):
            assert (await execute(session, px, f"in-flight-{i}"))[0] == 200
        await until(lambda: judge.pending == 3, "three judgements queued")
        assert (judge.started, activity.in_flight) == (1, 1)
        assert fake_upstream.count(model="strong") == 1
        gate.release()
        assert await held == 200
        await eventually(lambda: judged(session, px, "agree"), "the queue judged", ready=lambda v: v == 4)
        assert fake_upstream.count(model="strong") == 4


async def test_the_judge_checks_its_answer_only_while_no_client_request_is_in_flight(
    proxy_with: ProxyWith, fake_upstream: FakeUpstream
) -> None:
    """The judge's answer arrives while a client call is held: it is parsed, checked and compared
    only once that call is answered (``ModuleRun.before_check``)."""
    fake_upstream.set_default_reply("cheap", envelope(0.9))
    fake_upstream.set_default_reply("strong", envelope(0.95))
    async with proxy_with(shadow_policy(fake_upstream, rate=1.0)) as px, aiohttp.ClientSession() as session:
        activity = px.app[CLIENT_ACTIVITY]
        at_judge = fake_upstream.hold(model="strong")
        assert (await execute(session, px, "judged-late"))[0] == 200
        await eventually(at_judge.reached.wait, "the judge's call held at the upstream")
        at_client = fake_upstream.hold(model="claude-x")
        held = asyncio.create_task(passthrough(session, px))
        await eventually(at_client.reached.wait, "the client's call held at the upstream")
        at_judge.release()
        await until(lambda: activity.waiting == 1, "the judge's answer waiting")
        assert await judged(session, px, "agree") == 0
        at_client.release()
        assert await held == 200
        await eventually(lambda: judged(session, px, "agree"), "the judgement", ready=lambda v: v == 1)


async def test_a_full_queue_drops_sampled_answers_and_counts_them(
    proxy_with: ProxyWith, fake_upstream: FakeUpstream
) -> None:
    fake_upstream.set_default_reply("cheap", envelope(0.9))
    fake_upstream.set_default_reply("strong", envelope(0.95))
    async with proxy_with(shadow_policy(fake_upstream, rate=1.0)) as px, aiohttp.ClientSession() as session:
        assert (await execute(session, px, "first"))[0] == 200
        await eventually(lambda: judged(session, px, "agree"), "the first judgement", ready=lambda v: v == 1)
        gate = fake_upstream.hold(model="claude-x")
        held = asyncio.create_task(passthrough(session, px))
        await eventually(gate.reached.wait, "the passthrough call held at the upstream")
        for i in range(MAX_PENDING + 2):
            assert (await execute(session, px, f"queued-{i}"))[0] == 200
        busy = "cognitive_shadow_skipped_total"
        await eventually(lambda: value(session, px, busy, reason="busy"), "two drops", ready=lambda v: v == 2)
        assert px.app[SHADOW].pending == MAX_PENDING
        gate.release()
        assert await held == 200
        await eventually(
            lambda: judged(session, px, "agree"), "the queue judged", ready=lambda v: v == MAX_PENDING + 1
        )


async def test_shadow_verdicts_land_in_redis_for_calibration(
    proxy_with: ProxyWith, fake_upstream: FakeUpstream, redis_db: Any
) -> None:
    fake_upstream.set_default_reply("cheap", envelope(0.9))
    fake_upstream.set_default_reply("strong", envelope(0.95))
    url = redis_url(15)
    async with (
        proxy_with(shadow_policy(fake_upstream, rate=1.0), redis_url=url) as px,
        aiohttp.ClientSession() as session,
    ):
        assert (await execute(session, px, "in-redis"))[0] == 200
        await eventually(lambda: judged(session, px, "agree"), "the judgement", ready=lambda v: v == 1)

    async def stored() -> list[Any]:
        return [r async for r in scan_records(RedisOptions(url)) if r.trace_id == "in-redis" and r.verdict]

    records = await eventually(stored, "the shadow verdict in Redis")
    assert [(r.verdict, r.source, r.model) for r in records] == [("correct", "shadow", "cheap")]


async def test_a_served_process_stops_cleanly_with_a_judgement_held_upstream(
    fake_upstream: FakeUpstream, tmp_path: Path
) -> None:
    """SIGTERM while the judge's request is held at the upstream: the process exits 0 without a
    task reported pending, a traceback or a failed judgement (that ``aclose`` cancels the pending
    one is checked in process, above)."""
    fake_upstream.set_default_reply("cheap", envelope(0.9))
    fake_upstream.set_default_reply("strong", envelope(0.95))
    policy = tmp_path / "policy.yaml"
    policy.write_text(yaml.safe_dump(shadow_policy(fake_upstream, rate=1.0)))
    gate = fake_upstream.hold(model="strong")
    async with proxy_process("--policy", str(policy), env={UPSTREAM_KEY_ENV: UPSTREAM_KEY}) as served:
        async with aiohttp.ClientSession() as session:
            px = RunningProxy(served.url, web.Application())
            assert (await execute(session, px, "held-at-stop"))[0] == 200
            await eventually(gate.reached.wait, "the judge at the upstream, held")
        stdout, stderr = await served.stop()
    gate.release()
    written = stdout + stderr
    assert served.proc.returncode == 0, written
    for sign in ("Traceback", "was destroyed but it is pending", "proxy.shadow_failed"):
        assert sign not in written, written
