"""The ``/v1/*`` passthrough under attack: request targets, headers, cookies, compressed bodies.

Every test drives a real ``cogproxy serve`` with raw sockets and checks what the fake upstream
(which records every request) and, where a request could be sent elsewhere, a canary received.
"""

from __future__ import annotations

import gzip
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import orjson
import yaml

from proxy import __version__
from proxy.api.headers import forwarded
from tests.fake_upstream import FakeUpstream
from tests.proxy_server import UPSTREAM_KEY, UPSTREAM_KEY_ENV, ServedProcess, proxy_process
from tests.security.conftest import security_policy
from tests.security.harness import Canary, RawResponse, raw_http, request_bytes

HTTP_PORT = 80
"""The port a hostname without one resolves to: where an extended hostname would go."""


@asynccontextmanager
async def serve(tmp_path: Path, policy: dict[str, Any]) -> AsyncIterator[ServedProcess]:
    path = tmp_path / "policy.yaml"
    path.write_text(yaml.safe_dump(policy))
    async with proxy_process("--policy", str(path), env={UPSTREAM_KEY_ENV: UPSTREAM_KEY}) as proc:
        yield proc


async def send(served: ServedProcess, request: bytes) -> RawResponse:
    host, port = served.url.removeprefix("http://").split(":")
    return await raw_http(host, int(port), request)


def refused_target(answer: RawResponse) -> bool:
    error = orjson.loads(answer.body)["error"]
    return answer.status == 400 and error["code"] == "invalid_request_target" and bool(error["message"])


# -- 1: the request target never names the upstream host -------------------------------------------


async def test_absolute_form_cannot_extend_the_provider_hostname(
    fake_upstream: FakeUpstream, tmp_path: Path
) -> None:
    """``base_url http://local/v1`` + target ``host://x/v1/files`` used to send the key to
    ``localhost:80``; the canary listens there."""
    canary = await Canary(port=HTTP_PORT).start()
    try:
        policy = security_policy(fake_upstream)
        policy["providers"]["up"]["base_url"] = "http://local/v1"
        async with serve(tmp_path, policy) as served:
            answer = await send(served, request_bytes("GET", "host://x/v1/files"))
            assert refused_target(answer)
            assert (await send(served, request_bytes("GET", "host://x/v1/chat/completions"))).status == 400
    finally:
        await canary.stop()
    canary.assert_untouched()


async def test_absolute_and_authority_forms_are_refused(
    served: ServedProcess, fake_upstream: FakeUpstream, canary: Canary
) -> None:
    for method, target in [
        ("GET", f"{canary.url}/v1/files"),
        ("GET", "munity://x/v1/files"),
        ("POST", f"{canary.url}/v1/embeddings"),
        ("GET", f"{canary.url}/healthz"),
        ("CONNECT", f"{canary.host}:{canary.port}"),
    ]:
        answer = await send(served, request_bytes(method, target))
        assert refused_target(answer), (target, answer)
    assert fake_upstream.requests == []


async def test_origin_form_reaches_only_the_configured_base(
    fake_upstream: FakeUpstream, tmp_path: Path
) -> None:
    """The upstream URL is ``base_url`` (its path kept, its ``/v1`` not repeated) + the path; the
    query goes as sent and cannot move the request elsewhere."""
    policy = security_policy(fake_upstream)
    policy["providers"]["up"]["base_url"] = fake_upstream.url + "/tenant/v1"
    async with serve(tmp_path, policy) as served:
        answer = await send(served, request_bytes("GET", "/v1/files/file-1?after=%2F..&u=@evil.com:1/x"))
    assert answer.status == 404  # the fake's own answer for a path it does not serve
    (sent,) = fake_upstream.requests
    assert sent.target == "/tenant/v1/files/file-1?after=%2F..&u=@evil.com:1/x"
    assert sent.headers["authorization"] == f"Bearer {UPSTREAM_KEY}"


# -- 2: dot segments and encoded separators -----------------------------------------------------------

TRAVERSALS = [
    "/v1/static/%2e%2e/%2e%2e/admin/secret.txt",
    "/v1/../admin",
    "/v1/..%2fadmin",
    "/v1/..%2Fadmin",
    "/v1/%5c..",
    "/v1/a\\..\\admin",
    "/v1/files/.",
    "/v1/files/%2E",
    "/v1/.%2e/admin",
    "/v1/x/../chat/completions",
    "/v1/files%2Ffile-1",
    "/v1//evil.com/x",
    "/v1/a%00b",
    "/v1/a%0d%0aX-Injected:%201",
    "/v1/%zz",
    "/v1/a%2",
    "/v1/files#frag",
    "/v1/..;/admin",
    "/v1/files/.;x=1",
    "/v1/%C0%AE%C0%AE/admin",
    "/v1/%FF",
]


