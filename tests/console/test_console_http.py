"""The review console over HTTP on a served proxy's admin listener: who gets in, the CSRF token
on every form, a judgement as a verdict, an override sent to the webhook, the audit."""

from __future__ import annotations

import html
import re
import time
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web
from structlog.testing import capture_logs
from yarl import URL

from proxy.api.access import Scope
from proxy.api.app_keys import FEEDBACK
from proxy.api.routes import CONSOLE_ROUTES
from proxy.calibration.tune import Verdict, tune
from proxy.state.feedback import AnswerRecord, MemoryFeedbackStore
from tests.api.test_route_table import SAMPLES
from tests.console.harness import ADMIN, CLIENT, Console, console_proxy, envelope, send_to_review
from tests.fake_upstream import FakeUpstream
from tests.proxy_server import free_port
from tests.support.polling import until


async def the_item_path(console: Console, trace_id: str) -> str:
    """The queue's link to the item of ``trace_id``."""
    status, text = await console.page("/review/")
    assert status == 200
    found = re.search(rf'href="(/review/items/[^"]+/{re.escape(trace_id)})"', text)
    assert found, text[:800]
    return html.unescape(found.group(1))


async def metrics_text(console: Console) -> str:
    status, text = await console.page("/metrics")
    assert status == 200
    return text


async def test_a_judgement_is_a_verdict_and_closes_the_item(
    fake_upstream: FakeUpstream, tmp_path: Path
) -> None:
    async with console_proxy(tmp_path, fake_upstream) as console:
        trace_id = await send_to_review(console.px, fake_upstream)
        assert await console.login() == 303
        path = await the_item_path(console, trace_id)
        status, page = await console.page(path)
        assert status == 200 and trace_id in page and "up/strong" in page
        token = await console.csrf(path)
        with capture_logs() as logs:
            status, _, resp = await console.post(
                path + "/verdict", {"csrf": token, "verdict": "incorrect", "note": "n"}
            )
        assert (status, resp.headers["Location"]) == (303, "/review/")
        scraped = await metrics_text(console)
        assert re.search(r'cognitive_feedback_total\{[^}]*verdict="incorrect"[^}]*\} 1\.0', scraped), scraped[
            :200
        ]
        assert 'cognitive_review_console_actions_total{action="judge",result="done"} 1.0' in scraped
        _, queue = await console.page("/review/")
        assert trace_id not in queue.split("<h2>Closed</h2>")[0]
        assert (await console.page(path))[0] == 404
        _, closed = await console.page("/review/?decision=incorrect")
        assert trace_id in closed and "admin-" in closed
    judged = [e for e in logs if e["event"] == "proxy.review_console" and e["action"] == "judge"]
    assert judged and judged[0]["admin"].startswith("admin-") and judged[0]["trace_id"] == trace_id
    assert ADMIN not in repr(logs)


async def test_the_verdict_is_the_feedback_endpoints_with_source_review(
    fake_upstream: FakeUpstream, tmp_path: Path
) -> None:
    """The record a console verdict leaves is the one POST /v1/feedback replaces: a second verdict
    through the API says it replaced one."""
    async with console_proxy(tmp_path, fake_upstream) as console:
        trace_id = await send_to_review(console.px, fake_upstream)
        await console.login()
        path = await the_item_path(console, trace_id)
        token = await console.csrf(path)
        await console.post(path + "/verdict", {"csrf": token, "verdict": "correct"})
        async with aiohttp.ClientSession() as s:
            again = await s.post(
                console.px.base + "/feedback",
                json={"trace_id": trace_id, "verdict": "correct"},
                headers={"Authorization": f"Bearer {CLIENT}"},
            )
            assert (await again.json())["replaced"] is True


