"""Drop-in completeness: the rest of the OpenAI API goes through the proxy (official SDK)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import openai
import pytest
import yaml

from tests.fake_upstream import FakeUpstream, Fault
from tests.proxy_server import (
    UPSTREAM_KEY,
    UPSTREAM_KEY_ENV,
    RunningProxy,
    cognitive_of,
    proxy_process,
    running_proxy,
    upstream_policy,
)

SECOND_KEY_ENV = "COGPROXY_TEST_SECOND_KEY"


def dropin_policy(fake: FakeUpstream) -> dict[str, Any]:
    policy = upstream_policy(fake)
    policy["providers"]["up2"] = {
        "kind": "openai",
        "base_url": fake.openai_base,
        "api_key_env": SECOND_KEY_ENV,
    }
    policy["passthrough"] = {
        "provider": "up",
        "routes": [
            {"prefix": "/v1/embeddings", "providers": ["up", "up2"]},
            {"prefix": "/v1/files", "providers": ["up", "up2"]},
        ],
    }
    policy["failover"] = {"retries": 0}
    return policy


@pytest.fixture
def policy(fake_upstream: FakeUpstream, monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """What the ``proxy`` fixture serves here: passthrough routes over two providers."""
    monkeypatch.setenv(SECOND_KEY_ENV, "sk-second-provider")
    return dropin_policy(fake_upstream)


async def test_embeddings_with_headers_query_and_injected_key(
    proxy: RunningProxy, fake_upstream: FakeUpstream
) -> None:
    client = proxy.client(api_key="sk-client-own", organization="org-123", project="proj-9")
    raw = await client.embeddings.with_raw_response.create(
        model="text-embedding-3-small",
        input=["hello", "world"],
        extra_headers={"OpenAI-Beta": "assistants=v2", "Idempotency-Key": "idem-1"},
        extra_query={"api-version": "2024-10-21"},
    )
    result = raw.parse()
    assert len(result.data) == 2 and len(result.data[0].embedding) == 8
    sent = fake_upstream.requests[-1]
    assert sent.path == "/v1/embeddings" and "api-version=2024-10-21" in sent.query
    assert sent.headers["authorization"] == f"Bearer {UPSTREAM_KEY}"
    assert "sk-client-own" not in json.dumps(sent.headers)
    for name, value in (
        ("openai-organization", "org-123"),
        ("openai-project", "proj-9"),
        ("openai-beta", "assistants=v2"),
        ("idempotency-key", "idem-1"),
    ):
        assert sent.headers[name] == value
    assert raw.headers["x-ratelimit-remaining-requests"] == "499"
    assert raw.headers["x-request-id"].startswith("req_")


async def test_responses_api_plain_and_streamed_pass_through(
    proxy: RunningProxy, fake_upstream: FakeUpstream
) -> None:
    fake_upstream.script("gpt-4.1", "Plain answer.", "Streamed answer here.")
    client = proxy.client()
    response = await client.responses.create(model="gpt-4.1", input="hi")
    assert response.output_text == "Plain answer."
    stream = await client.responses.create(model="gpt-4.1", input="hi", stream=True)
    deltas, kinds = [], []
    async for event in stream:
        kinds.append(event.type)
        if event.type == "response.output_text.delta":
            deltas.append(event.delta)
    assert "".join(deltas) == "Streamed answer here."
    assert kinds[0] == "response.created" and kinds[-1] == "response.completed"


async def test_responses_api_runs_a_module(proxy: RunningProxy, fake_upstream: FakeUpstream) -> None:
    fake_upstream.script(
        "cheap",
        json.dumps(
            {
                "ok": True,
                "meta": {"confidence": 0.91, "risk": "low", "explain": "fine"},
                "data": {"issues": [], "summary": "s", "verdict": "approve", "rationale": "r"},
            }
        ),
    )
    raw = await proxy.client().responses.with_raw_response.create(
        model="module:code-reviewer", input=json.dumps({"code": "x = 1"})
    )
    response = raw.parse()
    assert json.loads(response.output_text)["meta"]["confidence"] == 0.91
    assert raw.headers["x-cognitive-decision"] == "accept"
    assert cognitive_of(response)["module"] == "code-reviewer"
    fake_upstream.script(
        "cheap",
        json.dumps(
            {
                "ok": True,
                "meta": {"confidence": 0.93, "risk": "low", "explain": "fine"},
                "data": {"issues": [], "summary": "s", "verdict": "approve", "rationale": "r"},
            }
        ),
    )
    stream = await proxy.client().responses.create(
        model="module:code-reviewer", input=json.dumps({"code": "y"}), stream=True
    )
    text, summary, completed = "", "", None
    async for event in stream:
        if event.type == "response.output_text.delta":
            text += event.delta
        if event.type == "response.reasoning_summary_text.delta":
            summary += event.delta
        if event.type == "response.completed":
            completed = event.response
    assert summary == "r"  # the rationale as it was written: the live view (spec v2.5 §3.2)
    assert completed is not None and completed.status == "completed"
    assert text == completed.output_text  # the output text is the envelope, streamed or not
    assert json.loads(completed.output_text)["meta"]["confidence"] == 0.93
    assert cognitive_of(completed)["decision"] == "accept"


async def test_moderations(proxy: RunningProxy) -> None:
    result = await proxy.client().moderations.create(model="omni-moderation-latest", input="hello")
    assert result.results[0].flagged is False


async def test_files_create_and_retrieve(proxy: RunningProxy, fake_upstream: FakeUpstream) -> None:
    client = proxy.client()
    created = await client.files.create(
        file=("data.jsonl", b'{"a": 1}\n' * 1000, "application/jsonl"), purpose="batch"
    )
    assert created.bytes == 9000
    fetched = await client.files.retrieve(created.id)
    assert fetched.id == created.id
    async with aiohttp.ClientSession() as session:
        metrics = await (await session.get(proxy.url + "/metrics")).text()
    assert 'route="/v1/files/{id}"' in metrics and 'route="/v1/files"' in metrics


async def test_upstream_404_passes_through_as_its_own_body(proxy: RunningProxy) -> None:
    with pytest.raises(openai.NotFoundError) as info:
        await proxy.client().get("/vector_stores/vs_nope/unknown_thing", cast_to=object)
    assert info.value.body["code"] == "not_found"  # type: ignore[index]
    async with aiohttp.ClientSession() as session:
        resp = await session.get(proxy.base + "/definitely/not/an/endpoint")
        body = await resp.json()
    assert resp.status == 404 and body["error"]["type"] == "invalid_request_error"


async def test_resendable_requests_fail_over_and_uploads_never_replay(
    proxy: RunningProxy, fake_upstream: FakeUpstream
) -> None:
    fake_upstream.script("text-embedding-3-small", Fault.http(503))
    result = await proxy.client().embeddings.create(model="text-embedding-3-small", input="x")
    assert len(result.data) == 1
    tries = [r for r in fake_upstream.requests if r.path == "/v1/embeddings"]
    assert [r.headers["authorization"] for r in tries] == [
        f"Bearer {UPSTREAM_KEY}",
        "Bearer sk-second-provider",
    ]

    fake_upstream.script("whisper-1", Fault.http(503))
    with pytest.raises(openai.InternalServerError) as info:
        await proxy.client().audio.transcriptions.create(
            model="whisper-1", file=("a.wav", b"x" * 2048, "audio/wav")
        )
    assert info.value.status_code == 503
    uploads = [r for r in fake_upstream.requests if r.path == "/v1/audio/transcriptions"]
    assert len(uploads) == 1, "an upload is never replayed to another provider"


async def test_upload_over_the_limit_is_413(fake_upstream: FakeUpstream, tmp_path: Path) -> None:
    async with running_proxy(tmp_path, dropin_policy(fake_upstream), max_upload_bytes=100_000) as px:
        with pytest.raises(openai.APIStatusError) as info:
            await px.client().audio.transcriptions.create(
                model="whisper-1", file=("a.wav", b"0" * 300_000, "audio/wav")
            )
        assert info.value.status_code == 413

        async def chunked() -> AsyncIterator[bytes]:  # no Content-Length: counted while streaming
            for _ in range(10):
                yield b"0" * 50_000

        async with aiohttp.ClientSession() as session:
            resp = await session.post(
                px.base + "/files", data=chunked(), headers={"Content-Type": "text/plain"}
            )
            body = await resp.json()
    assert resp.status == 413 and body["error"]["code"] == "request_too_large"
    assert not [r for r in fake_upstream.requests if r.path == "/v1/audio/transcriptions"]


def peak_rss_kb(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
    raise AssertionError("no VmHWM")


async def test_big_audio_upload_streams_through_with_flat_memory(
    fake_upstream: FakeUpstream, tmp_path: Path
) -> None:
    policy_path = tmp_path / "policy.yaml"
    policy_path.write_text(yaml.safe_dump(dropin_policy(fake_upstream)))
    async with proxy_process("--policy", str(policy_path), env={UPSTREAM_KEY_ENV: UPSTREAM_KEY}) as served:
        client = openai.AsyncOpenAI(base_url=served.url + "/v1", api_key="k", max_retries=0)
        async with client:
            small = await client.audio.transcriptions.create(
                model="whisper-1", file=("s.wav", b"1" * 1024, "audio/wav")
            )
            assert small.text == "transcribed 1024 bytes"
            before = peak_rss_kb(served.proc.pid)
            size = 40 * 1024 * 1024
            result = await client.audio.transcriptions.create(
                model="whisper-1", file=("big.wav", b"2" * size, "audio/wav")
            )
            after = peak_rss_kb(served.proc.pid)
    assert result.text == f"transcribed {size} bytes"
    assert after - before < 12 * 1024, f"peak RSS grew {after - before} kB for a {size // 1024} kB upload"


async def test_open_breaker_on_the_passthrough_provider_is_a_503_with_retry_after(
    fake_upstream: FakeUpstream, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(UPSTREAM_KEY_ENV, UPSTREAM_KEY)
    monkeypatch.setenv(SECOND_KEY_ENV, "sk-second-provider")
    policy = dropin_policy(fake_upstream)
    policy["failover"]["circuit_breaker"] = {"consecutive_failures": 1, "window_s": 30, "open_s": 30}
    async with running_proxy(tmp_path, policy) as px:
        fake_upstream.script("text-embedding-3-small", Fault.http(500))
        await px.client().embeddings.create(model="text-embedding-3-small", input="x")  # opens up's breaker
        before = len(fake_upstream.requests)
        with pytest.raises(openai.InternalServerError) as info:
            await px.client().audio.transcriptions.create(
                model="whisper-1", file=("a.wav", b"x" * 10, "audio/wav")
            )
    assert info.value.status_code == 503 and info.value.response.headers["retry-after"] == "30"
    assert len(fake_upstream.requests) == before  # the refusal is the proxy's own: nothing was sent
