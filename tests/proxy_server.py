"""Running the real proxy application on a loopback port for end-to-end tests."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import openai
import yaml
from aiohttp import web

from proxy.app import build_app
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
    runner = web.AppRunner(app, handler_cancellation=True, access_log=None)
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
