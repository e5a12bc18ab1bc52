"""The console's pages and forms: log in, the queue, one item (judge it, or override its
decision), the reliability view, log out. Their scope is the route's (``proxy.api.routes``)."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from importlib import resources
from urllib.parse import urlencode

import aiohttp
import orjson
import structlog
from aiohttp import web

from proxy.api.app_keys import FEEDBACK, SETTINGS, runtime_of
from proxy.api.app_keys import SESSION as HTTP_SESSION
from proxy.api.console import diagram, tree
from proxy.api.console.pages import BASE, COOKIE_PATH, LOGIN, SESSION, audit, page, see_other
from proxy.api.console.session import (
    CSRF_FIELD,
    LOGIN_COOKIE,
    LOGIN_TTL_S,
    SESSION_COOKIE,
    SESSION_TTL_S,
    admin_key_of,
    login_token,
    login_token_ok,
    open_session,
)
from proxy.api.feedback import NOTE_MAX, Verdict, admin_record, apply_verdict
from proxy.api.review_items import review_items as shared_review_items
from proxy.calibration.defaults import DEFAULT_DELTA
from proxy.calibration.reliability import from_records, render
from proxy.calibration.suggest import (
    DEFAULT_TARGET_ACCURACY,
    DELTA_BOUNDS,
    TARGET_BOUNDS,
    suggest,
    within,
)
from proxy.state.feedback import VERDICT_SCORES, MemoryFeedbackStore, RedisFeedbackStore, scan_records
from proxy.state.review_queue import (
    GONE,
    ClosedReview,
    PendingReview,
    QueueUnavailable,
    ReviewItems,
)
from proxy.state.review_stream import ENTRY_ID

log = structlog.get_logger("proxy.review_console")

OVERRIDES = ("accept", "reject")
AGES = {"": None, "1h": 3600.0, "24h": 86_400.0, "7d": 7 * 86_400.0}
"""The age filter: pending at most this long."""
STATIC = {"console.css": "text/css", "console.js": "text/javascript"}


def _cookie(response: web.StreamResponse, request: web.Request, name: str, value: str, max_age: int) -> None:
    response.set_cookie(
        name,
        value,
        max_age=max_age,
        path=COOKIE_PATH,
        httponly=True,
        samesite="Strict",
        secure=request.secure,
    )


async def login_form(request: web.Request) -> web.Response:
    token = login_token()
    response = page(request, "login.html", login_csrf=token, error=None)
    _cookie(response, request, LOGIN_COOKIE, token, LOGIN_TTL_S)
    return response


async def login(request: web.Request) -> web.StreamResponse:
    """An admin key in the form body opens a new session (a new nonce: no fixation)."""
    form = await request.post()
    if not login_token_ok(request.cookies.get(LOGIN_COOKIE), form.get(CSRF_FIELD)):
        audit(request, "login", "refused", reason="csrf")
        return page(request, "refused.html", 403, reason="The login form's CSRF token is missing or wrong.")
    presented = form.get("key")
    key = admin_key_of(presented, request.app[SETTINGS].admin_keys) if isinstance(presented, str) else None
    if key is None:
        audit(request, "login", "refused", reason="not an admin key")
        token = login_token()
        response = page(request, "login.html", 403, login_csrf=token, error="That is not an admin key.")
        _cookie(response, request, LOGIN_COOKIE, token, LOGIN_TTL_S)
        return response
    session = open_session(key, time.time())
    request[SESSION] = session
    audit(request, "login", "done")
    response = see_other(BASE)
    _cookie(response, request, SESSION_COOKIE, session.cookie, SESSION_TTL_S)
    response.del_cookie(LOGIN_COOKIE, path=COOKIE_PATH)
    return response


async def logout(request: web.Request) -> web.StreamResponse:
    audit(request, "logout", "done")
    response = see_other(LOGIN)
    response.del_cookie(SESSION_COOKIE, path=COOKIE_PATH)
    return response


@dataclass(frozen=True, slots=True)
class Filters:
    module: str = ""
    tier: str = ""
    age: str = ""
    decision: str = ""
    """pending (the default) or a closed item's outcome: a verdict, or an overriding decision."""

    @classmethod
    def of(cls, request: web.Request) -> Filters:
        q = request.query
        age = q.get("age", "")
        return cls(
            q.get("module", "")[:64],
            q.get("tier", "")[:64],
            age if age in AGES else "",
            q.get("decision", "")[:32],
        )

    def keeps(self, item: PendingReview, now: float) -> bool:
        limit = AGES[self.age]
        return (
            (not self.module or item.module == self.module)
            and (not self.tier or item.tier == self.tier)
            and (limit is None or now - item.at <= limit)
        )


def review_items(request: web.Request) -> ReviewItems:
    """The console's queue (``proxy.api.review_items``: the console is served here)."""
    items = shared_review_items(request)
    assert items is not None  # console routes are registered with the queue (proxy.app)
    return items


