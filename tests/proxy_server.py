"""Running the real proxy application on a loopback port for end-to-end tests."""

from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import openai
import yaml
from aiohttp import web

from proxy.app import build_app
from proxy.server import SERVER_OPTIONS
from proxy.settings import Settings
from tests.conftest import MODULES
from tests.fake_upstream import FakeUpstream

UPSTREAM_KEY = "sk-upstream-secret"
UPSTREAM_KEY_ENV = "COGPROXY_TEST_UPSTREAM_KEY"


def upstream_policy(fake: FakeUpstream, **extra: Any) -> dict[str, Any]:
    """A policy whose providers are the fake: ``up`` (OpenAI wire) and ``anth`` (Anthropic)."""
    doc: dict[str, Any] = {
        "version": 1,
        "providers": {
            "up": {"kind": "openai", "base_url": fake.openai_base, "api_key_env": UPSTREAM_KEY_ENV},
            "anth": {"kind": "anthropic", "base_url": fake.url, "api_key_env": UPSTREAM_KEY_ENV},
        },
        "ladder": [
            {"name": "fast", "targets": ["up/cheap"]},
            {"name": "strong", "targets": ["up/strong"]},
        ],
        "tiers": {
            "exec": {"min_confidence": 0.9, "max_risk": "low", "exhausted": "reject"},
            "decision": {"min_confidence": 0.7, "max_risk": "medium", "exhausted": "review"},
            "exploration": {"min_confidence": 0.3, "max_risk": "high", "exhausted": "accept"},
        },
        "aliases": {"gpt-4o-mini": "fast", "gpt-4o": "strong", "claude": "anth/claude-x"},
        "failover": {"timeout": {"per_try_s": 5, "total_s": 10}},
    }
    doc.update(extra)
    return doc


@dataclass
class RunningProxy:
    url: str
    app: web.Application
    clients: list[openai.AsyncOpenAI] = field(default_factory=list)

    @property
    def base(self) -> str:
        return self.url + "/v1"

    def client(self, api_key: str = "sk-client-key", **kwargs: Any) -> openai.AsyncOpenAI:
        """An SDK client for the proxy (no SDK retries); closed when the proxy stops."""
        client = openai.AsyncOpenAI(base_url=self.base, api_key=api_key, max_retries=0, **kwargs)
        self.clients.append(client)
        return client


@asynccontextmanager
async def running_proxy(
    tmp_path: Path, policy: dict[str, Any], *, modules: tuple[Path, ...] = (MODULES,), **settings: Any
) -> AsyncIterator[RunningProxy]:
    """Write ``policy`` to disk and serve the proxy on 127.0.0.1 (random port) as `serve` does."""
    policy_path = tmp_path / "policy.yaml"
    policy_path.write_text(yaml.safe_dump(json.loads(json.dumps(policy))))
    app = build_app(Settings(policy_path=policy_path, module_dirs=modules, port=0, **settings))
    runner = web.AppRunner(app, handler_cancellation=True, access_log=None, **SERVER_OPTIONS)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    host, port = runner.addresses[0][:2]
    running = RunningProxy(f"http://{host}:{port}", app)
    try:
        yield running
    finally:
        for client in running.clients:
            await client.close()
        await runner.cleanup()


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


async def wait_ready(url: str, proc: subprocess.Popen[str]) -> None:
    """Poll /readyz until the process serves; fail with its output if it exits first."""
    async with aiohttp.ClientSession() as session:
        for _ in range(200):
            if proc.poll() is not None:
                raise AssertionError(f"serve exited: {proc.communicate()}")
            try:
                if (await session.get(url + "/readyz")).status == 200:
                    return
            except aiohttp.ClientError:
                pass
            await asyncio.sleep(0.05)
    raise AssertionError("proxy never became ready")


@dataclass
class ServedProcess:
    proc: subprocess.Popen[str]
    url: str
    output: tuple[str, str] = ("", "")
    """(stdout, stderr), filled once the process has stopped."""


@asynccontextmanager
async def proxy_process(
    *args: str, env: dict[str, str] | None = None, modules: Path = MODULES
) -> AsyncIterator[ServedProcess]:
    """`python -m proxy serve ARGS` on a free port, as users run it; stopped with SIGTERM after."""
    port = free_port()
    command = [sys.executable, "-m", "proxy", "serve", "--port", str(port), *args]
    if "--modules" not in args and not (env or {}).get("COGPROXY_MODULES"):
        command += ["--modules", str(modules)]
    proc = subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env={**os.environ, **(env or {})}
    )
    served = ServedProcess(proc, f"http://127.0.0.1:{port}")
    try:
        await wait_ready(served.url, proc)
        yield served
    finally:
        if proc.poll() is None:
            proc.terminate()
        try:
            served.output = proc.communicate(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            served.output = proc.communicate()
