"""The review console over the policy's Redis review stream: two proxy processes on one Redis show
one queue, an item judged on one leaves the other, one of two verdicts on an item wins, and a
Redis that does not answer is said on a page, not a server error. The stream reader itself
(paging, the claim script, closures of trimmed entries) against the same Redis."""

from __future__ import annotations

import asyncio
import html
import json
import re
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml

from proxy.state.feedback import KEY_PREFIX, from_redis
from proxy.state.redis_client import RedisOptions
from proxy.state.review_queue import GONE, ClosedReview, PendingReview
from proxy.state.review_stream import BATCH, PAGE_ITEMS, ReviewStreams, closed_keys
from tests.console.harness import ADMIN, CLIENT, Reviewer, send_to_review_at
from tests.fake_upstream import FakeUpstream
from tests.proxy_server import (
    UPSTREAM_KEY,
    UPSTREAM_KEY_ENV,
    free_port,
    proxy_process,
    running_proxy,
    upstream_policy,
)
from tests.redis_relay import RedisRelay
from tests.support.polling import eventually
from tests.support.redis_server import redis_url

STREAM = "test:console-review"
ANSWER = json.dumps({"rung": "fast"})
REVIEW = {"sink": "redis-stream", "stream": STREAM, "maxlen": 1000}


def item_path(queue_page: str, trace_id: str) -> str | None:
    """The queue page's link to the item of ``trace_id`` (a stream item's names its entry)."""
    found = re.search(
        rf'class="open" href="(/review/items/[^"?]+/{re.escape(trace_id)}\?entry=[0-9-]+)"', queue_page
    )
    return html.unescape(found.group(1)) if found else None


def pending_part(queue_page: str) -> str:
    return queue_page.split("<h2>Closed</h2>")[0]


@asynccontextmanager
async def reviewers_of_two_proxies(
    tmp_path: Path, fake: FakeUpstream
) -> AsyncIterator[tuple[str, Reviewer, Reviewer]]:
    """Two ``cogproxy serve`` processes on the suite's Redis, each with its admin listener, and a
    reviewer logged in to each: (the first's API base, its reviewer, the second's reviewer)."""
    policy = tmp_path / "policy.yaml"
    policy.write_text(yaml.safe_dump(json.loads(json.dumps(upstream_policy(fake, review=REVIEW)))))
    async with AsyncExitStack() as stack:
        reviewers = []
        first_base = ""
        for _ in range(2):
            admin_port = free_port()
            served = await stack.enter_async_context(
                proxy_process(
                    "--policy", str(policy),
                    "--redis-url", redis_url(15),
                    "--api-keys", CLIENT,
                    "--admin-keys", ADMIN,
                    "--admin-port", str(admin_port),
                    env={UPSTREAM_KEY_ENV: UPSTREAM_KEY},
                )
            )  # fmt: skip
            first_base = first_base or served.url + "/v1"
            http = await stack.enter_async_context(
                aiohttp.ClientSession(cookie_jar=aiohttp.CookieJar(unsafe=True))
            )
            reviewer = Reviewer(f"http://127.0.0.1:{admin_port}", http)
            assert await reviewer.login() == 303
            reviewers.append(reviewer)
        yield first_base, reviewers[0], reviewers[1]


async def listed(reviewer: Reviewer, trace_id: str) -> str:
    """The item's path once the reviewer's queue lists it (the outbox delivers in the background)."""

    async def find() -> str | None:
        status, text = await reviewer.page("/review/")
        assert status == 200, text[:300]
        return item_path(text, trace_id)

    path = await eventually(find, f"{trace_id} in the queue of {reviewer.url}")
    assert path is not None
    return path