async def test_traversal_and_encoded_separators_are_refused(
    served: ServedProcess, fake_upstream: FakeUpstream
) -> None:
    for target in TRAVERSALS:
        answer = await send(served, request_bytes("GET", target))
        assert refused_target(answer), (target, answer)
    assert fake_upstream.requests == []


async def test_route_choice_is_made_on_the_normalised_path(
    fake_upstream: FakeUpstream, tmp_path: Path
) -> None:
    """``/v1/%66iles`` is ``/v1/files``: it goes to the provider routed for files, normalised."""
    policy = security_policy(fake_upstream)
    policy["providers"]["files"] = {
        "kind": "openai",
        "base_url": fake_upstream.url + "/files-provider/v1",
        "api_key_env": UPSTREAM_KEY_ENV,
    }
    policy["passthrough"] = {"provider": "up", "routes": [{"prefix": "/v1/files", "providers": ["files"]}]}
    async with serve(tmp_path, policy) as served:
        await send(served, request_bytes("GET", "/v1/%66iles/file-%41bc"))
        await send(served, request_bytes("GET", "/v1/%66ilesx"))
    assert [r.target for r in fake_upstream.requests] == ["/files-provider/v1/files/file-Abc", "/v1/filesx"]


# -- 8: headers and cookies ---------------------------------------------------------------------------


async def test_only_allow_listed_request_headers_go_upstream(
    served: ServedProcess, fake_upstream: FakeUpstream
) -> None:
    sent_headers = {
        "Authorization": "Bearer sk-client-own",
        "Cookie": "session=client-secret",
        "X-Forwarded-For": "10.0.0.1",
        "X-Api-Key": "client-x-api-key",
        "api-key": "client-azure-key",
        "X-Stainless-Os": "Linux",
        "X-Request-Id": "client-chosen",
        "Accept": "application/json",
        "OpenAI-Organization": "org-1",
        "OpenAI-Beta": "assistants=v2",
        "Idempotency-Key": "idem-1",
        "traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
    }
    answer = await send(served, request_bytes("GET", "/v1/files/file-1", headers=sent_headers))
    (sent,) = fake_upstream.requests
    for name in ("cookie", "x-forwarded-for", "x-api-key", "api-key", "x-stainless-os"):
        assert name not in sent.headers, name
    assert sent.headers["authorization"] == f"Bearer {UPSTREAM_KEY}"
    assert sent.headers["x-request-id"] == answer.headers["X-Cognitive-Trace-Id"] != "client-chosen"
    assert sent.headers["openai-organization"] == "org-1" and sent.headers["openai-beta"] == "assistants=v2"
    assert sent.headers["idempotency-key"] == "idem-1"
    assert sent.headers["traceparent"] == sent_headers["traceparent"]
    assert sent.headers["accept"] == "application/json"
    assert "client-" not in json.dumps(sent.headers)