async def test_no_key_a_client_key_and_a_wrong_key_are_refused(
    fake_upstream: FakeUpstream, tmp_path: Path
) -> None:
    async with console_proxy(tmp_path, fake_upstream) as console:
        await send_to_review(console.px, fake_upstream)
        status, _ = await console.page("/review/")
        assert status == 303  # to the login form
        for key in (CLIENT, "sk-wrong", ""):
            assert await console.login(key) == 403
            assert (await console.page("/review/"))[0] == 303
        async with aiohttp.ClientSession() as bearer:  # a bearer key opens no console page
            for key in (ADMIN, CLIENT):
                resp = await bearer.get(
                    console.url + "/review/",
                    headers={"Authorization": f"Bearer {key}"},
                    allow_redirects=False,
                )
                assert resp.status == 303
        assert (await console.page("/review/reliability"))[0] == 303
        scraped = await metrics_text(console)
        assert 'cognitive_review_console_actions_total{action="login",result="refused"} 3.0' in scraped


async def test_a_form_without_the_csrf_token_is_refused(fake_upstream: FakeUpstream, tmp_path: Path) -> None:
    async with console_proxy(tmp_path, fake_upstream) as console:
        trace_id = await send_to_review(console.px, fake_upstream)
        # The login form itself: its token must come back with its cookie.
        status, _, _ = await console.post("/review/session", {"key": ADMIN})
        assert status == 403
        assert await console.login() == 303
        path = await the_item_path(console, trace_id)
        for form in ({"verdict": "correct"}, {"verdict": "correct", "csrf": "forged"}):
            status, text, _ = await console.post(path + "/verdict", form)
            assert status == 403 and "CSRF" in text
        status, _, _ = await console.post(path + "/override", {"decision": "accept"})
        assert status == 403
        assert (await console.page(path))[0] == 200  # still pending
        assert (await console.post("/review/logout", {}))[0] == 403
        scraped = await metrics_text(console)
        assert 'cognitive_review_console_actions_total{action="csrf",result="refused"} 4.0' in scraped
        assert "cognitive_feedback_total{" not in scraped


async def test_a_session_is_new_at_each_login_and_its_cookie_is_strict_and_httponly(
    fake_upstream: FakeUpstream, tmp_path: Path
) -> None:
    async with console_proxy(tmp_path, fake_upstream) as console:
        planted = "admin-000000000000.9999999999.planted.0000"
        console.http.cookie_jar.update_cookies({"cogproxy_console": planted})
        assert (await console.page("/review/"))[0] == 303  # a forged cookie opens nothing
        token = await console.csrf("/review/login")
        status, _, resp = await console.post("/review/session", {"csrf": token, "key": ADMIN})
        assert status == 303
        cookie = resp.cookies["cogproxy_console"]
        assert cookie.value != planted and cookie["httponly"] and cookie["samesite"] == "Strict"
        assert cookie["path"] == "/review"
        assert ADMIN not in cookie.value and ADMIN not in resp.headers.get("Location", "")
        first = cookie.value
        assert await console.login() == 303
        second = console.http.cookie_jar.filter_cookies(URL(console.url + "/review/"))[
            "cogproxy_console"
        ].value
        assert second != first
        status, page = await console.page("/review/")
        assert status == 200 and ADMIN not in page


async def test_an_override_is_closed_audited_and_sent_to_the_review_webhook(
    fake_upstream: FakeUpstream, tmp_path: Path
) -> None:
    received: list[dict[str, Any]] = []

    async def hook(request: web.Request) -> web.Response:
        received.append(await request.json())
        return web.Response(status=204)

    hooks = web.Application()
    hooks.router.add_post("/hook", hook)
    runner = web.AppRunner(hooks)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    try:
        review = {"sink": "webhook", "url": f"http://127.0.0.1:{port}/hook"}
        async with console_proxy(tmp_path, fake_upstream, review=review) as console:
            trace_id = await send_to_review(console.px, fake_upstream)
            await until(lambda: received, "the review record at the webhook")
            await console.login()
            path = await the_item_path(console, trace_id)
            token = await console.csrf(path)
            status, _, _ = await console.post(path + "/override", {"csrf": token, "decision": "reject"})
            assert status == 303
            assert (await console.page(path))[0] == 404
            scraped = await metrics_text(console)
            assert 'cognitive_review_console_actions_total{action="override",result="done"} 1.0' in scraped
    finally:
        await runner.cleanup()
    record, override = received
    assert record["trace_id"] == trace_id and record["answer"]["rung"] == "strong"
    assert override["type"] == "review.override" and override["decision"] == "reject"
    assert override["trace_id"] == trace_id and override["by"].startswith("admin-")


