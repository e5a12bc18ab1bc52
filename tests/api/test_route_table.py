"""The route table (``proxy.api.routes``): every route's scope and methods, enforced by the edge
on a served proxy with client keys and admin keys configured."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web
from structlog.testing import capture_logs
from yarl import URL

from proxy.api import passthrough
from proxy.api.access import Route, Scope
from proxy.api.refusals import EXECUTE_ROUTE
from proxy.api.routes import PROBE_ROUTES, ROUTES
from proxy.contract.errors import Code
from tests.fake_upstream import FakeUpstream
from tests.proxy_server import RunningProxy, running_proxy, upstream_policy

CLIENT = "sk-client-key"
ADMIN = "sk-admin-key"
WRONG = "sk-wrong-key"
KEYS = {"no key": None, "client key": CLIENT, "admin key": ADMIN, "wrong key": WRONG}
CHAT = {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "hi"}]}


@dataclass(frozen=True)
class Sample:
    """A request a row answers, and its status once a key opens the row."""

    scope: Scope
    """Pinned here, not read from the row: a row whose scope changes fails this walk."""
    method: str
    target: str
    admitted: int
    body: dict[str, Any] | None = None


SAMPLES: dict[str, Sample] = {
    "/v1/chat/completions": Sample(Scope.CLIENT, "POST", "/v1/chat/completions", 200, CHAT),
    "/v1/models": Sample(Scope.CLIENT, "GET", "/v1/models", 200),
    "/v1/models/{model:.+}": Sample(Scope.CLIENT, "GET", "/v1/models/gpt-4o-mini", 200),
    EXECUTE_ROUTE: Sample(Scope.CLIENT, "POST", "/v1/modules/nope/execute", 404, {"input": {}}),
    "/v1/modules": Sample(Scope.CLIENT, "GET", "/v1/modules", 200),
    "/v1/modules/{name}": Sample(Scope.CLIENT, "GET", "/v1/modules/code-reviewer", 200),
    "/v1/feedback": Sample(
        Scope.CLIENT_OR_ADMIN, "POST", "/v1/feedback", 404, {"trace_id": "t-1", "verdict": "correct"}
    ),
    "/v1/capabilities": Sample(Scope.CLIENT, "GET", "/v1/capabilities", 200),
    "/healthz": Sample(Scope.PUBLIC, "GET", "/healthz", 200),
    "/readyz": Sample(Scope.PUBLIC, "GET", "/readyz", 200),
    "/metrics": Sample(Scope.PUBLIC, "GET", "/metrics", 200),
    "/openapi.json": Sample(Scope.CLIENT, "GET", "/openapi.json", 200),
    "/v1/responses": Sample(
        Scope.CLIENT, "POST", "/v1/responses", 200, {"model": "gpt-4o-mini", "input": "hi"}
    ),
    "/v1/usage": Sample(Scope.ADMIN, "GET", "/v1/usage?client=nobody", 404),
    # The review console: the admin listener's (tests/console walk it there).
    "/review/login": Sample(Scope.PUBLIC, "GET", "/review/login", 200),
    "/review/session": Sample(Scope.PUBLIC, "POST", "/review/session", 403),
    "/review/logout": Sample(Scope.CONSOLE, "POST", "/review/logout", 303),
    "/review/": Sample(Scope.CONSOLE, "GET", "/review/", 200),
    "/review/items/{client}/{trace_id}": Sample(Scope.CONSOLE, "GET", "/review/items/c/t", 404),
    "/review/items/{client}/{trace_id}/verdict": Sample(
        Scope.CONSOLE, "POST", "/review/items/c/t/verdict", 404
    ),
    "/review/items/{client}/{trace_id}/override": Sample(
        Scope.CONSOLE, "POST", "/review/items/c/t/override", 404
    ),
    "/review/reliability": Sample(Scope.CONSOLE, "GET", "/review/reliability", 200),
    "/review/static/{name}": Sample(Scope.PUBLIC, "GET", "/review/static/console.css", 200),
    r"/v1/{tail:[\s\S]*}": Sample(Scope.CLIENT, "POST", "/v1/embeddings", 200, {"model": "e", "input": "x"}),
}
ADMITTED = "admitted"
REFUSALS: dict[Scope, dict[str, tuple[int, str] | str]] = {
    Scope.PUBLIC: dict.fromkeys(KEYS, ADMITTED),
    Scope.CLIENT: {
        "no key": (401, "invalid_api_key"),
        "client key": ADMITTED,
        "admin key": (401, "invalid_api_key"),  # an admin key is no client key
        "wrong key": (401, "invalid_api_key"),
    },
    Scope.ADMIN: {
        "no key": (401, "admin_key_required"),
        "client key": (403, "admin_key_required"),
        "admin key": ADMITTED,
        "wrong key": (403, "admin_key_required"),
    },
    Scope.CLIENT_OR_ADMIN: {
        "no key": (401, "invalid_api_key"),
        "client key": ADMITTED,
        "admin key": ADMITTED,
        "wrong key": (401, "invalid_api_key"),
    },
}
API_ROUTES = tuple(route for route in ROUTES if not route.console)
"""The API listener's rows (the console's are on the admin listener only)."""
OPENING_KEY = {Scope.PUBLIC: None, Scope.CLIENT: CLIENT, Scope.ADMIN: ADMIN, Scope.CLIENT_OR_ADMIN: CLIENT}


def headers(key: str | None) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"} if key else {}


def error_code(route: Route, body: Any) -> str:
    """The refusal's code: an envelope's taxonomy code on a module route, OpenAI's elsewhere."""
    if route.path == EXECUTE_ROUTE:
        assert body["ok"] is False, body
    return str(body["error"]["code"])