def unavailable(request: web.Request) -> web.Response:
    """Redis is not answering: said on a page (503), never a server error."""
    return page(
        request,
        "refused.html",
        503,
        reason="Redis is not answering: the shared review queue cannot be read or changed now. "
        "Nothing was recorded; try again shortly.",
        degraded=True,
    )


async def queue_page(request: web.Request) -> web.Response:
    items = review_items(request)
    filters, now = Filters.of(request), time.time()
    older = request.query.get("older", "")
    try:
        listing = await items.page(
            lambda item: filters.keeps(item, now), older if ENTRY_ID.fullmatch(older) else None
        )
        closed = [
            c
            for c in await items.closed()
            if filters.keeps(c.item, now) and filters.decision in ("", "closed", c.outcome)
        ]
    except QueueUnavailable:
        return unavailable(request)
    runtime = runtime_of(request)
    query = {"module": filters.module, "tier": filters.tier, "age": filters.age, "decision": filters.decision}
    return page(
        request,
        "queue.html",
        items=[] if filters.decision not in ("", "pending") else listing.items,
        closed=closed if filters.decision else [],
        total=listing.total,
        older=BASE + "?" + urlencode({**query, "older": listing.older}) if listing.older else None,
        source=runtime.policy.review.stream if items.shared else None,
        filters=filters,
        modules=runtime.registry.names(),
        tiers=sorted(runtime.policy.tiers),
        ages=list(AGES),
        decisions=["pending", *VERDICT_SCORES, *OVERRIDES, "closed"],
        now=now,
    )


async def _item(request: web.Request, items: ReviewItems) -> PendingReview | None:
    match = request.match_info
    return await items.item(match["client"], match["trace_id"], request.query.get("entry", ""))


def _gone(request: web.Request) -> web.Response:
    return page(
        request, "refused.html", 404, reason="No such pending item: judged, overridden or evicted already."
    )


def _taken(request: web.Request, prior: ClosedReview) -> web.Response:
    """Another reviewer's judgement or override came first: theirs stands, this one is not recorded."""
    if prior.outcome == GONE:
        return _gone(request)
    return page(
        request,
        "refused.html",
        409,
        reason=f"Already closed by {prior.by} ({prior.outcome}): that judgement stands, "
        "yours was not recorded.",
    )


async def item_page(request: web.Request) -> web.Response:
    items = review_items(request)
    try:
        item = await _item(request, items)
        if item is None:
            return _gone(request)
        previous, following = await items.neighbours(item)
    except QueueUnavailable:
        return unavailable(request)
    return page(
        request,
        "item.html",
        item=item,
        tree=tree.tree(item.envelope),
        raw=tree.raw_json(item.envelope),
        verdicts=list(VERDICT_SCORES),
        overrides=OVERRIDES,
        note_max=NOTE_MAX,
        previous=previous,
        next=following,
        now=time.time(),
    )


def _note(form: object) -> str | None:
    note = form.get("note") if hasattr(form, "get") else None
    return note.strip()[:NOTE_MAX] or None if isinstance(note, str) else None


async def judge(request: web.Request) -> web.StreamResponse:
    """A verdict through ``POST /v1/feedback``'s path (``source: review``); closes the item. The
    item is claimed first: of two reviewers judging it, one verdict is recorded, the other told."""
    items = review_items(request)
    form = await request.post()
    verdict = form.get("verdict")
    try:
        item = await _item(request, items)
        if item is None:
            return _gone(request)
        if not isinstance(verdict, str) or verdict not in VERDICT_SCORES:
            return page(
                request, "refused.html", 400, reason=f"verdict must be one of {', '.join(VERDICT_SCORES)}"
            )
        admin = request[SESSION].admin
        prior = await items.claim(item, verdict, admin, time.time())
    except QueueUnavailable:
        return unavailable(request)
    if prior is not None:
        audit(
            request, "judge", "refused", trace_id=item.trace_id, client=item.client, reason="closed already"
        )
        return _taken(request, prior)
    asked = Verdict(item.trace_id, verdict, VERDICT_SCORES[verdict], "review", _note(form), item.client)
    try:  # claimed: a verdict that is not recorded puts the item back, never leaves it closed
        record = await admin_record(request.app[FEEDBACK], item.trace_id, item.client)
        if record is not None:
            await apply_verdict(request.app, runtime_of(request), record, asked)
    except BaseException:
        await _release(items, item)
        raise
    if record is None:
        await _release(items, item)
        audit(
            request,
            "judge",
            "failed",
            trace_id=item.trace_id,
            client=item.client,
            reason="no feedback record",
        )
        return page(
            request,
            "refused.html",
            404,
            reason="No answer record to judge (outside the feedback window, or no model answered): "
            "override instead.",
        )
    audit(
        request,
        "judge",
        "done",
        trace_id=item.trace_id,
        client=item.client,
        module=item.module,
        verdict=verdict,
    )
    return see_other(BASE)


