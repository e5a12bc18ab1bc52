"""Passthrough chat model names: only what the policy names, unless a provider allows any model;
per-target state stays bounded by the policy whatever names clients send."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import yaml

from tests.fake_upstream import FakeUpstream
from tests.proxy_server import UPSTREAM_KEY, UPSTREAM_KEY_ENV, ServedProcess, free_port, proxy_process
from tests.security.conftest import security_policy
from tests.security.harness import RawResponse, raw_http, request_bytes
from tests.support.redis_server import redis_url

REDIS_URL = redis_url(15)
DISTINCT_NAMES = 40


def models_policy(fake: FakeUpstream) -> dict[str, Any]:
    """``up`` (the fake) knows only what the policy names; ``any`` (the fake) and ``dead`` (a closed
    port) allow any model."""
    policy = security_policy(fake)
    policy["providers"]["any"] = {
        "kind": "openai",
        "base_url": fake.openai_base,
        "api_key_env": UPSTREAM_KEY_ENV,
        "allow_any_model": True,
    }
    policy["providers"]["dead"] = {
        "kind": "openai",
        "base_url": f"http://127.0.0.1:{free_port()}/v1",
        "allow_any_model": True,
    }
    policy["failover"] = {"retries": 0, "timeout": {"per_try_s": 5, "total_s": 10}}
    return policy


async def chat(served: ServedProcess, model: str) -> RawResponse:
    host, port = served.url.removeprefix("http://").split(":")
    body = orjson.dumps({"model": model, "messages": [{"role": "user", "content": "x"}]})
    headers = {"Content-Type": "application/json"}
    return await raw_http(
        host, int(port), request_bytes("POST", "/v1/chat/completions", headers=headers, body=body)
    )


async def test_unnamed_models_are_404_unless_the_provider_allows_any(
    fake_upstream: FakeUpstream, tmp_path: Path
) -> None:
    path = tmp_path / "policy.yaml"
    path.write_text(yaml.safe_dump(models_policy(fake_upstream)))
    async with proxy_process("--policy", str(path), env={UPSTREAM_KEY_ENV: UPSTREAM_KEY}) as served:
        refused = await chat(served, "up/made-up-model")
        assert (await chat(served, "up/cheap")).status == 200  # named by the ladder
        assert (await chat(served, "any/whatever-1")).status == 200
    assert refused.status == 404
    error = orjson.loads(refused.body)["error"]
    assert error["code"] == "model_not_found"
    for known in ("up/made-up-model", "up/cheap", "up/strong", "gpt-4o-mini", "fast", "any/*", "module:"):
        assert known in error["message"], known
    assert [r.json["model"] for r in fake_upstream.requests] == ["cheap", "whatever-1"]


async def test_breaker_state_is_one_key_per_provider_for_unnamed_models(
    fake_upstream: FakeUpstream, tmp_path: Path, redis_db: Any
) -> None:
    """Failures of many made-up names on an ``allow_any_model`` provider land in one breaker
    state (``dead/*``); refused names leave no state at all."""
    path = tmp_path / "policy.yaml"
    path.write_text(yaml.safe_dump(models_policy(fake_upstream)))
    async with proxy_process(
        "--policy", str(path), "--redis-url", REDIS_URL, env={UPSTREAM_KEY_ENV: UPSTREAM_KEY}
    ) as served:
        for i in range(DISTINCT_NAMES):
            assert (await chat(served, f"dead/model-{i}")).status in (502, 503)
            assert (await chat(served, f"up/model-{i}")).status == 404
    keys = set(await redis_db.keys("cogproxy:breaker:*"))
    assert keys and {k.rsplit(":", 1)[0] for k in keys} == {"cogproxy:breaker:{dead/*}"}
