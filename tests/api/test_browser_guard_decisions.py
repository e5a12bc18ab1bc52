"""The browser guard's decisions (``proxy.api.browser_guard``), in-process.

``tests/security/test_browser_guard.py`` drives the guard through a ``cogproxy serve`` subprocess;
this file pins when it applies and what it refuses on the functions themselves.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from aiohttp import web
from aiohttp.test_utils import make_mocked_request
from multidict import CIMultiDict

from proxy.api.app_keys import SETTINGS
from proxy.api.browser_guard import check_browser, check_headers, guards_browsers, host_name, is_loopback
from proxy.api.errors import ApiError
from proxy.settings import Settings


def settings(
    host: str = "127.0.0.1",
    *,
    api_keys: frozenset[str] = frozenset(),
    allowed_hosts: frozenset[str] = frozenset(),
    allowed_origins: frozenset[str] = frozenset(),
) -> Settings:
    return Settings(
        policy_path=Path("policy.yaml"),
        module_dirs=(),
        host=host,
        api_keys=api_keys,
        allowed_hosts=allowed_hosts,
        allowed_origins=allowed_origins,
    )


@pytest.mark.parametrize(
    ("bind", "keys", "guarded"),
    [
        ("127.0.0.1", frozenset(), True),
        ("127.8.9.10", frozenset(), True),
        ("localhost", frozenset(), True),
        ("LocalHost", frozenset(), True),
        ("::1", frozenset(), True),
        ("[::1]", frozenset(), True),
        ("localhost", frozenset({"sk-client"}), False),  # a browser has no key to send
        ("[::1]", frozenset({"sk-client"}), False),
        ("127.0.0.1", frozenset({"sk-client"}), False),
        ("0.0.0.0", frozenset(), False),  # a pod: the network is the boundary
        ("::", frozenset(), False),
        ("10.0.0.7", frozenset(), False),
        ("proxy.internal", frozenset(), False),
        ("localhost.example", frozenset(), False),
    ],
)
def test_the_guard_applies_to_a_keyless_loopback_bind(bind: str, keys: frozenset[str], guarded: bool) -> None:
    assert guards_browsers(settings(bind, api_keys=keys)) is guarded


@pytest.mark.parametrize(
    ("host", "loopback"),
    [
        ("localhost", True),
        ("LOCALHOST", True),
        ("127.0.0.1", True),
        ("127.255.0.1", True),
        ("::1", True),
        ("[::1]", True),
        ("0:0:0:0:0:0:0:1", True),
        ("::ffff:10.0.0.1", False),
        ("128.0.0.1", False),
        ("0.0.0.0", False),
        ("", False),
        ("local", False),
        ("localhost.", False),
        ("[::1", True),  # brackets are stripped, not parsed
        ("X127.0.0.1", False),
    ],
)
def test_is_loopback(host: str, loopback: bool) -> None:
    assert is_loopback(host) is loopback


@pytest.mark.parametrize(
    ("header", "name"),
    [
        ("localhost:8080", "localhost"),
        ("LocalHost", "localhost"),
        (" 127.0.0.1:80 ", "127.0.0.1"),
        ("[::1]:8080", "[::1]"),
        ("[::1]", "[::1]"),
        ("[::1]:80]", "[::1]"),  # up to the first bracket
        ("[::1%lo]:1", "[::1%lo]"),
        ("Evil.Example:443", "evil.example"),
        ("evil.example", "evil.example"),
        ("", ""),
    ],
)
def test_host_name_drops_the_port_and_case(header: str, name: str) -> None:
    assert host_name(header) == name


def refused(config: Settings, **headers: str) -> ApiError:
    with pytest.raises(ApiError) as caught:
        check_headers(config, CIMultiDict(headers))
    assert (caught.value.status, caught.value.type) == (403, "permission_error")
    return caught.value


@pytest.mark.parametrize(
    "headers",
    [
        {},  # no Host: HTTP/1.0 from a local tool, not a browser
        {"Host": "localhost:8080"},
        {"Host": "LOCALHOST"},
        {"Host": "127.0.0.1:8080"},
        {"Host": "[::1]:8080"},
        {"host": "[::1]"},
    ],
)
def test_loopback_names_without_an_origin_are_served(headers: dict[str, str]) -> None:
    check_headers(settings(), CIMultiDict(headers))  # served: no ApiError


@pytest.mark.parametrize(
    "host", ["evil.example", "evil.example:8080", "127.0.0.2", "[::2]:80", "localhost.evil"]
)
def test_a_foreign_host_is_refused(host: str) -> None:
    """DNS rebinding: the page's own name in ``Host``."""
    error = refused(settings(), Host=host)
    assert error.code == "host_not_allowed"
    name = host_name(host)
    assert error.message == (
        f"Host {name!r} is not allowed: this keyless proxy on loopback serves only localhost names "
        "and --allowed-hosts"
    )


def test_allowed_hosts_are_served_besides_loopback_names() -> None:
    config = settings(allowed_hosts=frozenset({"dev.example"}))
    check_headers(config, CIMultiDict(Host="Dev.Example:3000"))  # served: no ApiError
    check_headers(config, CIMultiDict(Host="localhost"))  # served: no ApiError
    assert refused(config, Host="other.example").code == "host_not_allowed"


@pytest.mark.parametrize("origin", ["https://evil.example", "null", "http://localhost:3000", ""])
def test_an_origin_not_listed_is_refused(origin: str) -> None:
    """A cross-site simple request: a loopback Host, but the page's Origin."""
    error = refused(settings(), Host="localhost", Origin=origin)
    assert error.code == "origin_not_allowed"
    assert error.message == (
        f"Origin {origin!r} is not allowed: a keyless proxy on loopback serves browser pages only from "
        "--allowed-origins"
    )


@pytest.mark.parametrize("origin", ["http://localhost:3000", " HTTP://LocalHost:3000 "])
def test_a_listed_origin_is_served_whatever_its_case_and_spaces(origin: str) -> None:
    config = settings(allowed_origins=frozenset({"http://localhost:3000"}))
    check_headers(config, CIMultiDict(Host="127.0.0.1", Origin=origin))  # served: no ApiError


def test_the_host_is_checked_before_the_origin() -> None:
    config = settings(allowed_origins=frozenset({"http://localhost:3000"}))
    assert refused(config, Host="evil.example", Origin="http://localhost:3000").code == "host_not_allowed"


@pytest.mark.parametrize("bind", ["localhost", "[::1]"])
def test_check_browser_reads_the_request_headers_and_the_app_settings(bind: str) -> None:
    app = web.Application()
    app[SETTINGS] = settings(bind, allowed_hosts=frozenset({"dev.example"}))
    check_browser(make_mocked_request("GET", "/v1/models", headers={"Host": "dev.example"}, app=app))
    headers = {"Host": "[::1]", "Origin": "https://evil.example"}
    request = make_mocked_request("GET", "/v1/models", headers=headers, app=app)
    with pytest.raises(ApiError) as caught:
        check_browser(request)
    assert caught.value.code == "origin_not_allowed"
