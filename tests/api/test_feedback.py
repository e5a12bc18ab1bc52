"""``POST /v1/feedback`` and calibrated confidence on module answers, through a served proxy."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from tests.api.test_modules import REVIEW_INPUT, envelope
from tests.fake_upstream import FakeUpstream
from tests.proxy_server import UPSTREAM_KEY, UPSTREAM_KEY_ENV, RunningProxy, running_proxy, upstream_policy


async def execute(
    session: aiohttp.ClientSession, px: RunningProxy, key: str | None = None, module: str = "code-reviewer"
) -> tuple[dict[str, str], dict[str, Any]]:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    async with session.post(
        px.base + f"/modules/{module}/execute", json={"input": REVIEW_INPUT}, headers=headers
    ) as resp:
        return dict(resp.headers), await resp.json()


async def feedback(
    session: aiohttp.ClientSession, px: RunningProxy, body: Any, key: str | None = None
) -> tuple[int, dict[str, Any]]:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    async with session.post(px.base + "/feedback", json=body, headers=headers) as resp:
        return resp.status, await resp.json()


async def metrics(session: aiohttp.ClientSession, px: RunningProxy) -> str:
    async with session.get(px.url + "/metrics") as resp:
        return await resp.text()


async def test_a_verdict_is_counted_by_model_bucket_and_verdict_and_a_second_replaces_it(
    proxy: RunningProxy, fake_upstream: FakeUpstream
) -> None:
    fake_upstream.script("cheap", envelope(0.92))
    async with aiohttp.ClientSession() as session:
        headers, body = await execute(session, proxy)
        trace = headers["X-Cognitive-Trace-Id"]
        assert body["meta"]["trace_id"] == trace
        status, answer = await feedback(session, proxy, {"trace_id": trace, "verdict": "incorrect"})
        assert status == 200, answer
        assert answer["replaced"] is False and answer["model"] == "up/cheap" and answer["confidence"] == 0.92
        text = await metrics(session, proxy)
        for scale in ("reported", "calibrated"):
            assert (
                'cognitive_feedback_total{bucket="0.9",model="cheap",module="code-reviewer",'
                f'provider="up",scale="{scale}",verdict="incorrect"}} 1.0'
            ) in text
        brier = 'cognitive_feedback_brier_total{model="cheap",module="code-reviewer",'
        brier += 'provider="up",scale="reported"}'
        assert f"{brier} 0.8464" in text  # (0.92 - 0)^2
        assert (
            'cognitive_feedback_outcomes_total{decision="accept",gate="above",model="cheap",module="code-reviewer",'
            'provider="up",tier="decision",verdict="incorrect"} 1.0'
        ) in text
        # The same verdict again: idempotent (counted as a replacement that changed nothing).
        status, answer = await feedback(session, proxy, {"trace_id": trace, "verdict": "incorrect"})
        assert (status, answer["replaced"]) == (200, True)
        status, answer = await feedback(
            session, proxy, {"trace_id": trace, "verdict": "correct", "source": "review"}
        )
        assert (status, answer["replaced"], answer["verdict"]) == (200, True, "correct")
        text = await metrics(session, proxy)
        assert 'cognitive_feedback_replaced_total{changed="false",module="code-reviewer"} 1.0' in text
        assert 'cognitive_feedback_replaced_total{changed="true",module="code-reviewer"} 1.0' in text
        reliability = [line for line in text.splitlines() if line.startswith("cognitive_feedback_")]
        assert not [line for line in reliability if 'verdict="correct"} 1.0' in line]  # the first verdict's
        assert 'cognitive_verdicts_total{module="code-reviewer",source="human",verdict="correct"} 1.0' in text


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"verdict": "correct"}, "trace_id"),
        ({"trace_id": "a b", "verdict": "correct"}, "trace_id"),
        ({"trace_id": "t", "verdict": "maybe"}, "verdict"),
        ({"trace_id": "t", "verdict": {}}, "verdict"),
        ({"trace_id": ["t"], "verdict": "correct"}, "trace_id"),
        ({"trace_id": "t", "verdict": "correct", "score": 1.5}, "score"),
        ({"trace_id": "t", "verdict": "correct", "score": True}, "score"),
        ({"trace_id": "t", "verdict": "correct", "note": "x" * 1001}, "note"),
        ({"trace_id": "t", "verdict": "correct", "source": 3}, "source"),
        ({"trace_id": "t", "verdict": "correct", "extra": 1}, "extra"),
    ],
)
async def test_malformed_feedback_is_400_naming_the_field(
    proxy: RunningProxy, body: dict[str, Any], param: str
) -> None:
    async with aiohttp.ClientSession() as session:
        status, answer = await feedback(session, proxy, body)
    assert status == 400 and answer["error"]["param"] == param, answer


async def test_unknown_trace_id_is_404_with_the_reason(proxy: RunningProxy) -> None:
    async with aiohttp.ClientSession() as session:
        status, answer = await feedback(session, proxy, {"trace_id": "never-seen", "verdict": "correct"})
        async with session.get(proxy.base + "/feedback") as resp:
            assert (resp.status, resp.headers["Allow"]) == (405, "POST")
    assert status == 404 and answer["error"]["code"] == "trace_not_found", answer
    assert "older than the feedback window (604800 s)" in answer["error"]["message"]


async def test_only_the_calling_key_or_an_admin_key_may_judge(
    fake_upstream: FakeUpstream, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(UPSTREAM_KEY_ENV, UPSTREAM_KEY)
    keys = frozenset({"sk-alice", "sk-bob"})
    async with (
        running_proxy(
            tmp_path, upstream_policy(fake_upstream), api_keys=keys, admin_keys=frozenset({"sk-admin"})
        ) as px,
        aiohttp.ClientSession() as session,
    ):
        fake_upstream.script("cheap", envelope(0.92))
        headers, _ = await execute(session, px, "sk-alice")
        body = {"trace_id": headers["X-Cognitive-Trace-Id"], "verdict": "correct"}
        assert (await feedback(session, px, body))[0] == 401
        status, answer = await feedback(session, px, body, "sk-bob")
        assert status == 404 and answer["error"]["code"] == "trace_not_found"  # not 403: no probing
        assert (await feedback(session, px, body, "sk-alice"))[0] == 200
        assert (await feedback(session, px, body, "sk-admin"))[0] == 200
        # an admin key judges; it is no client key: it calls no module (refused as an envelope)
        _, refused = await execute(session, px, "sk-admin")
        assert refused["ok"] is False and refused["error"]["code"] == "E4007", refused
        assert fake_upstream.count("/v1/chat/completions") == 1


async def test_calibration_map_decides_while_the_header_keeps_the_models_confidence(
    fake_upstream: FakeUpstream, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """up/cheap says 0.92 but is right 60% of the time: its map sends 0.92 to 0.6, below the
    decision tier's 0.7, so the answer escalates to up/strong (no map: decided as reported)."""
    monkeypatch.setenv(UPSTREAM_KEY_ENV, UPSTREAM_KEY)
    policy = upstream_policy(fake_upstream, calibration={"up/cheap": {"points": [[0.5, 0.3], [1.0, 0.65]]}})
    async with running_proxy(tmp_path, policy) as px, aiohttp.ClientSession() as session:
        fake_upstream.script("cheap", envelope(0.92))
        fake_upstream.script("strong", envelope(0.8))
        headers, body = await execute(session, px)
        assert headers["X-Cognitive-Decision"] == "escalated"
        assert (headers["X-Cognitive-Confidence"], headers["X-Cognitive-Confidence-Calibrated"]) == (
            "0.8",
            "0.8",
        )
        assert body["meta"]["confidence"] == 0.8
        fake_upstream.script("cheap", envelope(0.92))
        fake_upstream.script("strong", envelope(0.8))
        async with session.post(
            px.base + "/chat/completions",
            json={
                "model": "module:code-reviewer",
                "messages": [{"role": "user", "content": json.dumps(REVIEW_INPUT)}],
            },
        ) as resp:
            reply = await resp.json()
        attempts = reply["cognitive"]["attempts"]
        assert [
            (a["target"], a["outcome"], a["confidence"], a["confidence_calibrated"]) for a in attempts
        ] == [
            ("up/cheap", "escalate", 0.92, pytest.approx(0.594)),
            ("up/strong", "accept", 0.8, 0.8),
        ]
        text = await metrics(session, px)
        assert 'cognitive_confidence_calibrated_count{module="code-reviewer",tier="decision"}' in text