async def _release(items: ReviewItems, item: PendingReview) -> None:
    """Take back a claim whose verdict was not recorded (Redis not answering: the closure stays,
    said in the log)."""
    try:
        await items.release(item)
    except QueueUnavailable as exc:
        log.warning("proxy.review_release_failed", trace_id=item.trace_id, error=str(exc))


async def override(request: web.Request) -> web.StreamResponse:
    """The reviewer's decision in place of ``review``: recorded, closed, and sent to the
    policy's review webhook when it names one (by the reviewer whose claim closed the item)."""
    items = review_items(request)
    form = await request.post()
    decision = form.get("decision")
    admin = request[SESSION].admin
    try:
        item = await _item(request, items)
        if item is None:
            return _gone(request)
        if not isinstance(decision, str) or decision not in OVERRIDES:
            return page(request, "refused.html", 400, reason="decision must be accept or reject")
        prior = await items.claim(item, decision, admin, time.time())
    except QueueUnavailable:
        return unavailable(request)
    if prior is not None:
        audit(
            request,
            "override",
            "refused",
            trace_id=item.trace_id,
            client=item.client,
            reason="closed already",
        )
        return _taken(request, prior)
    forwarded = await _forward(request, item, decision, admin, _note(form))
    audit(
        request,
        "override",
        "done",
        trace_id=item.trace_id,
        client=item.client,
        module=item.module,
        decision=decision,
        forwarded=forwarded,
    )
    return see_other(BASE)


async def _forward(
    request: web.Request, item: PendingReview, decision: str, admin: str, note: str | None
) -> str:
    """POST the override to the policy's review webhook, once; what happened (for the audit)."""
    review = runtime_of(request).policy.review
    if review.sink != "webhook" or not review.url:
        return "no webhook"
    body = {
        "type": "review.override",
        "trace_id": item.trace_id,
        "client": item.client,
        "module": item.module,
        "tier": item.tier,
        "decision": decision,
        "note": note,
        "by": admin,
        "at": time.time(),
    }
    try:
        async with request.app[HTTP_SESSION].post(
            review.url,
            data=orjson.dumps(body),
            headers={"Content-Type": "application/json"},
            timeout=aiohttp.ClientTimeout(total=review.timeout_s),
        ) as answer:
            return "delivered" if answer.status < 400 else f"status {answer.status}"
    except (aiohttp.ClientError, TimeoutError) as exc:
        return f"failed: {type(exc).__name__}"


async def reliability_page(request: web.Request) -> web.Response:
    """Per model, the reliability diagram and ECE from the stored verdicts: this replica's memory,
    or every replica's records in Redis (``cogproxy calibration report --redis-url``'s source)."""
    store, settings = request.app[FEEDBACK], request.app[SETTINGS]
    if isinstance(store, RedisFeedbackStore) and settings.redis is not None:
        records = [record async for record in scan_records(settings.redis)]
    elif isinstance(store, MemoryFeedbackStore):
        records = store.records()
    else:
        records = []
    tuning = _tuning(request)
    if isinstance(tuning, str):
        return page(request, "refused.html", 400, reason=tuning)
    target, delta = tuning
    rel = from_records(records)
    return page(
        request,
        "reliability.html",
        diagrams=diagram.diagrams(rel),
        report=render(rel),
        size=diagram.SIZE,
        margin=diagram.MARGIN,
        ticks=diagram.TICKS,
        # off the event loop: more_needed's searches take seconds on some groups of verdicts
        suggestions=await asyncio.to_thread(suggest, runtime_of(request).policy, records, target, delta),
        target=target,
        delta=delta,
        target_bounds=TARGET_BOUNDS,
        delta_bounds=DELTA_BOUNDS,
    )


def _tuning(request: web.Request) -> tuple[float, float] | str:
    """The page's target accuracy and delta (``?target=&delta=``, within bounds), or why not."""
    chosen = []
    for name, default, bounds in (
        ("target", DEFAULT_TARGET_ACCURACY, TARGET_BOUNDS),
        ("delta", DEFAULT_DELTA, DELTA_BOUNDS),
    ):
        text = request.query.get(name, "")
        try:
            value = float(text) if text else default
        except ValueError:
            value = float("nan")
        if not within(value, bounds):  # NaN is within no bounds
            return f"{name} must be a number from {bounds[0]:g} to {bounds[1]:g}"
        chosen.append(value)
    return chosen[0], chosen[1]


async def static(request: web.Request) -> web.Response:
    name = request.match_info["name"]
    if name not in STATIC:
        raise web.HTTPNotFound()
    body = resources.files("proxy.api.console").joinpath("static", name).read_bytes()
    return web.Response(body=body, content_type=STATIC[name], headers={"Cache-Control": "no-cache"})