async def call(
    session: aiohttp.ClientSession, px: RunningProxy, method: str, sample: Sample, key: str | None
) -> tuple[int, Any, aiohttp.ClientResponse]:
    async with session.request(
        method, px.url + sample.target, json=sample.body, headers=headers(key)
    ) as answer:
        raw = await answer.read()
        return (
            answer.status,
            (await answer.json() if raw and answer.content_type.endswith("json") else raw),
            answer,
        )


def keyed_proxy(fake_upstream: FakeUpstream, tmp_path: Path, **options: Any) -> Any:
    return running_proxy(
        tmp_path,
        upstream_policy(fake_upstream),
        api_keys=frozenset({CLIENT}),
        admin_keys=frozenset({ADMIN}),
        **options,
    )


def test_every_row_has_a_sample_and_its_pinned_scope() -> None:
    assert {route.path: route.scope for route in ROUTES} == {path: s.scope for path, s in SAMPLES.items()}


async def test_every_route_with_every_key(fake_upstream: FakeUpstream, tmp_path: Path) -> None:
    """Every row x {no key, client key, admin key, wrong key} -> the scope's refusal, or the
    row's own answer; GET rows answer HEAD alike."""
    wrong: list[tuple[str, str, int, Any]] = []
    async with keyed_proxy(fake_upstream, tmp_path) as px, aiohttp.ClientSession() as session:
        for route in API_ROUTES:
            sample = SAMPLES[route.path]
            for who, key in KEYS.items():
                expected = REFUSALS[sample.scope][who]
                status, body, _ = await call(session, px, sample.method, sample, key)
                if expected == ADMITTED:
                    if status != sample.admitted:
                        wrong.append((route.path, who, status, body))
                elif route.path == EXECUTE_ROUTE:  # every answer an envelope
                    if (status, error_code(route, body)) != (expected[0], Code.PERMISSION_DENIED):
                        wrong.append((route.path, who, status, body))
                elif (status, error_code(route, body)) != expected:
                    wrong.append((route.path, who, status, body))
            if "GET" in route.methods and route.handler is not passthrough.catch_all:  # the provider's HEAD
                status, body, _ = await call(session, px, "HEAD", sample, OPENING_KEY[sample.scope])
                if (status, body) != (sample.admitted, b""):
                    wrong.append((route.path, "HEAD", status, body))
    assert wrong == []


async def test_a_method_a_row_does_not_list(fake_upstream: FakeUpstream, tmp_path: Path) -> None:
    """A row owning its path answers 405 with ``Allow`` from the table (an envelope on a module
    route); on a path the provider's API shares, the method is the passthrough's, under client auth."""
    async with keyed_proxy(fake_upstream, tmp_path) as px, aiohttp.ClientSession() as session:
        for route in API_ROUTES:
            method = next(m for m in ("DELETE", "TRACE") if not route.takes(m))  # TRACE: the passthrough's
            sample = SAMPLES[route.path]
            fake_upstream.reset()
            status, body, answer = await call(session, px, method, sample, OPENING_KEY[sample.scope])
            if route.shares_path:
                key_opens = route.scope is not Scope.ADMIN  # the admin key is no client key
                assert status == (404 if key_opens else 401), (route.path, body)
                assert [r.method for r in fake_upstream.requests] == ([method] if key_opens else [])
            else:
                assert status == 405, (route.path, body)
                assert answer.headers["Allow"] == route.allow_header
                refused = Code.UNSUPPORTED_VALUE if route.path == EXECUTE_ROUTE else "method_not_allowed"
                assert error_code(route, body) == refused, (route.path, body)
                assert fake_upstream.requests == []
    allow = {route.path: route.allow_header for route in ROUTES}
    assert allow["/v1/modules"] == "GET, HEAD" and allow[EXECUTE_ROUTE] == "POST"


