"""``POST /v1/feedback`` through a served proxy: a verdict only from the key that made the call
(or an admin key), the same 404 for another client's trace id as for an unknown one, and the
stored record holds a hash of the key, never the key."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import orjson
import redis.asyncio as aioredis
import yaml

from proxy.state.feedback import from_redis
from tests.api.test_modules import REVIEW_INPUT, envelope
from tests.fake_upstream import FakeUpstream
from tests.proxy_server import UPSTREAM_KEY, UPSTREAM_KEY_ENV, proxy_process
from tests.security.conftest import security_policy
from tests.security.harness import raw_http, request_bytes
from tests.support.polling import settled
from tests.support.redis_server import redis_url

REDIS_URL = redis_url(15)
ALICE, BOB, ADMIN = "sk-alice-0123456789", "sk-bob-0123456789", "sk-admin-0123456789"
ALICE_ID = "key-" + hashlib.sha256(ALICE.encode()).hexdigest()[:16]


def post(path: str, body: Any, key: str | None) -> bytes:
    headers = {"Content-Type": "application/json", **({"Authorization": f"Bearer {key}"} if key else {})}
    return request_bytes("POST", path, headers=headers, body=orjson.dumps(body))


async def test_only_the_calling_key_or_an_admin_key_judges_and_the_key_is_stored_hashed(
    fake_upstream: FakeUpstream, tmp_path: Path
) -> None:
    path = tmp_path / "policy.yaml"
    path.write_text(yaml.safe_dump(security_policy(fake_upstream)))
    args = (
        "--policy",
        str(path),
        "--api-keys",
        f"{ALICE},{BOB}",
        "--admin-keys",
        ADMIN,
        "--redis-url",
        REDIS_URL,
    )
    client: Any = aioredis.Redis.from_url(REDIS_URL)
    trace = ""
    try:
        async with proxy_process(*args, env={UPSTREAM_KEY_ENV: UPSTREAM_KEY}) as served:
            port = int(served.url.rsplit(":", 1)[1])
            fake_upstream.script("cheap", envelope(0.92))
            answer = await raw_http(
                "127.0.0.1", port, post("/v1/modules/code-reviewer/execute", {"input": REVIEW_INPUT}, ALICE)
            )
            assert answer.status == 200
            trace = answer.headers["X-Cognitive-Trace-Id"]
            verdict = {"trace_id": trace, "verdict": "incorrect"}
            unknown = await raw_http(
                "127.0.0.1", port, post("/v1/feedback", {**verdict, "trace_id": "nope"}, BOB)
            )
            other = await raw_http("127.0.0.1", port, post("/v1/feedback", verdict, BOB))
            assert (other.status, unknown.status) == (404, 404)
            # Another client's trace id is answered exactly as an unknown one (but for the id quoted).
            assert other.body.replace(trace.encode(), b"nope") == unknown.body
            assert (await raw_http("127.0.0.1", port, post("/v1/feedback", verdict, None))).status == 401
            assert (await raw_http("127.0.0.1", port, post("/v1/feedback", verdict, ALICE))).status == 200
            assert (await raw_http("127.0.0.1", port, post("/v1/feedback", verdict, ADMIN))).status == 200
            stored = await settled(  # written to Redis in the background
                lambda: client.hget(f"cogproxy:answers:{trace}", ALICE_ID),
                ready=lambda s: s is not None and from_redis(s, ALICE_ID, trace).verdicts == 2,
            )
        assert stored is not None
        for key in (ALICE, BOB, ADMIN):
            assert key.encode() not in stored
        # the key's identity (a hash, never the key) names the record
        assert await client.hkeys(f"cogproxy:answers:{trace}") == [ALICE_ID.encode()]
        stdout, stderr = served.output
        assert ALICE not in stdout + stderr and ADMIN not in stdout + stderr
    finally:
        if trace:
            await client.delete(f"cogproxy:answers:{trace}")
        await client.aclose()
