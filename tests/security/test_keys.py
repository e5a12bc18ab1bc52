"""Provider keys stay with their provider: an upstream's redirect is never followed with the key,
and no URL credential (userinfo, a query-string key) is quoted in the proxy's own answers.

aiohttp drops ``Authorization`` when it follows a redirect to another origin, but not a key in
``x-api-key`` (Anthropic), ``api-key`` (Azure's ``options.auth_header``) or the policy's
``providers.<name>.headers``: a provider (or anything on the path to it) answering ``307
Location: http://elsewhere`` made the proxy resend the request, key and prompt included, there.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import orjson
import yaml
from aiohttp import web

from tests.fake_upstream import FakeUpstream
from tests.proxy_server import UPSTREAM_KEY, UPSTREAM_KEY_ENV, free_port, proxy_process
from tests.security.conftest import security_policy
from tests.security.harness import Canary, raw_http, request_bytes

SECRET_HEADER = "sk-policy-header-secret"


@asynccontextmanager
async def redirector(location: str) -> AsyncIterator[str]:
    """An upstream that answers every request with ``307 Location: <location>/<path>``."""

    async def redirect(request: web.Request) -> web.Response:
        return web.Response(status=307, headers={"Location": location + request.path})

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", redirect)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    try:
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        yield f"http://127.0.0.1:{runner.addresses[0][1]}"
    finally:
        await runner.cleanup()


def chat(model: str) -> bytes:
    return request_bytes(
        "POST",
        "/v1/chat/completions",
        headers={"Content-Type": "application/json"},
        body=orjson.dumps({"model": model, "messages": [{"role": "user", "content": "private prompt"}]}),
    )


def execute() -> bytes:
    return request_bytes(
        "POST",
        "/v1/modules/code-reviewer/execute",
        headers={"Content-Type": "application/json"},
        body=orjson.dumps({"input": {"code": "x = 1", "language": "python"}}),
    )


async def test_a_redirecting_provider_never_sends_the_key_elsewhere(
    fake_upstream: FakeUpstream, canary: Canary, tmp_path: Path
) -> None:
    """Anthropic (``x-api-key``), an Azure-style ``api-key`` and a policy header, on relayed chat,
    streamed chat and module calls: the 307 is a provider failure (502 / E4001), the canary that
    the redirect names is never contacted."""
    async with redirector(canary.url) as base:
        policy: dict[str, Any] = security_policy(
            fake_upstream, failover={"retries": 0, "timeout": {"per_try_s": 5, "total_s": 10}}
        )
        policy["providers"]["anth"]["base_url"] = base
        policy["providers"]["anth"]["headers"] = {"X-Tenant-Secret": SECRET_HEADER}
        policy["providers"]["up"]["base_url"] = base + "/v1"
        policy["providers"]["up"]["options"] = {"auth_header": "api-key"}
        path = tmp_path / "policy.yaml"
        path.write_text(yaml.safe_dump(policy))
        async with proxy_process("--policy", str(path), env={UPSTREAM_KEY_ENV: UPSTREAM_KEY}) as served:
            port = int(served.url.rsplit(":", 1)[1])
            for request in (chat("claude"), chat("gpt-4o-mini")):
                answer = await raw_http("127.0.0.1", port, request)
                assert answer.status == 502, answer
                assert orjson.loads(answer.body)["error"]["code"] == "upstream_error"
            streamed = request_bytes(
                "POST",
                "/v1/chat/completions",
                headers={"Content-Type": "application/json"},
                body=orjson.dumps(
                    {"model": "claude", "stream": True, "messages": [{"role": "user", "content": "x"}]}
                ),
            )
            assert (await raw_http("127.0.0.1", port, streamed)).status == 502
            answer = await raw_http("127.0.0.1", port, execute())
            assert answer.status == 503
            assert orjson.loads(answer.body)["error"]["code"] == "E4001"
    assert UPSTREAM_KEY not in served.output[0] + served.output[1]


async def test_a_query_string_key_is_never_quoted_in_the_proxy_answers(
    fake_upstream: FakeUpstream, tmp_path: Path
) -> None:
    """``options.query`` carrying a key (providers that take ``?key=``) reaches the provider as
    configured; when the provider cannot be reached, the proxy's 502 body, E4001 envelope and log
    name the provider's host and path only. (userinfo in ``base_url`` is a policy error:
    ``tests/policy/test_loader.py::test_a_base_url_with_credentials_a_query_or_no_host_is_refused``.)"""
    closed = free_port()  # nothing listens there: "cannot reach ..."
    policy: dict[str, Any] = security_policy(
        fake_upstream, failover={"retries": 0, "timeout": {"per_try_s": 5, "total_s": 10}}
    )
    policy["providers"]["up"]["base_url"] = f"http://127.0.0.1:{closed}/v1"
    policy["providers"]["up"]["options"] = {"query": {"key": "AIzaQUERYSECRET"}}
    path = tmp_path / "policy.yaml"
    path.write_text(yaml.safe_dump(policy))
    async with proxy_process("--policy", str(path), env={UPSTREAM_KEY_ENV: UPSTREAM_KEY}) as served:
        port = int(served.url.rsplit(":", 1)[1])
        bodies = []
        for request, status in ((chat("gpt-4o-mini"), 502), (execute(), 503)):
            answer = await raw_http("127.0.0.1", port, request)
            assert answer.status == status, answer
            bodies.append(answer.body)
    for text in [*bodies, served.output[0].encode(), served.output[1].encode()]:
        assert b"QUERYSECRET" not in text, text
    assert f"127.0.0.1:{closed}/v1/chat/completions".encode() in bodies[0]  # still says where