async def test_two_proxies_show_one_queue_and_a_judgement_on_one_closes_it_on_the_other(
    fake_upstream: FakeUpstream, tmp_path: Path, redis_db: Any
) -> None:
    async with reviewers_of_two_proxies(tmp_path, fake_upstream) as (api, first, second):
        trace_id = await send_to_review_at(api, fake_upstream)  # answered by the first process
        path = await listed(second, trace_id)
        assert await listed(first, trace_id) == path
        _, queue = await second.page("/review/")
        assert f"Redis stream <code>{STREAM}</code>" in queue
        status, item = await second.page(path)
        assert (
            status == 200 and trace_id in item and "up/strong" in item
        )  # the answer's facts, from the stream
        token = await second.csrf(path)
        status, _, _ = await second.post(
            path.replace("?", "/verdict?"), {"csrf": token, "verdict": "incorrect"}
        )
        assert status == 303
        _, queue = await first.page("/review/")
        assert trace_id not in pending_part(queue)
        assert (await first.page(path))[0] == 404
        _, closed = await first.page("/review/?decision=incorrect")
        assert trace_id in closed and "admin-" in closed
        verdict = await eventually(
            lambda: _verdict(redis_db, trace_id),
            "the verdict in the shared record",
            ready=lambda v: v is not None,
        )
        assert verdict == "incorrect"


async def _verdict(redis_db: Any, trace_id: str) -> str | None:
    stored = await redis_db.hgetall(KEY_PREFIX + trace_id)
    ((client, raw),) = stored.items()
    return from_redis(raw, client, trace_id).verdict


async def test_two_reviewers_judging_one_item_one_verdict_wins_the_other_is_told(
    fake_upstream: FakeUpstream, tmp_path: Path, redis_db: Any
) -> None:
    async with reviewers_of_two_proxies(tmp_path, fake_upstream) as (api, first, second):
        trace_id = await send_to_review_at(api, fake_upstream)
        paths = [await listed(r, trace_id) for r in (first, second)]
        tokens = [await r.csrf(p) for r, p in zip((first, second), paths, strict=True)]
        answers = await asyncio.gather(
            *(
                r.post(p.replace("?", "/verdict?"), {"csrf": t, "verdict": v})
                for r, p, t, v in zip((first, second), paths, tokens, ("correct", "incorrect"), strict=True)
            )
        )
        statuses = [status for status, _, _ in answers]
        assert sorted(statuses)[0] == 303 and sorted(statuses)[1] in (404, 409), statuses
        winner = ("correct", "incorrect")[statuses.index(303)]
        loser_text = answers[1 - statuses.index(303)][1]
        assert "Already closed by admin-" in loser_text or "No such pending item" in loser_text
        assert "text/html" in answers[1 - statuses.index(303)][2].headers["Content-Type"]
        verdict = await eventually(
            lambda: _verdict(redis_db, trace_id),
            "the verdict in the shared record",
            ready=lambda v: v is not None,
        )
        assert verdict == winner


async def test_a_verdict_through_the_feedback_endpoint_closes_the_stream_item(
    fake_upstream: FakeUpstream, tmp_path: Path, redis_db: Any
) -> None:
    async with reviewers_of_two_proxies(tmp_path, fake_upstream) as (api, _, second):
        trace_id = await send_to_review_at(api, fake_upstream)
        path = await listed(second, trace_id)
        async with aiohttp.ClientSession() as s:
            resp = await s.post(
                api + "/feedback",
                json={"trace_id": trace_id, "verdict": "incorrect"},
                headers={"Authorization": f"Bearer {CLIENT}"},
            )
            assert resp.status == 200, await resp.text()
        assert (await second.page(path))[0] == 404
        _, queue = await second.page("/review/")
        assert trace_id not in pending_part(queue)
        _, closed = await second.page("/review/?decision=incorrect")
        assert trace_id in closed and "POST /v1/feedback" in closed


