"""The server's own behaviour: auth, limits, tracing, health, shutdown, configuration."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import aiohttp
import openai
import pytest
import yaml

from tests.conftest import MODULES, ROOT
from tests.fake_upstream import FakeUpstream, Fault
from tests.paths import BUNDLED_MODULES
from tests.proxy_server import (
    UPSTREAM_KEY,
    UPSTREAM_KEY_ENV,
    Drain,
    RunningProxy,
    free_port,
    proxy_process,
    running_proxy,
    upstream_policy,
    wait_ready,
)
from tests.security.harness import raw_http
from tests.support.polling import until


async def test_auth_is_off_by_default(proxy: RunningProxy) -> None:
    await proxy.client(api_key="anything").models.list()


async def test_auth_on_demands_a_configured_key(
    fake_upstream: FakeUpstream, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(UPSTREAM_KEY_ENV, UPSTREAM_KEY)
    keys = frozenset({"sk-team-a", "sk-team-b"})
    async with running_proxy(tmp_path, upstream_policy(fake_upstream), api_keys=keys) as px:
        with pytest.raises(openai.AuthenticationError) as info:
            await px.client(api_key="sk-wrong").models.list()
        assert info.value.body["type"] == "authentication_error"  # type: ignore[index]
        reply = await px.client(api_key="sk-team-b").chat.completions.create(
            model="gpt-4o-mini", messages=[{"role": "user", "content": "hi"}]
        )
        assert reply.choices[0].message.content
        assert fake_upstream.requests[0].headers["authorization"] == f"Bearer {UPSTREAM_KEY}"
        async with aiohttp.ClientSession() as session:
            assert (await session.get(px.url + "/healthz")).status == 200
            assert (await session.get(px.url + "/readyz")).status == 200
            assert (await session.post(px.base + "/chat/completions", json={})).status == 401


async def test_client_key_forwarded_only_when_provider_opts_in(
    fake_upstream: FakeUpstream, tmp_path: Path
) -> None:
    policy = upstream_policy(fake_upstream)
    policy["providers"]["up"]["forward_client_key"] = True
    async with running_proxy(tmp_path, policy) as px:
        await px.client(api_key="sk-client-own").chat.completions.create(
            model="gpt-4o-mini", messages=[{"role": "user", "content": "hi"}]
        )
    assert fake_upstream.requests[0].headers["authorization"] == "Bearer sk-client-own"


async def test_body_over_the_limit_is_413_in_openai_format(
    fake_upstream: FakeUpstream, tmp_path: Path
) -> None:
    async with running_proxy(tmp_path, upstream_policy(fake_upstream), max_body_bytes=2048) as px:
        with pytest.raises(openai.APIStatusError) as info:
            await px.client().chat.completions.create(
                model="gpt-4o-mini", messages=[{"role": "user", "content": "x" * 5000}]
            )
        assert info.value.status_code == 413
        assert "2048" in info.value.body["message"]  # type: ignore[index]
        await px.client().chat.completions.create(
            model="gpt-4o-mini", messages=[{"role": "user", "content": "ok"}]
        )
    assert fake_upstream.count() == 1


async def test_a_chunked_body_that_arrives_whole_is_held_to_the_limit(
    fake_upstream: FakeUpstream, tmp_path: Path
) -> None:
    """A chunked body sent in one write is complete before the handler reads it (taken without a
    read loop): still refused past ``--max-body-bytes``, and forwarded intact under it."""
    async with running_proxy(tmp_path, upstream_policy(fake_upstream), max_body_bytes=2048) as px:
        port = int(px.url.rsplit(":", 1)[1])
        for content, status in (("x" * 5000, 413), ("ok", 200)):
            body = json.dumps({"model": "gpt-4o-mini", "messages": [{"role": "user", "content": content}]})
            request = (
                "POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n"
                "Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"
                f"{len(body):x}\r\n{body}\r\n0\r\n\r\n"
            )
            answer = await raw_http("127.0.0.1", port, request.encode())
            assert answer.status == status, answer.body
    (sent,) = fake_upstream.requests
    assert sent.json["messages"] == [{"role": "user", "content": "ok"}]


async def test_bad_json_body_is_400(proxy: RunningProxy) -> None:
    async with aiohttp.ClientSession() as session:
        resp = await session.post(
            proxy.base + "/chat/completions", data=b"{nope", headers={"Content-Type": "application/json"}
        )
        body = await resp.json()
    assert resp.status == 400 and body["error"]["code"] == "invalid_json"


@pytest.mark.parametrize(
    ("headers", "expected"),
    [
        (
            {"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"},
            "4bf92f3577b34da6a3ce929d0e0e4736",
        ),
        ({"X-Request-Id": "req-123"}, "req-123"),
        ({"X-Request-Id": "bad id with spaces"}, None),
    ],
)
async def test_trace_id_from_traceparent_or_request_id(
    proxy: RunningProxy, fake_upstream: FakeUpstream, headers: dict[str, str], expected: str | None
) -> None:
    fake_upstream.set_default_reply(
        "cheap",
        {
            "ok": True,
            "meta": {"confidence": 0.9, "risk": "low", "explain": "e"},
            "data": {"issues": [], "summary": "s", "verdict": "approve", "rationale": "r"},
        },
    )
    async with aiohttp.ClientSession() as session:
        resp = await session.post(
            proxy.base + "/modules/code-reviewer/execute", headers=headers, json={"input": {"code": "x = 1"}}
        )
        env = await resp.json()
    trace = resp.headers["X-Cognitive-Trace-Id"]
    assert env["meta"]["trace_id"] == trace
    if expected:
        assert trace == expected
    else:
        assert len(trace) == 32
    assert fake_upstream.requests[0].headers["x-request-id"] == trace


async def test_metrics_and_health_routes(proxy: RunningProxy) -> None:
    async with aiohttp.ClientSession() as session:
        assert (await session.get(proxy.url + "/healthz")).status == 200
        ready = await (await session.get(proxy.url + "/readyz")).json()
        metrics = await session.get(proxy.url + "/metrics")
    bundled = sum(1 for path in MODULES.iterdir() if path.is_dir())
    assert ready["status"] == "ready" and ready["modules"] == bundled == len(BUNDLED_MODULES)
    assert metrics.status == 200 and metrics.headers["Content-Type"].startswith("text/plain")


async def test_sigterm_drains_in_flight_requests_then_exits_zero(tmp_path: Path) -> None:
    async with FakeUpstream.start() as fake:
        fake.script("cheap", Fault.slow(1.0, "finished despite SIGTERM"))
        policy = tmp_path / "policy.yaml"
        policy.write_text(yaml.safe_dump(upstream_policy(fake)))
        async with proxy_process("--policy", str(policy), "--drain-timeout", "10") as served:
            async with aiohttp.ClientSession() as session:
                pending = asyncio.create_task(
                    session.post(
                        served.url + "/v1/chat/completions",
                        json={"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "x"}]},
                    )
                )
                await until(lambda: fake.in_flight, "the call in flight upstream", timeout=10, step=0.02)
                served.proc.send_signal(signal.SIGTERM)
                resp = await pending
                body = await resp.json()
            assert resp.status == 200
            assert body["choices"][0]["message"]["content"] == "finished despite SIGTERM"
            assert await asyncio.to_thread(served.proc.wait, 15) == 0


async def test_serve_reads_its_settings_from_the_environment(tmp_path: Path) -> None:
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "proxy", "serve"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={
            **os.environ,
            "COGPROXY_POLICY": str(ROOT / "policies" / "demo.yaml"),
            "COGPROXY_MODULES": str(MODULES),
            "COGPROXY_PORT": str(port),
            "COGPROXY_API_KEYS": "sk-env-key",
        },
    )
    assert proc.stdout is not None and proc.stderr is not None
    drains = Drain(proc.stdout), Drain(proc.stderr)
    try:
        await wait_ready(f"http://127.0.0.1:{port}", proc, *drains)
        client = openai.AsyncOpenAI(
            base_url=f"http://127.0.0.1:{port}/v1", api_key="sk-env-key", max_retries=0
        )
        async with client:
            models = await client.models.list()
        assert "module:code-reviewer" in [m.id for m in models.data]
    finally:
        proc.terminate()
        await asyncio.to_thread(proc.wait, 15)


def test_serve_refuses_a_bad_policy_with_path_and_key(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text(
        yaml.safe_dump(
            {
                "version": 1,
                "providers": {"p": {"kind": "openai"}},
                "ladder": [{"name": "a", "targets": ["p/m"]}],
            }
        )
    )
    result = subprocess.run(
        [sys.executable, "-m", "proxy", "serve", "--policy", str(bad), "--port", str(free_port())],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert result.returncode == 2
    assert f"{bad}: providers.p.base_url: required" in result.stderr


def test_run_with_a_policy_uses_the_same_pipeline(tmp_path: Path) -> None:
    input_file = MODULES / "code-reviewer" / "tests" / "case_minor_issues.input.json"
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "proxy",
            "run",
            "code-reviewer",
            "--modules",
            str(MODULES),
            "--input",
            str(input_file),
            "--policy",
            str(ROOT / "policies" / "demo.yaml"),
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["meta"]["model"] == "offline/large"
    assert "decision: escalated" in result.stderr


def test_serve_names_a_malformed_environment_variable(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "proxy", "serve", "--policy", str(ROOT / "policies/demo.yaml")],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
        env={**os.environ, "COGPROXY_DRAIN_TIMEOUT": "soon"},
    )
    assert result.returncode == 2
    assert "COGPROXY_DRAIN_TIMEOUT='soon' is not a valid float" in result.stderr
