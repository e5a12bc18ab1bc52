"""The route table: every path the proxy serves, its methods, which keys open it (``Scope``) and
its handler. ``build_app`` registers it, the edge enforces scope and methods from it
(``proxy.api.access``), the probe listener serves its ``probe`` rows, and ``/openapi.json``
documents each operation's security from it: a new route is one row, and no handler checks a key.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from aiohttp import hdrs, web

from proxy.api import chat, execute, feedback, limits, meta, modules, openapi, passthrough, responses
from proxy.api.access import ANY_METHOD, ROUTE_INDEX, Route, Scope, check_method
from proxy.api.console import guard as console_guard
from proxy.api.console import views as console
from proxy.api.errors import Handler
from proxy.api.middleware import expect_continue, expect_on_probes
from proxy.api.refusals import EXECUTE_ROUTE

GET, POST = hdrs.METH_GET, hdrs.METH_POST
PROVIDER_METHODS = (GET, POST, hdrs.METH_PUT, hdrs.METH_PATCH, hdrs.METH_DELETE, hdrs.METH_OPTIONS)
"""What a provider API takes (GET brings HEAD). Others, TRACE above all (an upstream reflecting it
would hand the client the injected provider key), never leave the proxy: 405."""

ROUTES: tuple[Route, ...] = (
    Route("/v1/chat/completions", (POST,), Scope.CLIENT, chat.chat_completions, shares_path=True),
    Route("/v1/models", (GET,), Scope.CLIENT, meta.list_models, shares_path=True),
    Route("/v1/models/{model:.+}", (GET,), Scope.CLIENT, meta.retrieve_model, shares_path=True),
    Route(EXECUTE_ROUTE, (POST,), Scope.CLIENT, execute.execute),
    Route("/v1/modules", (GET,), Scope.CLIENT, modules.list_modules),
    Route("/v1/modules/{name}", (GET,), Scope.CLIENT, modules.get_module),
    Route("/v1/feedback", (POST,), Scope.CLIENT_OR_ADMIN, feedback.post_feedback),
    Route("/v1/capabilities", (GET,), Scope.CLIENT, meta.capabilities),
    Route("/healthz", (GET,), Scope.PUBLIC, meta.healthz, probe=True),
    Route("/readyz", (GET,), Scope.PUBLIC, meta.readyz, probe=True),
    Route("/metrics", (GET,), Scope.PUBLIC, meta.metrics, probe=True),
    Route("/openapi.json", (GET,), Scope.CLIENT, openapi.openapi),
    Route("/v1/responses", (POST,), Scope.CLIENT, responses.create_response, shares_path=True),
    Route("/v1/usage", (GET,), Scope.ADMIN, limits.usage, shares_path=True),
    # The review console (docs/review-console.md): the admin listener only.
    Route("/review/login", (GET,), Scope.PUBLIC, console.login_form, console=True),
    Route("/review/session", (POST,), Scope.PUBLIC, console.login, console=True),
    Route("/review/logout", (POST,), Scope.CONSOLE, console.logout, console=True),
    Route("/review/", (GET,), Scope.CONSOLE, console.queue_page, console=True),
    Route("/review/items/{client}/{trace_id}", (GET,), Scope.CONSOLE, console.item_page, console=True),
    Route("/review/items/{client}/{trace_id}/verdict", (POST,), Scope.CONSOLE, console.judge, console=True),
    Route(
        "/review/items/{client}/{trace_id}/override", (POST,), Scope.CONSOLE, console.override, console=True
    ),
    Route("/review/reliability", (GET,), Scope.CONSOLE, console.reliability_page, console=True),
    Route("/review/static/{name}", (GET,), Scope.PUBLIC, console.static, console=True),
    # Last: every other /v1/* path is reverse-proxied (embeddings, files, audio, images, ...).
    # [\s\S]: a path holding an encoded CR/LF is refused by the passthrough (400), not unrouted.
    Route(r"/v1/{tail:[\s\S]*}", PROVIDER_METHODS, Scope.CLIENT, passthrough.catch_all),
)
"""In matching order: the router tries the rows top down."""

PROBE_ROUTES: tuple[Route, ...] = tuple(route for route in ROUTES if route.probe)
"""Everything the probe listener serves: probes and Prometheus, never the keyed LLM API."""
CONSOLE_ROUTES: tuple[Route, ...] = tuple(route for route in ROUTES if route.console)
"""The review console, on the admin listener beside the probes when ``--admin-keys`` opens it."""


def register(app: web.Application, routes: Iterable[Route]) -> None:
    """Add ``routes`` to ``app``'s router, in order, and index them for the edge. A row that owns
    its path takes every method at the router (the edge answers the ones it does not list with
    405); a row sharing its path with the passthrough takes only its own methods."""
    index: dict[web.AbstractResource, Route] = {}
    for route in routes:
        if route.console:
            continue  # the admin listener's (register_probes)
        methods = route.methods if route.shares_path else (ANY_METHOD,)
        for method in methods:
            index[_add(app, method, route, expect_handler=expect_continue)] = route
    app.router.add_route(ANY_METHOD, UNMATCHED, not_found, expect_handler=expect_continue)
    app[ROUTE_INDEX] = index


CONSOLE_REST = r"/review{rest:(/.*)?}"
"""With the console, every other path under ``/review``: its 404 is a page."""
UNMATCHED = "/{unmatched:.*}"
"""Last on either listener: every path no row names, a 404 answered after the edge's checks, so an
``Expect`` on it is handled like any other (aiohttp's own handler would echo it, text/plain)."""


async def not_found(request: web.Request) -> web.StreamResponse:
    raise web.HTTPNotFound()


def register_probes(app: web.Application, console: bool = False) -> None:
    """The probe listener's routes: its rows (and the console's when ``console``), which check
    their methods and scope themselves (405 with ``Allow``: the listener has no edge), then the
    404 for every other path."""
    for route in (*PROBE_ROUTES, *(CONSOLE_ROUTES if console else ())):
        app.router.add_route(ANY_METHOD, route.path, _checked(route), expect_handler=expect_on_probes)
    if console:
        app.router.add_route(
            ANY_METHOD, CONSOLE_REST, console_guard.not_found, expect_handler=expect_on_probes
        )
    app.router.add_route(ANY_METHOD, UNMATCHED, not_found, expect_handler=expect_on_probes)


def _checked(route: Route) -> Handler:
    """``route``'s handler behind its method check (405 with ``Allow`` from the row) and, on a
    console row, its session and CSRF check."""

    async def handler(request: web.Request) -> web.StreamResponse:
        check_method(request, route)
        if route.scope is Scope.CONSOLE:
            refused = await console_guard.admit(request)
            if refused is not None:
                return refused
        return await route.handler(request)

    return console_guard.answers_with_pages(handler) if route.console else handler


def _add(app: web.Application, method: str, route: Route, **options: Any) -> web.AbstractResource:
    """One method of ``route`` on ``app``'s router (GET with HEAD, as ``add_get``); its resource."""
    if method == hdrs.METH_GET:
        added = app.router.add_get(route.path, route.handler, **options)
    else:
        added = app.router.add_route(method, route.path, route.handler, **options)
    assert added.resource is not None
    return added.resource
