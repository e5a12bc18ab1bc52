"""Who may call a route, and with which methods: a route table's row (``Route``) and the edge's
check of it (``admit_route``). The table itself is ``proxy.api.routes``; the edge middleware finds
a request's row by the resource the router matched (one dict lookup), so what a request is
checked against is always what will answer it, whatever spelling its path had."""

from __future__ import annotations

import hmac
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from enum import StrEnum

from aiohttp import hdrs, web

from proxy.api.errors import ApiError, Handler
from proxy.settings import Settings


class Scope(StrEnum):
    """Which keys open a route (``--api-keys``: client keys; ``--admin-keys``: admin keys)."""

    PUBLIC = "public"
    """No key: probes and Prometheus."""
    CLIENT = "client"
    """A client key when client keys are configured; open without them."""
    ADMIN = "admin"
    """An admin key, always (closed when no admin key is configured); a client key is refused."""
    CLIENT_OR_ADMIN = "client-or-admin"
    """As ``CLIENT``, and an admin key too (the handler reads the edge's ``RequestRecord.admin_caller``)."""
    CONSOLE = "console"
    """A review console session: the cookie its login form sets for an admin key; a POST also
    needs the session's CSRF token (``proxy.api.console.guard``). No bearer key opens it."""


_CLIENT, _PUBLIC, _ADMIN, _CLIENT_OR_ADMIN = Scope.CLIENT, Scope.PUBLIC, Scope.ADMIN, Scope.CLIENT_OR_ADMIN
"""For ``check_scope``, on every request: a member read through its enum class (``Scope.PUBLIC``)
costs ~1 k instructions in Python 3.11, a module global ~0.1 k."""

ANY_METHOD = "*"


@dataclass(frozen=True, slots=True)
class Route:
    """One row of the route table."""

    path: str
    """An aiohttp path template (``/v1/modules/{name}``)."""
    methods: tuple[str, ...]
    """What the handler takes; GET brings HEAD; ``("*",)``: every method."""
    scope: Scope
    handler: Handler
    shares_path: bool = False
    """The provider's API has other methods on this path (``GET /v1/chat/completions`` lists stored
    completions): they reach the ``/v1/*`` passthrough. Otherwise the edge answers them 405."""
    probe: bool = False
    """Also served on the probe listener (``--admin-port``)."""
    console: bool = False
    """Served on the admin listener only (``--admin-port``, when ``--admin-keys`` opens the review
    console), never on the API's."""
    allowed: frozenset[str] = field(init=False)
    allow_header: str = field(init=False)
    template: str = field(init=False)
    """The path as the router names it (``/v1/models/{model}``): metric labels, OpenAPI paths."""

    def __post_init__(self) -> None:
        methods = (*self.methods, hdrs.METH_HEAD) if hdrs.METH_GET in self.methods else self.methods
        object.__setattr__(self, "allowed", frozenset(methods))
        object.__setattr__(self, "allow_header", ", ".join(dict.fromkeys(methods)))
        template = web.DynamicResource(self.path).canonical if "{" in self.path else self.path
        object.__setattr__(self, "template", template)

    def takes(self, method: str) -> bool:
        return ANY_METHOD in self.allowed or method in self.allowed


ROUTE_INDEX = web.AppKey("route_index", Mapping[web.AbstractResource, Route])
"""Each registered resource's row: what the edge checks a matched request against."""


def route_of_request(request: web.Request) -> Route | None:
    """The request's row; None when the router matched nothing (a 404 or aiohttp's own 405)."""
    resource = request.match_info.route.resource
    return None if resource is None else request.app[ROUTE_INDEX].get(resource)


def _one_of(token: str | None, keys: Collection[str]) -> bool:
    """Whether ``token`` is one of ``keys``, compared in constant time."""
    presented = (token or "").encode()
    return token is not None and any(hmac.compare_digest(presented, key.encode()) for key in keys)


def check_scope(request: web.Request, route: Route | None, token: str | None, settings: Settings) -> bool:
    """Refuse a request whose key does not open ``route`` (401/403); whether an admin key opened
    it. An unmatched request is held to ``CLIENT`` (a 404 is not told to a caller without a key)."""
    scope = route.scope if route is not None else _CLIENT
    if scope is _PUBLIC:
        return False
    if scope is _ADMIN:
        if not _one_of(token, settings.admin_keys):
            assert route is not None
            raise ApiError(
                401 if not token else 403,
                f"{request.method} {route.path} needs an admin key (--admin-keys), not a client key",
                "authentication_error" if not token else "permission_error",
                "admin_key_required",
            )
        return True
    admin = scope is _CLIENT_OR_ADMIN and _one_of(token, settings.admin_keys)
    if settings.api_keys and not admin and not _one_of(token, settings.api_keys):
        raise ApiError(
            401,
            "Missing or invalid API key for this proxy (Authorization: Bearer ...)",
            "authentication_error",
            "invalid_api_key",
        )
    return admin


def check_method(request: web.Request, route: Route | None) -> None:
    """405 with ``Allow`` for a method the request's row does not list."""
    if route is not None and not route.takes(request.method):
        raise ApiError(
            405,
            f"{request.method} is not allowed on {request.path}; use {route.allow_header}",
            code="method_not_allowed",
            headers={"Allow": route.allow_header},
        )
