"""The request-target decisions of ``proxy.api.target``, in-process.

``tests/security/test_passthrough.py`` sends these targets to a ``cogproxy serve`` subprocess; this
file pins the same decisions on the functions themselves, where mutation testing can see them.
"""

from __future__ import annotations

import re

import pytest
from aiohttp.test_utils import make_mocked_request

from proxy.api.errors import ApiError
from proxy.api.routes import ROUTES
from proxy.api.target import (
    ClientTarget,
    check_target_form,
    origin_form,
    own_route_named,
    parse_target,
    upstream_url,
)

NOT_ORIGIN_FORM = "only origin-form targets (/v1/...) are accepted, never a scheme or host"
PCHAR = "the path holds a character outside RFC 3986 pchar"
MALFORMED = "malformed percent-encoding in the path"
SEPARATOR = "an encoded separator or control character in the path"
NOT_UTF8 = "a percent-encoding in the path that is not UTF-8"
QUERY = "the query holds a character outside RFC 3986 or a malformed percent-encoding"
UNDER_V1 = "the path must stay under /v1/"
EMPTY = "empty path segments (//)"
DOTS = "dot segments (. or ..) in the path"


def refusal(raw: str) -> ApiError:
    with pytest.raises(ApiError) as caught:
        parse_target(raw)
    error = caught.value
    assert (error.status, error.type, error.code) == (400, "invalid_request_error", "invalid_request_target")
    return error


@pytest.mark.parametrize(
    ("raw", "path", "query"),
    [
        ("/v1/files", "/v1/files", ""),
        ("/v1/files?", "/v1/files", ""),
        ("/v1/files?purpose=batch&after=a%2Fb/c?d", "/v1/files", "purpose=batch&after=a%2Fb/c?d"),
        ("/v1/files/", "/v1/files/", ""),
        ("/v1/", "/v1/", ""),
        ("/v1/files/%7euser%2D1", "/v1/files/~user-1", ""),  # unreserved characters are decoded
        ("/v1/files/caf%c3%a9", "/v1/files/caf%C3%A9", ""),  # others are kept, upper-cased
        ("/v1/files/a%20b", "/v1/files/a%20b", ""),  # 0x20 is past the controls
        ("/v1/files/a:b@c!$&'()*+,=;x", "/v1/files/a:b@c!$&'()*+,=;x", ""),
        ("/v1/files/..x/.x;y", "/v1/files/..x/.x;y", ""),  # look like dot segments, are not
        ("/v1/chat/completions", "/v1/chat/completions", ""),  # exactly the own route: GET goes on
        ("/v1/files/%41%42%43", "/v1/files/ABC", ""),
    ],
)
def test_accepted_targets_are_normalised(raw: str, path: str, query: str) -> None:
    assert parse_target(raw) == ClientTarget(path, query)


@pytest.mark.parametrize(
    ("raw", "reason"),
    [
        ("http://evil.example/v1/files", NOT_ORIGIN_FORM),
        ("//evil.example/v1/files", NOT_ORIGIN_FORM),
        ("evil.example:443", NOT_ORIGIN_FORM),
        ("", NOT_ORIGIN_FORM),
        ("/v1/files?a b", QUERY),
        ("/v1/files?a=%zz", QUERY),
        ("/v1/files?a=%4", QUERY),
        ("/v1/files?a=\\", QUERY),
        ("/v1/a b", PCHAR),
        ("/v1/a\\b", PCHAR),
        ("/v1/caf\u00e9", PCHAR),
        ("/v1/a b%41", PCHAR),  # before a percent-encoding
        ("/v1/%41a b", PCHAR),  # after one
        ("/v1/%zz", MALFORMED),
        ("/v1/%4", MALFORMED),
        ("/v1/a%", MALFORMED),
        ("/v1/a%2Fb", SEPARATOR),
        ("/v1/a%2fb", SEPARATOR),
        ("/v1/a%5Cb", SEPARATOR),
        ("/v1/a%00b", SEPARATOR),
        ("/v1/a%1Fb", SEPARATOR),
        ("/v1/a%7Fb", SEPARATOR),
        ("/v1/%C0%AE", NOT_UTF8),
        ("/v1/%FF", NOT_UTF8),
        ("/", UNDER_V1),
        ("/v1", UNDER_V1),
        ("/v2/files", UNDER_V1),
        ("/files/v1", UNDER_V1),
        ("/v1//files", EMPTY),
        ("/v1/files//", EMPTY),
        ("/v1/files//x/", EMPTY),
        ("/v1/./files", DOTS),
        ("/v1/../files", DOTS),
        ("/v1/files/..", DOTS),
        ("/v1/x/../chat/completions", DOTS),
        ("/v1/%2e%2e/files", DOTS),
        ("/v1/%2E/files", DOTS),
        ("/v1/..;x/files", DOTS),
        ("/v1/..;a;b/files", DOTS),
        ("/v1/.;a;b/files", DOTS),
    ],
)
def test_refused_targets_name_the_rule_they_break(raw: str, reason: str) -> None:
    assert refusal(raw).message == f"Request target refused: {reason}"