async def test_a_new_admin_row_is_closed_to_a_client_key_without_handler_code(
    fake_upstream: FakeUpstream, tmp_path: Path
) -> None:
    async def secret(request: web.Request) -> web.Response:  # checks no key
        return web.json_response({"secret": True})

    extra = Route("/v1/secret", ("GET",), Scope.ADMIN, secret)
    table = (*ROUTES[:-1], extra, ROUTES[-1])
    async with keyed_proxy(fake_upstream, tmp_path, table=table) as px, aiohttp.ClientSession() as session:
        sample = Sample(Scope.ADMIN, "GET", "/v1/secret", 200)
        assert (await call(session, px, "GET", sample, None))[0] == 401
        assert (await call(session, px, "GET", sample, CLIENT))[0] == 403
        assert (await call(session, px, "GET", sample, ADMIN))[:2] == (200, {"secret": True})
        assert (await call(session, px, "PUT", sample, CLIENT))[0] == 403  # the scope first
        status, _, answer = await call(session, px, "PUT", sample, ADMIN)
        assert (status, answer.headers["Allow"]) == (405, "GET, HEAD")
    assert fake_upstream.requests == []


async def test_the_scope_follows_the_matched_route_not_the_spelling(
    fake_upstream: FakeUpstream, tmp_path: Path
) -> None:
    """The edge looks a request's row up by the resource the router matched: whatever spelling
    reaches a handler is checked against that handler's row."""
    cases = [
        # (target, key, status): the router decodes unreserved characters, so these are the rows
        ("/v1/%75sage?client=nobody", CLIENT, 403),
        ("/v1/%75sage?client=nobody", ADMIN, 404),
        ("/%68ealthz", None, 200),
        # a trailing slash, an encoded slash, an empty segment: the passthrough's row (client keys)
        ("/v1/usage/?client=nobody", ADMIN, 401),
        ("/v1/usage%2F?client=nobody", ADMIN, 401),
        ("/v1//usage?client=nobody", ADMIN, 401),
        ("/v1/feedback/", ADMIN, 401),
        ("/v1/usage/", None, 401),
        # and with a client key, the passthrough refuses what is no provider path
        ("/v1/usage%2F", CLIENT, 400),
        ("/v1//usage", CLIENT, 400),
        ("/v1/modules/", CLIENT, 400),  # the proxy's own route in another spelling
        # not origin-form: refused before any route
        ("//v1/usage", ADMIN, 400),
        # unmatched paths are held to client auth
        ("/healthz/", None, 401),
        ("/healthz/", CLIENT, 404),
    ]
    async with keyed_proxy(fake_upstream, tmp_path) as px, aiohttp.ClientSession() as session:
        got = []
        for target, key, _ in cases:
            url = URL(px.url + target, encoded=True)
            async with session.get(url, headers=headers(key)) as answer:
                got.append((target, key, answer.status))
    assert got == cases
    assert fake_upstream.requests == []


async def test_without_keys_client_routes_are_open_and_the_admin_route_closed(
    fake_upstream: FakeUpstream, tmp_path: Path
) -> None:
    async with (
        running_proxy(tmp_path, upstream_policy(fake_upstream)) as px,
        aiohttp.ClientSession() as session,
    ):
        for route in API_ROUTES:
            sample = SAMPLES[route.path]
            status, body, _ = await call(session, px, sample.method, sample, None)
            if route.scope is Scope.ADMIN:
                assert (status, body["error"]["code"]) == (401, "admin_key_required")
                bearer = await call(session, px, sample.method, sample, "anything")
                assert (bearer[0], bearer[1]["error"]["code"]) == (403, "admin_key_required")
            else:
                assert status == sample.admitted, (route.path, body)


async def test_another_method_on_the_admin_route_is_no_way_past_client_auth(
    fake_upstream: FakeUpstream, tmp_path: Path
) -> None:
    """``POST /v1/usage`` is the passthrough's (the admin row is GET): it needs a client key like
    every passthrough path, and never reaches the provider without one (it did before the table)."""
    async with keyed_proxy(fake_upstream, tmp_path) as px, aiohttp.ClientSession() as session:
        for method in ("POST", "PUT", "DELETE"):
            async with session.request(method, px.url + "/v1/usage") as answer:
                assert answer.status == 401, method
                assert (await answer.json())["error"]["code"] == "invalid_api_key"
    assert fake_upstream.requests == []


async def test_the_probe_rows_log_quietly(proxy: RunningProxy) -> None:
    """A probe row's request line is a debug line (polled every few seconds); others are info."""
    async with aiohttp.ClientSession() as session:
        with capture_logs() as logs:
            for route in PROBE_ROUTES:
                assert (await session.get(proxy.url + route.path)).status == 200
            assert (await session.get(proxy.url + "/v1/models")).status == 200
    lines = [line["log_level"] for line in logs if line["event"] == "proxy.request"]
    assert lines.count("info") == 1 and lines[-1] == "info", lines
