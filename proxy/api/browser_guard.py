"""Browsers cannot use a keyless proxy on loopback: refuse foreign ``Host`` and ``Origin``.

A proxy bound to loopback without client keys trusts whoever can reach the port. A web page
can reach it too: by a cross-site "simple" request (``text/plain`` POST, no preflight) or by
DNS rebinding (its own name resolving to 127.0.0.1). Both are told apart by headers the
browser sets and the page cannot: ``Host`` (the page's name under rebinding) and ``Origin``.
As local development servers do, the guard serves only loopback names (any port) plus
``--allowed-hosts``, and a present ``Origin`` only when listed in ``--allowed-origins``.

It applies only when the listen address is loopback and no client keys are configured: with
keys, a browser has no key to send; on other binds (a pod), Host is the pod IP or a Service
name and the network is the boundary.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping
from functools import lru_cache

from aiohttp import web

from proxy.api.app_keys import SETTINGS
from proxy.api.errors import ApiError
from proxy.settings import Settings

LOOPBACK_NAMES = frozenset({"localhost", "127.0.0.1", "[::1]"})
BROWSER_GUARD = web.AppKey("browser_guard", bool)
"""Whether the app checks requests with ``check_browser`` (``guards_browsers`` of its settings)."""


def guards_browsers(settings: Settings) -> bool:
    """Whether the guard applies: a loopback bind without client keys."""
    return is_loopback(settings.host) and not settings.api_keys


def is_loopback(host: str) -> bool:
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


@lru_cache(maxsize=256)  # one Host per client, on every request: ~0.4 k instructions, not ~3 k
def host_name(value: str) -> str:
    """``Host`` without its port, lower-cased: ``[::1]:8080`` -> ``[::1]``."""
    value = value.strip().lower()
    if value.startswith("["):
        return value.partition("]")[0] + "]"
    return value.partition(":")[0]


def check_browser(request: web.Request) -> None:
    """``check_headers`` of the request (checked only when ``guards_browsers``)."""
    check_headers(request.app[SETTINGS], request.headers)


def check_headers(settings: Settings, headers: Mapping[str, str]) -> None:
    """403 for a ``Host`` that is not a loopback or allowed name, and for an ``Origin`` that
    is present and not allowed."""
    host = host_name(headers.get("Host", "localhost"))
    if host not in LOOPBACK_NAMES and host not in settings.allowed_hosts:
        raise ApiError(
            403,
            f"Host {host!r} is not allowed: this keyless proxy on loopback serves only localhost "
            "names and --allowed-hosts",
            "permission_error",
            "host_not_allowed",
        )
    origin = headers.get("Origin")
    if origin is not None and origin.strip().lower() not in settings.allowed_origins:
        raise ApiError(
            403,
            f"Origin {origin!r} is not allowed: a keyless proxy on loopback serves browser pages "
            "only from --allowed-origins",
            "permission_error",
            "origin_not_allowed",
        )