async def test_upstream_requests_carry_the_proxy_user_agent(
    served: ServedProcess, fake_upstream: FakeUpstream
) -> None:
    """Neither the client's User-Agent (it names the client's software) nor the HTTP library's: the
    proxy names itself and its version, on passthrough and on chat alike."""
    client_agent = {"User-Agent": "OpenAI/Python 1.99.0 client-agent", "Content-Type": "application/json"}
    chat = orjson.dumps({"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "x"}]})
    await send(served, request_bytes("GET", "/v1/files/file-1", headers=client_agent))
    await send(served, request_bytes("POST", "/v1/chat/completions", headers=client_agent, body=chat))
    assert [sent.headers.get("user-agent") for sent in fake_upstream.requests] == [
        f"cognitive-proxy/{__version__}"
    ] * 2


def test_origin_and_forwarding_headers_are_not_on_the_allow_list() -> None:
    for name in ("Origin", "Referer", "Forwarded", "X-Forwarded-Host", "X-Real-Ip", "Proxy-Authorization"):
        assert not forwarded(name), name


async def test_upstream_cookies_are_neither_returned_nor_replayed(
    fake_upstream: FakeUpstream, tmp_path: Path
) -> None:
    """A hostname ``base_url``: aiohttp's default jar would keep the cookie and send it upstream
    with every later request, of every client (passthrough and chat share the session)."""
    policy = security_policy(fake_upstream)
    port = fake_upstream.url.rsplit(":", 1)[1]
    policy["providers"]["up"]["base_url"] = f"http://localhost:{port}/v1"
    fake_upstream.set_cookie = "session=first-client-secret; Path=/"
    async with serve(tmp_path, policy) as served:
        first = await send(served, request_bytes("GET", "/v1/files/file-1"))
        assert first.status == 404 and "x-request-id" in first.headers  # the fake's answer came back
        assert "Set-Cookie" not in first.headers
        fake_upstream.set_cookie = None
        chat = orjson.dumps({"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "x"}]})
        json_type = {"Content-Type": "application/json"}
        assert (
            await send(served, request_bytes("POST", "/v1/chat/completions", headers=json_type, body=chat))
        ).status == 200
        await send(served, request_bytes("GET", "/v1/files/file-2"))
    assert len(fake_upstream.requests) == 3
    for later in fake_upstream.requests[1:]:
        assert "cookie" not in later.headers, later


# -- 9: compressed request bodies ----------------------------------------------------------------------


async def test_gzip_upload_is_forwarded_as_the_client_sent_it(
    served: ServedProcess, fake_upstream: FakeUpstream
) -> None:
    """Resendable (embeddings, buffered) and streamed (other paths) bodies keep their encoding."""
    payload = {"model": "text-embedding-3-small", "input": "word " * 5000}
    body = gzip.compress(orjson.dumps(payload))
    headers = {"Content-Type": "application/json", "Content-Encoding": "gzip"}
    answer = await send(served, request_bytes("POST", "/v1/embeddings", headers=headers, body=body))
    assert answer.status == 200, answer
    streamed = await send(served, request_bytes("POST", "/v1/uploads", headers=headers, body=body))
    assert streamed.status == 404  # the fake's answer: the body arrived whole
    for sent in fake_upstream.requests:
        assert sent.headers["content-encoding"] == "gzip"
        assert sent.headers["content-length"] == str(len(body))
        assert sent.json == payload  # the fake inflates what it receives


async def test_gzip_on_parsed_routes_is_inflated_under_the_body_limit(
    served: ServedProcess, fake_upstream: FakeUpstream
) -> None:
    chat = {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "hi"}]}
    headers = {"Content-Type": "application/json", "Content-Encoding": "gzip"}
    ok = await send(
        served,
        request_bytes(
            "POST", "/v1/chat/completions", headers=headers, body=gzip.compress(orjson.dumps(chat))
        ),
    )
    assert ok.status == 200, ok
    assert fake_upstream.requests[0].json["messages"] == chat["messages"]
    # 64 MiB of padding inflating from ~64 KiB: refused once the inflated size passes the limit.
    bomb = gzip.compress(b'{"model": "gpt-4o-mini", "pad": "' + b" " * (64 * 1024 * 1024) + b'"}', 9)
    assert len(bomb) < 1024 * 1024
    for path in ("/v1/chat/completions", "/v1/responses", "/v1/modules/code-simplifier/execute"):
        answer = await send(served, request_bytes("POST", path, headers=headers, body=bomb))
        # a module route answers the spec's envelope: E1005 for a text module's body
        code = "E1005" if path.endswith("/execute") else "request_too_large"
        assert answer.status == 413 and orjson.loads(answer.body)["error"]["code"] == code, path
    broken = await send(
        served, request_bytes("POST", "/v1/chat/completions", headers=headers, body=b"not gzip")
    )
    assert broken.status == 400
    odd = {**headers, "Content-Encoding": "compress"}
    assert (
        await send(served, request_bytes("POST", "/v1/chat/completions", headers=odd, body=b"x"))
    ).status == 415
    assert len(fake_upstream.requests) == 1


async def test_compressed_answers_reach_only_clients_that_asked(
    served: ServedProcess, fake_upstream: FakeUpstream
) -> None:
    """The upstream session does not inflate (passthrough relays bytes), so it asks providers for
    ``identity`` unless the client asked for more; chat answers stay readable JSON."""
    fake_upstream.compress = True
    chat = orjson.dumps({"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "x"}]})
    json_type = {"Content-Type": "application/json"}
    answer = await send(served, request_bytes("POST", "/v1/chat/completions", headers=json_type, body=chat))
    assert answer.status == 200 and orjson.loads(answer.body)["choices"], answer
    plain = await send(served, request_bytes("GET", "/v1/files/file-1"))
    assert "Content-Encoding" not in plain.headers and orjson.loads(plain.body)["error"]
    asked = await send(served, request_bytes("GET", "/v1/files/file-1", headers={"Accept-Encoding": "gzip"}))
    assert asked.headers["Content-Encoding"] == "gzip" and orjson.loads(gzip.decompress(asked.body))["error"]
    assert [r.headers["accept-encoding"] for r in fake_upstream.requests] == ["identity", "identity", "gzip"]


# -- the proxy's own routes cannot be reached on the provider through the passthrough ----------------

OWN_ROUTE_ALIASES = [
    "/v1/chat/completions/",
    "/v1/chat/completions;x",
    "/v1/chat;x/completions",
    "/v1/Chat/Completions",
    "/v1/CHAT/completions/",
    "/v1/responses/",
    "/v1/Responses",
    "/v1/modules/code-reviewer/execute/",
    "/v1/capabilities/",
]


async def test_own_routes_written_otherwise_are_not_forwarded(
    served: ServedProcess, fake_upstream: FakeUpstream
) -> None:
    """``POST /v1/chat/completions/`` (or ``;x``, or another case) missed the proxy's chat handler
    and went to the provider's chat endpoint with the provider key and any model name: servers
    that ignore a trailing slash, ``;`` parameters or case then answered past the model checks
    (``allow_any_model``) and the module routing."""
    body = orjson.dumps({"model": "up/not-in-the-policy", "messages": [{"role": "user", "content": "hi"}]})
    for target in OWN_ROUTE_ALIASES:
        answer = await send(
            served, request_bytes("POST", target, headers={"Content-Type": "application/json"}, body=body)
        )
        assert refused_target(answer), (target, answer)
        assert "/v1/" in orjson.loads(answer.body)["error"]["message"]
    assert fake_upstream.requests == []


async def test_the_proxys_own_paths_answer_405_for_other_methods(
    served: ServedProcess, fake_upstream: FakeUpstream
) -> None:
    """``/v1/capabilities`` exists only on the proxy: other methods are 405 with ``Allow``, never
    forwarded. Paths shared with the OpenAI API keep their other methods on the passthrough
    (``GET /v1/chat/completions`` lists stored completions, ``DELETE /v1/models/{id}`` deletes a
    fine-tuned model)."""
    for method in ("DELETE", "POST", "PUT"):
        answer = await send(served, request_bytes(method, "/v1/capabilities"))
        assert answer.status == 405 and answer.headers["Allow"] == "GET, HEAD", (method, answer)
    assert fake_upstream.requests == []
    await send(served, request_bytes("GET", "/v1/chat/completions"))
    await send(served, request_bytes("DELETE", "/v1/models/ft:gpt-4o:org:x"))
    assert [(r.method, r.target) for r in fake_upstream.requests] == [
        ("GET", "/v1/chat/completions"),
        ("DELETE", "/v1/models/ft:gpt-4o:org:x"),
    ]


async def test_headers_the_client_names_in_connection_stay_here(
    served: ServedProcess, fake_upstream: FakeUpstream
) -> None:
    """RFC 9110 §7.6.1: a header named in ``Connection`` is for this hop only, even when it is on
    the allow-list (``OpenAI-*``); the response side already drops the upstream's."""
    await send(
        served,
        request_bytes(
            "GET",
            "/v1/files/file-1",
            headers={"Connection": "OpenAI-Organization, keep-alive", "OpenAI-Organization": "org-hop"},
        ),
    )
    (sent,) = fake_upstream.requests
    assert "openai-organization" not in sent.headers


async def test_bytes_after_the_compressed_body_are_refused_on_parsed_routes(
    served: ServedProcess, fake_upstream: FakeUpstream
) -> None:
    """Only the first gzip member was inflated and the rest ignored: a second member (or any
    trailing bytes) was silently dropped from what the proxy parsed and acted on."""
    headers = {"Content-Type": "application/json", "Content-Encoding": "gzip"}
    first = gzip.compress(b'{"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "hi"}]')
    second = gzip.compress(b', "n": 2}')
    for body in (first + second, gzip.compress(b'{"model": "gpt-4o-mini", "messages": []}') + b"trailing"):
        answer = await send(served, request_bytes("POST", "/v1/chat/completions", headers=headers, body=body))
        assert answer.status == 400 and orjson.loads(answer.body)["error"]["code"] == "invalid_encoding", (
            answer
        )
    assert fake_upstream.requests == []