async def test_the_queue_shows_how_the_answer_was_decided_and_filters(
    fake_upstream: FakeUpstream, tmp_path: Path
) -> None:
    async with console_proxy(tmp_path, fake_upstream) as console:
        trace_id = await send_to_review(console.px, fake_upstream, envelope(0.93))
        await console.login()
        _, page = await console.page("/review/")
        found = re.search(rf'<tr class="item"[^>]*{trace_id}">(.*?)</tr>', page, re.S)
        assert found, page[:800]
        row = found.group(1)
        cells = re.findall(r"<td>(.*?)</td>", row, re.S)
        assert cells[:5] == ["code-reviewer", "decision", "strong", "0.930", "0.930"]
        assert "high" in cells[5]
        _, other = await console.page("/review/?module=text-summarizer")
        assert trace_id not in other and 'id="empty"' in other
        _, same = await console.page("/review/?module=code-reviewer&tier=decision&age=1h")
        assert trace_id in same


async def test_a_hostile_envelope_is_text(fake_upstream: FakeUpstream, tmp_path: Path) -> None:
    hostile = '<script>window.pwned=1</script><img src=x onerror="window.pwned=2">'
    answer = envelope(summary=hostile, link="javascript:window.pwned=3", nest=[[[["<b>deep</b>"]]]])
    async with console_proxy(tmp_path, fake_upstream) as console:
        trace_id = await send_to_review(console.px, fake_upstream, answer)
        await console.login()
        status, page = await console.page(await the_item_path(console, trace_id))
        assert status == 200
        assert "<script>window" not in page and "<img src=x" not in page and "<b>deep" not in page
        assert "&lt;script&gt;window.pwned=1&lt;/script&gt;" in page
        assert 'href="javascript' not in page and "javascript:window.pwned=3" in page
        async with console.http.get(console.url + "/review/") as resp:
            policy = resp.headers["Content-Security-Policy"]
        assert "script-src 'self'" in policy and "unsafe-inline" not in policy


async def test_every_console_row_needs_a_session_and_none_is_on_the_api_listener(
    fake_upstream: FakeUpstream, tmp_path: Path
) -> None:
    """The table's console rows: without a session a page sends to the login form and a form is
    refused, whatever bearer key comes along; a logged-in session opens each (SAMPLES' statuses);
    the API listener serves none of them."""
    async with console_proxy(tmp_path, fake_upstream) as console:
        for route in CONSOLE_ROUTES:
            sample = SAMPLES[route.path]
            for key in (None, CLIENT, ADMIN):
                bearer = {"Authorization": f"Bearer {key}"} if key else {}
                async with console.http.request(
                    sample.method, console.url + sample.target, headers=bearer, allow_redirects=False
                ) as resp:
                    refused = 303 if sample.method == "GET" else 403
                    expected = sample.admitted if route.scope is Scope.PUBLIC else refused
                    assert resp.status == expected, (route.path, key, resp.status)
            async with console.http.get(
                console.px.url + sample.target, headers={"Authorization": f"Bearer {CLIENT}"}
            ) as resp:
                assert resp.status in (404, 405), (route.path, resp.status)
        await console.login()
        for route in CONSOLE_ROUTES:
            sample = SAMPLES[route.path]
            if route.path == "/review/logout":
                continue  # ends the session the others need
            form = {"csrf": await console.csrf("/review/")} if sample.method == "POST" else None
            async with console.http.request(
                sample.method, console.url + sample.target, data=form, allow_redirects=False
            ) as resp:
                assert resp.status == sample.admitted, (route.path, resp.status)


