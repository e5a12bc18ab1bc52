"""Issue #30 adversarial pass by an outside attacker: the route table, its scopes and methods, the
probe listener, and the policy's tier fields, attacked through a real ``cogproxy serve``.

Each test here fails on 379c9fc (the end of #30) and describes the answer the fix should give.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest
import yaml
from aiohttp import web

from tests.fake_upstream import FakeUpstream
from tests.proxy_server import (
    UPSTREAM_KEY,
    UPSTREAM_KEY_ENV,
    ServedProcess,
    free_port,
    proxy_process,
    running_proxy,
)
from tests.security.conftest import security_policy
from tests.security.harness import RawResponse, raw_http, request_bytes

CLIENT = "sk-client-attack-30"
ODD_EXPECT = "zqexpect-canary-30"


@dataclass(frozen=True)
class Keyed:
    """``cogproxy serve`` with a client key and a probe listener (``--admin-port``)."""

    served: ServedProcess
    api_port: int
    probe_port: int

    async def api(self, raw: bytes) -> RawResponse:
        return await raw_http("127.0.0.1", self.api_port, raw)

    async def probe(self, raw: bytes) -> RawResponse:
        return await raw_http("127.0.0.1", self.probe_port, raw)


@pytest.fixture
async def keyed(fake_upstream: FakeUpstream, tmp_path: Path) -> AsyncIterator[Keyed]:
    path = tmp_path / "policy.yaml"
    path.write_text(yaml.safe_dump(security_policy(fake_upstream)))
    probe_port = free_port()
    async with proxy_process(
        "--policy",
        str(path),
        "--api-keys",
        CLIENT,
        "--admin-port",
        str(probe_port),
        env={UPSTREAM_KEY_ENV: UPSTREAM_KEY},
    ) as served:
        yield Keyed(served, int(served.url.rsplit(":", 1)[1]), probe_port)


def _error_code(answer: RawResponse) -> Any:
    assert answer.headers.get("Content-Type", "").startswith("application/json"), answer
    return orjson.loads(answer.body)["error"]["code"]


async def test_an_unknown_expectation_on_an_unrouted_path_or_the_probe_listener_is_not_echoed(
    keyed: Keyed,
) -> None:
    """#26 gave every row of the route table an ``Expect`` handler; a path no row matches, and
    every path of the probe listener, still get aiohttp's own ``417 text/plain "Unknown Expect:
    <the client's value>"``: on the API port before the client key is checked (401 without a key
    on every other path), and never in the OpenAI error format either listener promises."""
    expect = {"Expect": ODD_EXPECT}
    keyless = await keyed.api(request_bytes("GET", "/nope", headers=expect))
    with_key = await keyed.api(
        request_bytes("GET", "/v2/x", headers={**expect, "Authorization": f"Bearer {CLIENT}"})
    )
    probe_route = await keyed.probe(request_bytes("GET", "/healthz", headers=expect))
    probe_other = await keyed.probe(request_bytes("GET", "/v1/models", headers=expect))
    for answer in (keyless, with_key, probe_route, probe_other):
        assert ODD_EXPECT.encode() not in answer.body, answer
    assert (keyless.status, _error_code(keyless)) == (401, "invalid_api_key")
    assert (with_key.status, _error_code(with_key)) == (417, "expectation_failed")
    assert (probe_route.status, _error_code(probe_route)) == (417, "expectation_failed")
    assert probe_other.status in (404, 417) and _error_code(probe_other) is not None


async def test_the_probe_listeners_405_names_the_methods_it_takes(keyed: Keyed) -> None:
    """A 405 must say what is allowed (RFC 9110 §15.5.6). The API port's ``POST /metrics`` answers
    ``Allow: GET, HEAD`` from the route table; the probe listener, serving the same rows, answers
    405 with no ``Allow``: its error middleware rebuilds aiohttp's ``HTTPMethodNotAllowed`` as an
    OpenAI error and drops the exception's headers."""
    api = await keyed.api(request_bytes("POST", "/metrics"))
    assert (api.status, api.headers.get("Allow")) == (405, "GET, HEAD")
    for method, path in (("POST", "/metrics"), ("DELETE", "/healthz"), ("PUT", "/readyz")):
        answer = await keyed.probe(request_bytes(method, path))
        assert (answer.status, _error_code(answer)) == (405, "method_not_allowed"), answer
        allowed = {m.strip() for m in answer.headers.get("Allow", "").split(",") if m.strip()}
        assert allowed == {"GET", "HEAD"}, (method, path, dict(answer.headers))


