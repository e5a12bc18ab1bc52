"""Running the real proxy application on a loopback port for end-to-end tests."""

from __future__ import annotations

import asyncio
import copy
import json
import os
import socket
import subprocess
import sys
import threading
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import aiohttp
import openai
import pytest
import yaml
from aiohttp import web
from pydantic import BaseModel

from proxy.api.access import Route
from proxy.api.app_keys import METRICS, ROUTER
from proxy.api.routes import ROUTES
from proxy.app import build_app
from proxy.policy.loader import DEFAULT_TIERS
from proxy.server import SERVER_OPTIONS, EdgeRunner, api_guard
from proxy.settings import Settings
from tests.fake_upstream import FakeUpstream
from tests.paths import MODULES
from tests.support.polling import eventually

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
        "tiers": copy.deepcopy(DEFAULT_TIERS),  # the proxy's own defaults, written out
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


class RecordedSleeps:
    """The router's sleep, injected: records each wait (backoff, Retry-After) and returns at once."""

    def __init__(self) -> None:
        self.waits: list[float] = []

    async def __call__(self, seconds: float) -> None:
        self.waits.append(seconds)


def record_router_sleeps(px: RunningProxy, monkeypatch: pytest.MonkeyPatch) -> RecordedSleeps:
    sleeps = RecordedSleeps()
    monkeypatch.setattr(px.app[ROUTER], "_sleep", sleeps)
    return sleeps


@asynccontextmanager
async def running_proxy(
    tmp_path: Path,
    policy: dict[str, Any],
    *,
    modules: tuple[Path, ...] = (MODULES,),
    table: tuple[Route, ...] = ROUTES,
    **settings: Any,
) -> AsyncIterator[RunningProxy]:
    """Write ``policy`` to disk and serve the proxy on 127.0.0.1 (random port) as `serve` does
    (``table``: its routes)."""
    policy_path = tmp_path / "policy.yaml"
    policy_path.write_text(yaml.safe_dump(json.loads(json.dumps(policy))))
    config = Settings(policy_path=policy_path, module_dirs=modules, port=0, **settings)
    app = build_app(config, table)
    # serve's runner: its connection guard and its dispatch of the API's requests (edge_dispatch)
    runner = EdgeRunner(
        app, api_guard(config, app[METRICS]), handler_cancellation=True, access_log=None, **SERVER_OPTIONS
    )
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


def cognitive_of(completion: BaseModel) -> dict[str, Any]:
    """The ``cognitive`` block the proxy adds to a completion (an extra field to the SDK's model)."""
    extra = completion.model_extra
    assert extra is not None, "the SDK dropped the extra fields"
    block: dict[str, Any] = extra["cognitive"]
    return block


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


PIPE_CLOSE_S = 5.0
"""How long to wait, once the process has exited, for its pipes to be read to the end."""


class Drain:
    """Reads a pipe to the end on a thread, so that a chatty process never blocks on a full pipe."""

    def __init__(self, pipe: IO[str]) -> None:
        self._lines: list[str] = []
        self._thread = threading.Thread(target=self._read, args=(pipe,), daemon=True)
        self._thread.start()

    def _read(self, pipe: IO[str]) -> None:
        with pipe:
            for line in pipe:
                self._lines.append(line)

    def text(self) -> str:
        """Everything read so far (all of it once the process has exited and ``join`` returned)."""
        return "".join(self._lines)

    def join(self, timeout: float) -> None:
        self._thread.join(timeout)


READY_TIMEOUT_S = 30.0
"""How long a started ``cogproxy serve`` may take to answer /readyz: seconds on a loaded machine."""


class _Exited(Exception):
    """The process being waited for exited."""


async def wait_ready(url: str, proc: subprocess.Popen[str], *drains: Drain) -> None:
    """Poll /readyz until the process serves; fail with its output (``drains``) if it exits first."""
    async with aiohttp.ClientSession() as session:

        async def serving() -> bool:
            if proc.poll() is not None:
                raise _Exited
            async with session.get(url + "/readyz") as resp:
                return resp.status == 200

        try:
            await eventually(
                serving,
                "the proxy ready (/readyz 200)",
                timeout=READY_TIMEOUT_S,
                ignore=(aiohttp.ClientError,),
            )
        except _Exited:
            for drain in drains:
                await asyncio.to_thread(drain.join, PIPE_CLOSE_S)
            raise AssertionError(f"serve exited {proc.returncode}: {[d.text() for d in drains]}") from None


@dataclass
class ServedProcess:
    proc: subprocess.Popen[str]
    url: str
    stdout: Drain
    stderr: Drain
    output: tuple[str, str] = ("", "")
    """(stdout, stderr), filled once the process has stopped."""

    async def stop(self, timeout: float = 20.0) -> tuple[str, str]:
        """SIGTERM (SIGKILL after ``timeout``), then everything it wrote: (stdout, stderr)."""
        if self.proc.poll() is None:
            self.proc.terminate()
        try:
            await asyncio.to_thread(self.proc.wait, timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            await asyncio.to_thread(self.proc.wait)
        for drain in (self.stdout, self.stderr):
            await asyncio.to_thread(drain.join, PIPE_CLOSE_S)
        self.output = (self.stdout.text(), self.stderr.text())
        return self.output


@asynccontextmanager
async def proxy_process(
    *args: str, env: dict[str, str] | None = None, modules: Path = MODULES
) -> AsyncIterator[ServedProcess]:
    """`python -m proxy serve ARGS` on a free port, as users run it; stopped with SIGTERM after.

    Both pipes are drained while it runs (``served.stdout.text()``), so a test that makes it
    log a lot cannot stall it on a full pipe buffer."""
    port = free_port()
    command = [sys.executable, "-m", "proxy", "serve", "--port", str(port), *args]
    if "--modules" not in args and not (env or {}).get("COGPROXY_MODULES"):
        command += ["--modules", str(modules)]
    proc = subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env={**os.environ, **(env or {})}
    )
    assert proc.stdout is not None and proc.stderr is not None
    served = ServedProcess(proc, f"http://127.0.0.1:{port}", Drain(proc.stdout), Drain(proc.stderr))
    try:
        await wait_ready(served.url, proc, served.stdout, served.stderr)
        yield served
    finally:
        await served.stop()