def is_page(resp: aiohttp.ClientResponse) -> bool:
    """An HTML page with the console's framing defences, never an OpenAI error object."""
    policy = resp.headers.get("Content-Security-Policy", "")
    return (
        resp.content_type == "text/html"
        and "frame-ancestors 'none'" in policy
        and resp.headers.get("X-Frame-Options") == "DENY"
    )


async def test_every_console_answer_a_browser_shows_is_a_page_that_refuses_framing(
    fake_upstream: FakeUpstream, tmp_path: Path
) -> None:
    """Login failures, unknown paths and methods under /review/, and the queue's pages: HTML with
    ``frame-ancestors 'none'`` and ``X-Frame-Options: DENY`` (no JSON error a browser shows raw)."""
    async with console_proxy(tmp_path, fake_upstream) as console:
        trace_id = await send_to_review(console.px, fake_upstream)
        http = console.http
        refused = [
            ("POST", "/review/session", {"key": ADMIN}, 403),  # no login token
            ("GET", "/review/nope", None, 404),
            ("POST", "/review/nope/deeper", {"x": "y"}, 404),
            ("GET", "/review", None, 404),
            ("GET", "/review/session", None, 405),
            ("GET", "/review/static/nope.js", None, 404),
        ]
        for method, path, form, status in refused:
            async with http.request(method, console.url + path, data=form, allow_redirects=False) as resp:
                assert (resp.status, is_page(resp)) == (status, True), (
                    method,
                    path,
                    resp.status,
                    resp.content_type,
                )
        token = await console.csrf("/review/login")
        status, text, resp = await console.post("/review/session", {"csrf": token, "key": "sk-wrong"})
        assert (status, is_page(resp)) == (403, True) and "That is not an admin key." in text
        assert await console.login() == 303
        item = await the_item_path(console, trace_id)
        for path in ("/review/", "/review/login", item, "/review/reliability", "/review/items/c/t"):
            async with http.get(console.url + path, allow_redirects=False) as resp:
                assert is_page(resp), (path, resp.status, dict(resp.headers))
        async with http.get(console.url + "/review/session", allow_redirects=False) as resp:
            assert resp.headers["Allow"] == "POST"


async def test_a_console_form_body_is_read_up_to_16_kib(fake_upstream: FakeUpstream, tmp_path: Path) -> None:
    """The admin listener reads a console form of 16 KiB at most: just under is read (a wrong key,
    refused as one), just over is refused unread (413, a page)."""
    async with console_proxy(tmp_path, fake_upstream) as console:
        for size, status in ((15 * 1024, 403), (17 * 1024, 413)):
            token = await console.csrf("/review/login")
            status_seen, text, resp = await console.post(
                "/review/session", {"csrf": token, "key": "k" * size}
            )
            assert (status_seen, is_page(resp)) == (status, True), (size, status_seen, text[:200])
        assert "That is not an admin key." not in text


async def test_a_judgement_whose_verdict_cannot_be_recorded_leaves_the_item_pending(
    fake_upstream: FakeUpstream, tmp_path: Path
) -> None:
    """The first answer's feedback record is evicted by the second's (a store of one): its verdict
    has nothing to be recorded on, so the claim is taken back and the item is pending again."""
    async with console_proxy(tmp_path, fake_upstream, feedback={"max_entries": 1}) as console:
        unjudgeable = await send_to_review(console.px, fake_upstream)
        await send_to_review(console.px, fake_upstream)
        await console.login()
        path = await the_item_path(console, unjudgeable)
        token = await console.csrf(path)
        status, text, _ = await console.post(path + "/verdict", {"csrf": token, "verdict": "correct"})
        assert status == 404 and "override instead" in text
        assert (await console.page(path))[0] == 200
        assert await the_item_path(console, unjudgeable) == path
        _, closed = await console.page("/review/?decision=closed")
        assert unjudgeable not in closed.split("<h2>Closed</h2>")[-1]
        status, _, _ = await console.post(path + "/override", {"csrf": token, "decision": "reject"})
        assert status == 303  # pending, so it can still be closed