@asynccontextmanager
async def trace_reflecting_upstream() -> AsyncIterator[tuple[str, list[str]]]:
    """An upstream that honours TRACE as RFC 9110 §9.3.8 describes (Apache httpd's default,
    ``TraceEnable on``): the request it received, headers included, comes back as
    ``message/http``; every other request is 404. Yields its URL and the methods it saw."""
    seen: list[str] = []

    async def answer(request: web.Request) -> web.Response:
        seen.append(request.method)
        if request.method != "TRACE":
            return web.json_response({"error": {"message": "not found"}}, status=404)
        head = f"TRACE {request.raw_path} HTTP/1.1\r\n" + "".join(
            f"{name}: {value}\r\n" for name, value in request.headers.items()
        )
        return web.Response(body=head.encode(), content_type="message/http")

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", answer)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    try:
        await web.TCPSite(runner, "127.0.0.1", 0).start()
        yield f"http://127.0.0.1:{runner.addresses[0][1]}", seen
    finally:
        await runner.cleanup()


async def test_trace_never_reaches_the_provider_with_its_key(
    fake_upstream: FakeUpstream, tmp_path: Path
) -> None:
    """The ``/v1/*`` passthrough takes every method and injects the provider key: ``TRACE
    /v1/files`` with a client key went to the provider, and an upstream that reflects TRACE
    handed the client ``Authorization: Bearer <the provider key>``. TRACE is never part of a
    provider API; the proxy answers it 405 and sends nothing upstream."""
    async with trace_reflecting_upstream() as (url, seen):
        policy = security_policy(fake_upstream)
        policy["providers"]["up"]["base_url"] = url + "/v1"
        path = tmp_path / "policy.yaml"
        path.write_text(yaml.safe_dump(policy))
        async with proxy_process(
            "--policy", str(path), "--api-keys", CLIENT, env={UPSTREAM_KEY_ENV: UPSTREAM_KEY}
        ) as served:
            port = int(served.url.rsplit(":", 1)[1])
            auth = {"Authorization": f"Bearer {CLIENT}"}
            traced = await raw_http("127.0.0.1", port, request_bytes("TRACE", "/v1/files", headers=auth))
            listed = await raw_http("127.0.0.1", port, request_bytes("GET", "/v1/files", headers=auth))
    assert listed.status == 404 and seen.count("GET") == 1  # the passthrough itself works
    assert UPSTREAM_KEY.encode() not in traced.body, traced.body[:300]
    assert "TRACE" not in seen
    assert (traced.status, _error_code(traced)) == (405, "method_not_allowed")


EXECUTE_BODY = {"input": {"code": "x = 1", "language": "python"}}


async def _execute_once(fake: FakeUpstream, tmp_path: Path, policy: dict[str, Any]) -> tuple[int, Any, int]:
    """One code-reviewer call on a proxy serving ``policy``: (status, error code, upstream calls)."""
    fake.reset()
    async with (
        running_proxy(tmp_path, policy) as proxy,
        aiohttp.ClientSession() as session,
        session.post(f"{proxy.url}/v1/modules/code-reviewer/execute", json=EXECUTE_BODY) as resp,
    ):
        envelope = await resp.json()
        return resp.status, envelope.get("error", {}).get("code"), len(fake.requests)


@pytest.mark.parametrize("section", ["tiers", "modules"])
async def test_a_whole_number_written_as_a_float_is_a_valid_reask(
    fake_upstream: FakeUpstream, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, section: str
) -> None:
    """``reask: 1.0`` passes the schema (``type: integer`` takes 1.0), the policy loads and
    /readyz is 200, but the value reached ``range()`` as a float: every call of the tier (or of
    the module, for an override) answered 500 E4000. The tier path is a regression of e3ce210
    (``_thresholds`` no longer applies ``int()``); the override was never converted. It must
    answer as ``reask: 1`` does."""
    monkeypatch.setenv(UPSTREAM_KEY_ENV, UPSTREAM_KEY)

    def policy(reask: float) -> dict[str, Any]:
        doc = security_policy(fake_upstream)
        if section == "tiers":
            doc["tiers"]["decision"]["reask"] = reask  # code-reviewer is a decision module
        else:
            doc["modules"] = {"code-reviewer": {"reask": reask}}
        return doc

    as_int = await _execute_once(fake_upstream, tmp_path, policy(1))
    as_float = await _execute_once(fake_upstream, tmp_path, policy(1.0))
    assert as_int[0] != 500, as_int
    assert as_float == as_int