async def test_a_verdict_sent_to_a_replica_that_serves_no_console_closes_the_stream_item(
    fake_upstream: FakeUpstream, tmp_path: Path, redis_db: Any
) -> None:
    """Only some replicas serve the console (an admin listener); a client sends its verdict to
    any. A replica without one answered the call and takes the verdict: the item leaves the
    queue the console shows (it stayed pending there, to be judged twice)."""
    async with reviewers_of_two_proxies(tmp_path, fake_upstream) as (_, _, reviewer):
        policy = tmp_path / "policy.yaml"
        async with proxy_process(
            "--policy", str(policy), "--redis-url", redis_url(15), "--api-keys", CLIENT,
            env={UPSTREAM_KEY_ENV: UPSTREAM_KEY},
        ) as api_only:  # fmt: skip
            trace_id = await send_to_review_at(api_only.url + "/v1", fake_upstream)
            path = await listed(reviewer, trace_id)
            async with aiohttp.ClientSession() as s:
                resp = await s.post(
                    api_only.url + "/v1/feedback",
                    json={"trace_id": trace_id, "verdict": "correct"},
                    headers={"Authorization": f"Bearer {CLIENT}"},
                )
                assert resp.status == 200, await resp.text()
        assert (await reviewer.page(path))[0] == 404
        _, closed = await reviewer.page("/review/?decision=correct")
        assert trace_id in closed and "POST /v1/feedback" in closed


async def test_a_stream_item_whose_verdict_cannot_be_recorded_is_pending_again(
    fake_upstream: FakeUpstream, tmp_path: Path, redis_db: Any
) -> None:
    """The answer's shared record is gone (expired, or deleted here): the second process, which
    never held it, claims the item, finds nothing to record the verdict on, and takes the claim back."""
    async with reviewers_of_two_proxies(tmp_path, fake_upstream) as (api, _, second):
        trace_id = await send_to_review_at(api, fake_upstream)
        path = await listed(second, trace_id)
        await eventually(lambda: redis_db.exists(KEY_PREFIX + trace_id), "the shared record")
        await redis_db.delete(KEY_PREFIX + trace_id)
        token = await second.csrf(path)
        status, text, _ = await second.post(
            path.replace("?", "/verdict?"), {"csrf": token, "verdict": "correct"}
        )
        assert status == 404 and "override instead" in text
        assert (await second.page(path))[0] == 200
        _, queue = await second.page("/review/")
        assert item_path(pending_part(queue), trace_id) == path
        stream = await redis_db.xrange(STREAM)
        entry = path.rsplit("entry=", 1)[1]
        assert entry in [e.decode() if isinstance(e, bytes) else e for e, _ in stream]
        closures, order = closed_keys(STREAM, cluster=False)
        assert not await redis_db.hexists(closures, entry) and await redis_db.zscore(order, entry) is None


async def test_with_redis_down_the_console_says_so_on_a_page(
    fake_upstream: FakeUpstream, tmp_path: Path, redis_db: Any, relay: RedisRelay
) -> None:
    admin_port = free_port()
    async with (
        running_proxy(
            tmp_path,
            upstream_policy(fake_upstream, review=REVIEW),
            api_keys=frozenset({CLIENT}),
            admin_keys=frozenset({ADMIN}),
            admin_port=admin_port,
            redis_url=relay.url(15),
        ) as px,
        aiohttp.ClientSession(cookie_jar=aiohttp.CookieJar(unsafe=True)) as http,
    ):
        reviewer = Reviewer(f"http://127.0.0.1:{admin_port}", http)
        trace_id = await send_to_review_at(px.base, fake_upstream)
        assert await reviewer.login() == 303
        path = await listed(reviewer, trace_id)
        token = await reviewer.csrf(path)
        relay.cut()
        for target in ("/review/", path):
            async with http.get(reviewer.url + target) as resp:
                text = await resp.text()
                assert resp.status == 503 and resp.content_type == "text/html", (target, resp.status)
                assert 'id="degraded"' in text and "Redis is not answering" in text
        status, text, resp = await reviewer.post(
            path.replace("?", "/verdict?"), {"csrf": token, "verdict": "correct"}
        )
        assert status == 503 and resp.content_type == "text/html" and "Nothing was recorded" in text
        relay.restore()
        assert (await reviewer.page(path))[0] == 200  # nothing was closed meanwhile


