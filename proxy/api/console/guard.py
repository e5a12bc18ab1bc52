"""The check of a ``Scope.CONSOLE`` row, made by the route (``proxy.api.routes``), never by a
handler: a live session cookie, and on a POST the session's CSRF token in the form. And how the
console answers a failure: as a page (a browser never shows an OpenAI error object raw)."""

from __future__ import annotations

import time

from aiohttp import hdrs, web

from proxy.api.app_keys import SETTINGS
from proxy.api.console.pages import LOGIN, SESSION, audit, page, see_other
from proxy.api.console.session import CSRF_FIELD, SESSION_COOKIE, read_session
from proxy.api.errors import Handler, api_error_of


async def admit(request: web.Request) -> web.Response | None:
    """None when the request may go on (``SESSION`` set); else the refusal: a page asks for a
    login (303), a form post without a session or with a wrong token is refused (403)."""
    session = read_session(request.cookies.get(SESSION_COOKIE), request.app[SETTINGS].admin_keys, time.time())
    if session is None:
        if request.method in (hdrs.METH_GET, hdrs.METH_HEAD):
            return see_other(LOGIN)
        audit(request, "session", "refused", path=request.path)
        return page(request, "refused.html", 403, reason="Log in first: this form needs a console session.")
    request[SESSION] = session
    if request.method == hdrs.METH_POST:
        form = await request.post()
        if not session.csrf_ok(form.get(CSRF_FIELD)):
            audit(request, "csrf", "refused", path=request.path)
            return page(request, "refused.html", 403, reason="The form's CSRF token is missing or wrong.")
    return None


def error_page(request: web.Request, exc: BaseException) -> web.Response:
    """``exc`` as a page with the status and message the API's error mapping gives it (the 405's
    ``Allow`` kept); re-raises what is not an error (cancellation, a redirect)."""
    error = api_error_of(request, exc)
    response = page(request, "refused.html", error.status, reason=error.message)
    response.headers.update(error.headers)
    return response


def answers_with_pages(handler: Handler) -> Handler:
    """``handler`` whose failures (a method not allowed, a body too large, a bad request, an
    unexpected error) are answered as pages."""

    async def answered(request: web.Request) -> web.StreamResponse:
        try:
            return await handler(request)
        except BaseException as exc:  # error_page re-raises cancellation and redirects
            return error_page(request, exc)

    return answered


async def not_found(request: web.Request) -> web.Response:
    """Any other path under ``/review``: a page, not the listener's JSON 404."""
    return page(request, "refused.html", 404, reason="No such page in the review console.")