async def test_a_verdict_through_the_feedback_endpoint_closes_the_console_item(
    fake_upstream: FakeUpstream, tmp_path: Path
) -> None:
    async with console_proxy(tmp_path, fake_upstream) as console:
        judged = await send_to_review(console.px, fake_upstream)
        other = await send_to_review(console.px, fake_upstream)
        await console.login()
        path = await the_item_path(console, judged)
        async with aiohttp.ClientSession() as s:
            resp = await s.post(
                console.px.base + "/feedback",
                json={"trace_id": judged, "verdict": "partially_correct"},
                headers={"Authorization": f"Bearer {CLIENT}"},
            )
            assert resp.status == 200, await resp.text()
        assert (await console.page(path))[0] == 404
        _, queue = await console.page("/review/")
        assert judged not in queue and other in queue
        _, closed = await console.page("/review/?decision=partially_correct")
        assert judged in closed and "POST /v1/feedback" in closed


def judged_answers(module: str, tier: str, correct: int, wrong: int) -> list[AnswerRecord]:
    """Judged answers of ``up/strong``: ``correct`` right at 0.95, ``wrong`` wrong at 0.3."""
    now = time.time()
    return [
        AnswerRecord(
            trace_id=f"{module}-{i}", module=module, tier=tier, rung="strong", provider="up",
            model="strong", confidence=c, calibrated=c, risk="low", decision="accept",
            min_confidence=0.8, at=now, expires=now + 3600, client="c",
            verdict="correct" if ok else "incorrect", score=1.0 if ok else 0.0, source="review",
        )
        for i, (c, ok) in enumerate([(0.95, True)] * correct + [(0.3, False)] * wrong)
    ]  # fmt: skip


def suggestion_row(page: str, kind: str, name: str) -> str:
    found = re.search(rf'<tr class="suggestion {kind}" data-name="{name}">(.*?)</tr>', page, re.S)
    assert found, page[page.find("Suggested") :][:1500]
    return re.sub(r"\s+", " ", html.unescape(re.sub(r"<[^>]+>", " ", found.group(1))))


async def test_the_reliability_view_shows_policy_tunes_suggestion_with_its_evidence(
    fake_upstream: FakeUpstream, tmp_path: Path
) -> None:
    async with console_proxy(tmp_path, fake_upstream) as console:
        store = console.px.app[FEEDBACK]
        assert isinstance(store, MemoryFeedbackStore)
        for record in judged_answers("code-reviewer", "decision", 100, 10) + judged_answers(
            "idea-explorer", "exploration", 30, 0
        ):
            store.remember(record, 1000)
        await console.login()
        status, page = await console.page("/review/reliability")
        assert status == 200
        assert "--target-accuracy 0.9 --delta 0.05" in page
        row = suggestion_row(page, "module", "code-reviewer")
        assert " 110 " in row and " 0.95 " in row  # its verdicts, the threshold suggested
        assert "accepted accuracy ≥ 0.970 (0 wrong of 100 accepted); accepted 90.9%" in row
        assert " 0.95 " in suggestion_row(page, "tier", "decision")
        few = tune([Verdict(0.95, True)] * 30, 0.9, 0.05)
        assert few.threshold is None and few.more_needed
        assert f"needs about {few.more_needed} more verdicts" in suggestion_row(
            page, "module", "idea-explorer"
        )
        status, page = await console.page("/review/reliability?target=0.8&delta=0.1")
        assert status == 200 and "--target-accuracy 0.8 --delta 0.1" in page
        loose = tune([Verdict(0.95, True)] * 30, 0.8, 0.1)
        assert loose.threshold == 0.95 and " 0.95 " in suggestion_row(page, "module", "idea-explorer")
        for bad in ("target=1.5", "target=0.2", "delta=0.9", "delta=x", "target=nan"):
            status, page = await console.page(f"/review/reliability?{bad}")
            assert status == 400 and "must be a number from" in page, bad
