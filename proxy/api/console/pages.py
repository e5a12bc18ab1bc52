"""How the console answers: pages from autoescaped Jinja2 templates, with headers that keep a
page from running anything but the console's own script, and the audit of every action."""

from __future__ import annotations

import time
from typing import Any
from urllib.parse import quote

import jinja2
import structlog
from aiohttp import web

from proxy.api.app_keys import METRICS
from proxy.api.console.session import ConsoleSession
from proxy.state.review_queue import PendingReview

log = structlog.get_logger("proxy.review_console")

BASE = "/review/"
LOGIN = BASE + "login"
COOKIE_PATH = "/review"

SECURITY_HEADERS = {
    # Only the console's own files run or style a page: a payload that became markup would still
    # find no inline script, handler attribute, javascript: URL or foreign origin allowed.
    "Content-Security-Policy": (
        "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; "
        "form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
    ),
    "X-Frame-Options": "DENY",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
}

TEMPLATES = web.AppKey("console_templates", jinja2.Environment)
SESSION = web.RequestKey("console_session", ConsoleSession)
"""Set by the route's check (``proxy.api.console.guard``) on every ``Scope.CONSOLE`` request."""


def environment() -> jinja2.Environment:
    """The templates shipped in the package, every value escaped unless marked safe (none is)."""
    env = jinja2.Environment(
        loader=jinja2.PackageLoader("proxy.api.console", "templates"),
        autoescape=True,
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.globals["href"] = item_href
    return env


def item_href(item: PendingReview, action: str = "") -> str:
    """The console path of ``item`` (``action``: verdict, override); a stream item names its entry."""
    path = f"{BASE}items/{quote(item.client, safe='')}/{quote(item.trace_id, safe='')}"
    path += f"/{action}" if action else ""
    return path + (f"?entry={quote(item.entry, safe='')}" if item.entry else "")


def page(request: web.Request, template: str, status: int = 200, **context: Any) -> web.Response:
    session = request.get(SESSION)
    body = (
        request.app[TEMPLATES]
        .get_template(template)
        .render(
            admin=session.admin if session else None,
            csrf=session.csrf if session else "",
            base=BASE,
            **context,
        )
    )
    return web.Response(
        text=body, status=status, content_type="text/html", charset="utf-8", headers=SECURITY_HEADERS
    )


def see_other(location: str) -> web.Response:
    """303 to ``location`` (a console path): after a form, or to the login form."""
    return web.Response(status=303, headers={**SECURITY_HEADERS, "Location": location})


def audit(request: web.Request, action: str, result: str, **fields: Any) -> None:
    """One log line and one count per console action: who (the admin key's id), when, what."""
    session = request.get(SESSION)
    request.app[METRICS].review_console.labels(action, result).inc()
    log.info(
        "proxy.review_console",
        action=action,
        result=result,
        admin=session.admin if session else fields.pop("admin", None),
        at=time.time(),
        **fields,
    )