@pytest.fixture
async def streams() -> AsyncIterator[ReviewStreams]:
    reader = ReviewStreams(RedisOptions(redis_url(15)))
    yield reader
    await reader.aclose()


async def _add(redis_db: Any, n: int, maxlen: int | None = None, name: str = "t") -> list[str]:
    ids: list[str] = []
    for i in range(n):
        envelope = json.dumps({"data": {"n": i}})
        fields = {"trace_id": f"{name}{i}", "client": "c", "module": "m", "tier": "default",
                  "decision": "review", "meta": "{}", "envelope": envelope, "answer": ANSWER}  # fmt: skip
        ids.append(await redis_db.xadd(STREAM, fields, maxlen=maxlen, approximate=False))
    return ids


async def test_pages_read_a_bounded_part_of_the_stream_newest_first_without_repeats(
    redis_db: Any, streams: ReviewStreams
) -> None:
    ids = await _add(redis_db, PAGE_ITEMS + BATCH + 7)
    items = streams.items(STREAM)
    first = await items.page(lambda item: True, None)
    assert [i.entry for i in first.items] == ids[::-1][:PAGE_ITEMS] and first.older == ids[-PAGE_ITEMS]
    assert first.items[0].rung == "fast" and first.items[0].envelope == {}  # envelopes read when opened
    seen = [i.entry for i in first.items]
    cursor: str | None = first.older
    while cursor is not None:
        page = await items.page(lambda item: True, cursor)
        seen += [i.entry for i in page.items]
        cursor = page.older
    assert seen == ids[::-1]
    odd = await items.page(lambda item: item.trace_id.endswith(("1", "3", "5", "7", "9")), None)
    assert all(int(i.trace_id[1:]) % 2 for i in odd.items) and len(odd.items) == PAGE_ITEMS
    opened = await items.item("c", "t3", ids[3])
    assert opened is not None and opened.envelope == {"data": {"n": 3}}
    assert (
        await items.item("other", "t3", ids[3]) is None and await items.item("c", "t3", "not-an-id") is None
    )


async def test_a_claim_is_won_once_and_an_entry_trimmed_from_the_stream_is_gone(
    redis_db: Any, streams: ReviewStreams
) -> None:
    ids = await _add(redis_db, 3)
    items = streams.items(STREAM)
    item = await items.item("c", "t1", ids[1])
    assert item is not None
    claims = await asyncio.gather(
        *(items.claim(item, v, f"admin-{v}", 1.0) for v in ("correct", "incorrect"))
    )
    assert claims.count(None) == 1
    (won,) = [c for c in claims if c is not None]  # the later claim is told the closure that won
    assert won.by in ("admin-correct", "admin-incorrect") and won.outcome == won.by.removeprefix("admin-")
    assert won.item.trace_id == "t1"
    assert await items.item("c", "t1", ids[1]) is None
    page = await items.page(lambda i: True, None)
    assert [i.trace_id for i in page.items] == ["t2", "t0"] and page.total == 2
    assert [(c.item.trace_id, c.outcome, c.by) for c in await items.closed()] == [("t1", won.outcome, won.by)]
    hash_key, order_key = closed_keys(STREAM, cluster=False)
    assert await redis_db.ttl(hash_key) > 0 and await redis_db.ttl(order_key) > 0
    # The stream trims t0 and t1: t0 can no longer be claimed, t1's closure is forgotten at the next close.
    t0 = PendingReview("t0", "c", "m", "default", "review", {}, 0.0, entry=ids[0])
    await _add(redis_db, 2, maxlen=3, name="u")
    assert (await items.claim(t0, "correct", "admin-x", 2.0)) == ClosedReview(t0, GONE, "", 2.0)
    newest = await items.page(lambda i: True, None)
    assert [i.trace_id for i in newest.items] == ["u1", "u0", "t2"]
    assert await items.claim(newest.items[0], "reject", "admin-x", 3.0) is None
    assert await redis_db.hkeys(hash_key) == [newest.items[0].entry]
    assert await redis_db.zcard(order_key) == 1
