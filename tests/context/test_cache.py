"""The module result cache end to end: a repeated input is answered without a model call; only
accepted answers are kept; Cache-Control: no-cache bypasses it; a policy reload that changes the
module's thresholds retires old entries; Redis down never fails a request."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml

from proxy.reload import RELOADER
from tests.context.helpers import LOGIN, REVIEWER, execute, reviewer_answer
from tests.fake_upstream import FakeUpstream
from tests.proxy_server import (
    UPSTREAM_KEY,
    UPSTREAM_KEY_ENV,
    RunningProxy,
    free_port,
    running_proxy,
    upstream_policy,
)

REVIEW = {"code": "def f(x):\n    return x\n", "language": "python"}


def review_answer(confidence: float = 0.9, risk: str = "low") -> str:
    return json.dumps(
        {
            "ok": True,
            "meta": {"confidence": confidence, "risk": risk, "explain": "e"},
            "data": {"issues": [], "summary": "s", "verdict": "approve", "rationale": "r"},
        }
    )


def cached_policy(fake: FakeUpstream, **rule: Any) -> dict[str, Any]:
    return upstream_policy(fake, cache={"modules": {"code-reviewer": {"ttl_s": 600, **rule}}})


@pytest.fixture
async def px(
    fake_upstream: FakeUpstream, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[RunningProxy]:
    monkeypatch.setenv(UPSTREAM_KEY_ENV, UPSTREAM_KEY)
    async with running_proxy(tmp_path, cached_policy(fake_upstream)) as running:
        yield running


async def metric(px: RunningProxy, line_start: str) -> float:
    async with aiohttp.ClientSession() as session:
        text = await (await session.get(px.url + "/metrics")).text()
    values = [float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(line_start)]
    return sum(values)


async def test_repeated_input_is_a_cache_hit_without_an_upstream_call(
    px: RunningProxy, fake_upstream: FakeUpstream
) -> None:
    fake_upstream.script("cheap", review_answer())
    status, headers, first = await execute(px.url, "code-reviewer", REVIEW)
    assert (status, headers["X-Cognitive-Cache"]) == (200, "miss")
    calls = fake_upstream.count("/v1/chat/completions")
    status, headers, second = await execute(px.url, "code-reviewer", dict(reversed(list(REVIEW.items()))))
    assert (status, headers["X-Cognitive-Cache"], headers["X-Cognitive-Decision"]) == (200, "hit", "accept")
    assert fake_upstream.count("/v1/chat/completions") == calls  # no model was called
    assert second["data"] == first["data"] and second["meta"]["confidence"] == first["meta"]["confidence"]
    assert second["meta"]["trace_id"] != first["meta"]["trace_id"]
    assert await metric(px, 'cognitive_cache_total{module="code-reviewer",result="hit"}') == 1
    assert await metric(px, 'cognitive_cache_total{module="code-reviewer",result="miss"}') == 1
    assert await metric(px, 'cognitive_cache_saved_tokens_total{module="code-reviewer"}') > 0


def _without_call_meta(envelope: dict[str, Any]) -> dict[str, Any]:
    """The envelope less what each call stamps on its own answer (its trace id and latency)."""
    meta = {k: v for k, v in envelope["meta"].items() if k not in ("trace_id", "latency_ms")}
    return {**envelope, "meta": meta}


async def test_a_hit_answers_the_envelope_the_miss_answered(
    px: RunningProxy, fake_upstream: FakeUpstream
) -> None:
    """The cache keeps the decided envelope uncopied: nothing may edit it after it is saved, or
    a hit would answer something else than the miss did (the envelope is finished in a new dict)."""
    fake_upstream.script("cheap", review_answer())
    _, _, first = await execute(px.url, "code-reviewer", REVIEW)
    _, headers, second = await execute(px.url, "code-reviewer", REVIEW)
    assert headers["X-Cognitive-Cache"] == "hit"
    assert first["meta"]["model"] and first["meta"]["latency_ms"] >= 0
    assert _without_call_meta(second) == _without_call_meta(first)


async def test_no_cache_from_the_client_bypasses_the_cache(
    px: RunningProxy, fake_upstream: FakeUpstream
) -> None:
    fake_upstream.script("cheap", review_answer(), review_answer(0.95))
    await execute(px.url, "code-reviewer", REVIEW)
    _status, headers, envelope = await execute(px.url, "code-reviewer", REVIEW, {"Cache-Control": "no-cache"})
    assert headers["X-Cognitive-Cache"] == "bypass"
    assert fake_upstream.count("/v1/chat/completions") == 2
    assert envelope["meta"]["confidence"] == 0.95


async def test_a_different_input_or_context_is_a_miss(px: RunningProxy, fake_upstream: FakeUpstream) -> None:
    fake_upstream.script("cheap", review_answer(), review_answer())
    await execute(px.url, "code-reviewer", REVIEW)
    _, headers, _ = await execute(px.url, "code-reviewer", {**REVIEW, "language": "py"})
    assert headers["X-Cognitive-Cache"] == "miss"


async def test_only_accepted_answers_are_cached(px: RunningProxy, fake_upstream: FakeUpstream) -> None:
    fake_upstream.script("cheap", review_answer(0.95, "high"))
    fake_upstream.script("strong", review_answer(0.95, "high"), review_answer(0.95, "high"))
    fake_upstream.script("cheap", review_answer(0.95, "high"))
    _, headers, _ = await execute(px.url, "code-reviewer", REVIEW)
    assert headers["X-Cognitive-Decision"] == "review"
    _, headers, _ = await execute(px.url, "code-reviewer", REVIEW)
    assert headers["X-Cognitive-Cache"] == "miss"
    assert fake_upstream.count("/v1/chat/completions") == 4


async def test_a_reload_that_changes_the_thresholds_retires_entries(
    px: RunningProxy, fake_upstream: FakeUpstream, tmp_path: Path
) -> None:
    fake_upstream.script("cheap", review_answer(0.8), review_answer(0.8))
    await execute(px.url, "code-reviewer", REVIEW)
    policy = cached_policy(fake_upstream)
    policy["review"] = {"sink": "log"}  # a change elsewhere keeps the entries
    (tmp_path / "policy.yaml").write_text(yaml.safe_dump(policy))
    assert await px.app[RELOADER].reload("test")
    _, headers, _ = await execute(px.url, "code-reviewer", REVIEW)
    assert headers["X-Cognitive-Cache"] == "hit"
    policy["modules"] = {"code-reviewer": {"min_confidence": 0.75}}
    (tmp_path / "policy.yaml").write_text(yaml.safe_dump(policy))
    assert await px.app[RELOADER].reload("test")
    _, headers, _ = await execute(px.url, "code-reviewer", REVIEW)
    assert headers["X-Cognitive-Cache"] == "miss"
    assert fake_upstream.count("/v1/chat/completions") == 2


async def test_a_module_that_emits_analysis_cache_is_cached(
    fake_upstream: FakeUpstream, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tests.conftest import write_module

    monkeypatch.setenv(UPSTREAM_KEY_ENV, UPSTREAM_KEY)
    write_module(
        tmp_path / "mods",
        "analyzer",
        manifest={"context": {"emits": [{"type": "analysis_cache", "ttl": 86400}]}},
    )
    answer = json.dumps(
        {
            "ok": True,
            "meta": {"confidence": 0.9, "risk": "low", "explain": "e"},
            "data": {"result": "r", "rationale": "r"},
        }
    )
    fake_upstream.script("cheap", answer)
    async with running_proxy(tmp_path, upstream_policy(fake_upstream), modules=(tmp_path / "mods",)) as px:
        _, first, _ = await execute(px.url, "analyzer", {"code": "x"})
        _, second, _ = await execute(px.url, "analyzer", {"code": "x"})
    assert (first["X-Cognitive-Cache"], second["X-Cognitive-Cache"]) == ("miss", "hit")
    assert fake_upstream.count("/v1/chat/completions") == 1


async def test_modules_without_a_cache_rule_send_no_cache_header(
    px: RunningProxy, fake_upstream: FakeUpstream
) -> None:
    fake_upstream.script("cheap", reviewer_answer(0, "code_review"))
    _, headers, _ = await execute(px.url, REVIEWER, LOGIN)
    assert "X-Cognitive-Cache" not in headers


async def test_redis_down_never_fails_a_cached_module_call(
    fake_upstream: FakeUpstream, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(UPSTREAM_KEY_ENV, UPSTREAM_KEY)
    dead = f"redis://127.0.0.1:{free_port()}/0"
    fake_upstream.script("cheap", review_answer(), review_answer())
    async with running_proxy(tmp_path, cached_policy(fake_upstream), redis_url=dead) as px:
        for _ in range(2):
            status, headers, envelope = await execute(
                px.url, "code-reviewer", REVIEW, {"X-Cognitive-Session": "s"}
            )
            assert (status, headers["X-Cognitive-Cache"], envelope["ok"]) == (200, "miss", True)
    assert fake_upstream.count("/v1/chat/completions") == 2


async def test_redis_down_makes_required_context_e1002_saying_so(
    fake_upstream: FakeUpstream, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tests.conftest import write_module

    monkeypatch.setenv(UPSTREAM_KEY_ENV, UPSTREAM_KEY)
    write_module(
        tmp_path / "mods",
        "stateful",
        manifest={"context": {"accepts": [{"type": "session_state", "required": True}]}},
    )
    dead = f"redis://127.0.0.1:{free_port()}/0"
    async with running_proxy(
        tmp_path, upstream_policy(fake_upstream), modules=(tmp_path / "mods",), redis_url=dead
    ) as px:
        status, _, envelope = await execute(px.url, "stateful", {"code": "x"}, {"X-Cognitive-Session": "s"})
    assert (status, envelope["error"]["code"]) == (400, "E1002")
    assert "context store is down" in envelope["error"]["message"]
    assert envelope["error"]["details"]["store_unavailable"] is True
    assert fake_upstream.count() == 0
