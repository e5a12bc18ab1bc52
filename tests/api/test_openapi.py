"""``GET /openapi.json``: the proxy's own routes, the shipped envelope schema, client auth."""

from __future__ import annotations

import json
from pathlib import Path

import aiohttp

from proxy.api import passthrough
from proxy.api.access import ANY_METHOD, Scope
from proxy.api.openapi import OPENAPI_VERSION, document
from proxy.api.routes import ROUTES
from proxy.schemas import load
from tests.fake_upstream import FakeUpstream
from tests.proxy_server import RunningProxy, running_proxy, upstream_policy

TEMPLATED = "/v1/modules/{name}/execute"


def own_routes() -> set[tuple[str, str]]:
    """The operations of the route table (the passthrough's catch-all is no operation of the
    proxy's own; the review console's pages are HTML on the admin listener, not the API)."""
    return {
        (method, route.template)
        for route in ROUTES
        if route.handler is not passthrough.catch_all and not route.console
        for method in route.methods
        if method != ANY_METHOD
    }


def test_every_own_route_is_documented_and_nothing_else() -> None:
    documented = {
        (method.upper(), path) for path, item in document([], ROUTES)["paths"].items() for method in item
    }
    proxied = {("POST", "/v1/chat/completions"), ("POST", "/v1/responses")}  # the providers' API
    assert documented == own_routes() - proxied


def test_each_operations_security_is_its_routes_scope() -> None:
    doc = document([], ROUTES)
    default = doc["security"]
    assert default == [{}, {"clientKey": []}]  # no key needed when the proxy runs without --api-keys
    expected = {
        Scope.PUBLIC: [],
        Scope.CLIENT: default,
        Scope.ADMIN: [{"adminKey": []}],
        Scope.CLIENT_OR_ADMIN: [{}, {"clientKey": []}, {"adminKey": []}],
    }
    for route in ROUTES:
        for operation in doc["paths"].get(route.template, {}).values():
            assert operation.get("security", default) == expected[route.scope], route.path
    assert doc["paths"]["/v1/usage"]["get"]["security"] == [{"adminKey": []}]
    assert doc["paths"]["/healthz"]["get"]["security"] == []


def test_the_envelope_components_are_the_shipped_schema() -> None:
    shipped = load("response-envelope.schema.json")
    schemas = document([], ROUTES)["components"]["schemas"]
    as_text = json.dumps(schemas)
    assert "#/definitions/" not in as_text
    for name, definition in shipped["definitions"].items():
        rewritten = json.loads(json.dumps(definition).replace("#/definitions/", "#/components/schemas/"))
        assert schemas[name] == rewritten, name
    assert schemas["Envelope"]["oneOf"] == [
        {"$ref": "#/components/schemas/SuccessEnvelope"},
        {"$ref": "#/components/schemas/FailureEnvelope"},
    ]


async def test_the_served_document_names_the_installed_modules(proxy: RunningProxy) -> None:
    async with aiohttp.ClientSession() as session:
        answer = await session.get(proxy.url + "/openapi.json")
        doc = await answer.json()
        modules = await (await session.get(proxy.base + "/modules")).json()
    assert answer.status == 200 and doc["openapi"] == OPENAPI_VERSION
    names = sorted(m["id"] for m in modules["data"])
    assert doc["paths"][TEMPLATED]["post"]["parameters"][0]["schema"]["anyOf"][0]["enum"] == names
    for module in modules["data"]:
        body = doc["paths"][f"/v1/modules/{module['id']}/execute"]["post"]["requestBody"]
        assert body["content"]["application/json"]["schema"]["properties"]["input"] == module["input_schema"]
    statuses = set(doc["paths"][TEMPLATED]["post"]["responses"])
    assert {"200", "400", "404", "429", "500", "502", "503"} <= statuses


async def test_the_document_needs_a_client_key_when_keys_are_set(
    fake_upstream: FakeUpstream, tmp_path: Path
) -> None:
    async with (
        running_proxy(tmp_path, upstream_policy(fake_upstream), api_keys=frozenset({"sk-team"})) as px,
        aiohttp.ClientSession() as session,
    ):
        refused = await session.get(px.url + "/openapi.json")
        allowed = await session.get(px.url + "/openapi.json", headers={"Authorization": "Bearer sk-team"})
        assert refused.status == 401 and (await refused.json())["error"]["type"] == "authentication_error"
        assert allowed.status == 200 and "paths" in await allowed.json()