@pytest.mark.parametrize(
    ("raw", "path", "own"),
    [
        ("/v1/chat/completions/", "/v1/chat/completions/", "/v1/chat/completions"),
        ("/v1/chat/completions;a;b", "/v1/chat/completions;a;b", "/v1/chat/completions"),
        ("/v1/Chat/completions;x", "/v1/Chat/completions;x", "/v1/chat/completions"),
        ("/v1/chat/co%6Dpletions;a", "/v1/chat/completions;a", "/v1/chat/completions"),
        ("/v1/responses/", "/v1/responses/", "/v1/responses"),
        ("/v1/modules;x", "/v1/modules;x", "/v1/modules"),
        ("/v1/modules/triage/", "/v1/modules/triage/", "/v1/modules/triage"),
        ("/v1/modules/triage/EXECUTE", "/v1/modules/triage/EXECUTE", "/v1/modules/triage/execute"),
        ("/v1/capabilities;v=2", "/v1/capabilities;v=2", "/v1/capabilities"),
    ],
)
def test_other_spellings_of_the_own_routes_are_refused(raw: str, path: str, own: str) -> None:
    """The message names the normalised path and the route it reaches on a lenient server."""
    message = f"Request target refused: {path} names the proxy's own route {own}: send exactly {own}"
    assert refusal(raw).message == message


@pytest.mark.parametrize(
    ("path", "own"),
    [
        ("/v1/chat/completions;a;b", "/v1/chat/completions"),
        ("/v1/chat/completions/", "/v1/chat/completions"),
        ("/v1/chat/completions;a/", "/v1/chat/completions"),
        ("/v1/CHAT/Completions", "/v1/chat/completions"),
        ("/v1/responses;x", "/v1/responses"),
        ("/v1/modules/", "/v1/modules"),
        ("/v1/modules/M1", "/v1/modules/m1"),
        ("/v1/modules/m1;x/execute", "/v1/modules/m1/execute"),
        ("/v1/modules/m1/execute/", "/v1/modules/m1/execute"),
        ("/v1/capabilities/", "/v1/capabilities"),
        # written exactly: the own route itself (its other methods belong to the provider)
        ("/v1/chat/completions", None),
        ("/v1/responses", None),
        ("/v1/modules", None),
        ("/v1/modules/m1", None),
        ("/v1/modules/m1/execute", None),
        ("/v1/capabilities", None),
        # not an own route at all
        ("/v1", None),
        ("/v1/", None),
        ("/v1/chat", None),
        ("/v1/chat/other", None),
        ("/v1/completions/chat", None),
        ("/v1/chat/completions/extra", None),
        ("/v1/modules/m1/run", None),
        ("/v1/modules/m1/execute/more", None),
        ("/v1/files", None),
        ("/v1/chat;completions", None),
    ],
)
def test_own_route_named_reads_parameters_case_and_a_trailing_slash(path: str, own: str | None) -> None:
    assert own_route_named(path) == own


@pytest.mark.parametrize(
    ("base", "raw", "url"),
    [
        ("https://api.example.com/v1", "/v1/files", "https://api.example.com/v1/files"),
        ("https://api.example.com/v1/", "/v1/files", "https://api.example.com/v1/files"),
        ("https://api.example.com", "/v1/files", "https://api.example.com/v1/files"),
        ("https://api.example.com/", "/v1/files?limit=2", "https://api.example.com/v1/files?limit=2"),
        (
            "http://127.0.0.1:8081/openai/v1",
            "/v1/files/x?a=%2F",
            "http://127.0.0.1:8081/openai/v1/files/x?a=%2F",
        ),
        ("http://gw.example/v1x", "/v1/files", "http://gw.example/v1x/v1/files"),
        ("http://gw.example/X", "/v1/files", "http://gw.example/X/v1/files"),
        ("http://gw.example/api/v1//", "/v1/files", "http://gw.example/api/v1/files"),
    ],
)
def test_upstream_url_is_the_base_with_the_validated_path_and_query(base: str, raw: str, url: str) -> None:
    assert str(upstream_url(base, parse_target(raw))) == url


def test_upstream_url_takes_scheme_host_and_port_from_the_base_only() -> None:
    """A path that is not origin-form (never produced by ``parse_target``) still lands in the path."""
    url = upstream_url("http://api.example.com:8443/v1", ClientTarget("@evil.example:1/v1/files", ""))
    assert (url.scheme, url.host, url.port) == ("http", "api.example.com", 8443)


@pytest.mark.parametrize(
    ("raw", "origin"),
    [
        ("/", True),
        ("/v1/files?x=//y", True),
        ("//host/v1", False),
        ("http://host/v1", False),
        ("host:443", False),
        ("", False),
        ("*", False),
    ],
)
def test_origin_form(raw: str, origin: bool) -> None:
    assert origin_form(raw) is origin


def test_check_target_form_passes_origin_form_requests() -> None:
    check_target_form(make_mocked_request("GET", "/v1/anything?x=1"))  # no ApiError


@pytest.mark.parametrize("raw", ["http://evil.example/v1/files", "//evil.example/v1/files"])
def test_check_target_form_refuses_absolute_form_everywhere(raw: str) -> None:
    with pytest.raises(ApiError) as caught:
        check_target_form(make_mocked_request("GET", raw))
    assert (caught.value.status, caught.value.code) == (400, "invalid_request_target")
    assert caught.value.message == f"Request target refused: {NOT_ORIGIN_FORM}"


PROVIDER_LISTED = frozenset({"/v1/models", "/v1/models/{model:.+}"})
"""Rows whose other spellings may reach the provider: its own model listing, harmless there."""


def test_every_own_v1_route_of_the_table_is_guarded_in_its_other_spellings() -> None:
    """``OWN_ROUTES`` names every ``/v1/`` row of the route table but the passthrough and the
    provider's model listing: a client-keyed ``/v1/feedback/`` never reaches the provider."""
    rows = [
        r.path
        for r in ROUTES
        if r.path.startswith("/v1/") and "{tail" not in r.path and r.path not in PROVIDER_LISTED
    ]
    assert "/v1/feedback" in rows and "/v1/usage" in rows
    for template in rows:
        path = re.sub(r"\{[^}]+\}", "x", template)
        assert own_route_named(path + "/") == path, template
        assert own_route_named(path.upper().replace("/V1/", "/v1/")) == path, template
