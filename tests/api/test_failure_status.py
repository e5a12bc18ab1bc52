"""What the client hears when every target failed (issue #11 finding 6): the status of the real
failure (503 stays 503, 429 stays 429), the largest upstream Retry-After (capped), an open
breaker's time until its trial, and the real failure named rather than the breaker skip."""

from __future__ import annotations

from typing import Any

import aiohttp
import pytest

from proxy.upstream.router import RETRY_AFTER_CAP_S
from tests.api.test_routing import REVIEW_INPUT, routing_policy
from tests.fake_upstream import FakeUpstream, Fault
from tests.proxy_server import RunningProxy

CHAT = {"model": "fast", "messages": [{"role": "user", "content": "hi"}]}


@pytest.fixture
def policy(fake_upstream: FakeUpstream) -> dict[str, Any]:
    """What the ``proxy`` fixture serves here. Retry-After values past the 10 s deadline: no retry
    waits for them, the rung fails over."""
    return routing_policy(fake_upstream, circuit_breaker={"consecutive_failures": 1, "open_s": 30})


async def post(px: RunningProxy, path: str, body: dict[str, Any]) -> tuple[int, dict[str, str], Any]:
    async with aiohttp.ClientSession() as session:
        resp = await session.post(px.url + path, json=body, headers={"Authorization": "Bearer sk-c"})
        return resp.status, dict(resp.headers), await resp.json()


@pytest.mark.parametrize(("status", "retry_afters"), [(503, (40, 55)), (429, (55, 40))])
async def test_exhausted_503s_and_429s_keep_their_status_and_the_largest_retry_after(
    proxy: RunningProxy, fake_upstream: FakeUpstream, status: int, retry_afters: tuple[int, int]
) -> None:
    fake_upstream.script("cheap", Fault.http(status, retry_after=retry_afters[0]))
    fake_upstream.script("backup", Fault.http(status, retry_after=retry_afters[1]))
    code, headers, body = await post(proxy, "/v1/chat/completions", CHAT)
    assert (code, headers["Retry-After"]) == (status, "55")
    assert body["error"]["message"].startswith(f"Upstream provider failed: upstream answered {status}")


async def test_an_upstream_retry_after_is_capped(proxy: RunningProxy, fake_upstream: FakeUpstream) -> None:
    fake_upstream.script("cheap", Fault.http(503, retry_after=86400))
    fake_upstream.script("backup", Fault.http(503, retry_after=86400))
    code, headers, _ = await post(proxy, "/v1/chat/completions", CHAT)
    assert (code, headers["Retry-After"]) == (503, str(int(RETRY_AFTER_CAP_S)))


async def test_a_breaker_skip_last_names_the_real_failure_before_it(
    proxy: RunningProxy, fake_upstream: FakeUpstream
) -> None:
    fake_upstream.script("backup", Fault.http(500))
    await post(proxy, "/v1/chat/completions", {**CHAT, "model": "up/backup"})  # opens backup's breaker
    fake_upstream.script("cheap", Fault.http(503, retry_after=45))
    code, headers, body = await post(proxy, "/v1/chat/completions", CHAT)  # cheap 503, backup skipped
    assert code == 503 and headers["Retry-After"] == "45"
    assert "upstream answered 503" in body["error"]["message"]
    assert "circuit breaker" not in body["error"]["message"]


async def test_every_breaker_open_refusal_says_when_the_first_trial_comes(
    proxy: RunningProxy, fake_upstream: FakeUpstream
) -> None:
    fake_upstream.script("cheap", Fault.http(500))
    fake_upstream.script("backup", Fault.http(500))
    await post(proxy, "/v1/chat/completions", CHAT)  # both breakers open for 30 s
    code, headers, body = await post(proxy, "/v1/chat/completions", CHAT)
    assert code == 503 and body["error"]["code"] == "provider_unavailable"
    assert 28 <= int(headers["Retry-After"]) <= 30


async def test_a_module_refused_by_open_breakers_names_the_real_failure_and_the_trial_time(
    proxy: RunningProxy, fake_upstream: FakeUpstream
) -> None:
    for model in ("cheap", "backup", "strong"):
        fake_upstream.script(model, Fault.http(503, retry_after=20))
    code, headers, envelope = await post(proxy, "/v1/modules/code-reviewer/execute", {"input": REVIEW_INPUT})
    assert (code, headers.get("Retry-After")) == (503, "20"), envelope
    code, headers, envelope = await post(proxy, "/v1/modules/code-reviewer/execute", {"input": REVIEW_INPUT})
    assert code == 503 and 28 <= int(headers["Retry-After"]) <= 30
    assert envelope["error"]["code"] == "E4001"
    assert "circuit breaker is open" in envelope["error"]["message"]


@pytest.mark.parametrize("name", ["retry-after", "RETRY-AFTER", "Retry-after"])
async def test_a_retry_after_in_any_letter_case_is_honoured(
    proxy: RunningProxy, fake_upstream: FakeUpstream, name: str
) -> None:
    """HTTP header names are case-insensitive (RFC 9110 §5.1): a provider's ``retry-after`` is its
    Retry-After (adversarial pass #29: only two spellings were read, the rest were dropped)."""
    fake_upstream.script("cheap", Fault.http(503, retry_after=55, retry_after_name=name))
    fake_upstream.script("backup", Fault.http(503, retry_after=40))
    code, headers, _ = await post(proxy, "/v1/chat/completions", CHAT)
    assert (code, headers["Retry-After"]) == (503, "55")


@pytest.mark.parametrize("value", ["9" * 10_000, "inf", "1e400", "Fri, 31 Dec 9999 23:59:59 -2359"])
async def test_a_hostile_retry_after_fails_over_and_never_crashes_the_handler(
    proxy: RunningProxy, fake_upstream: FakeUpstream, value: str
) -> None:
    """#29 adversarial pass, held: a 10 KB header is refused by aiohttp's parser (over 8 KiB: a
    transport error); infinite and year-9999 values are never waited for. The call fails over to
    the backup target and answers."""
    fake_upstream.script("cheap", Fault.http(503, retry_after=value))
    code, _, body = await post(proxy, "/v1/chat/completions", CHAT)
    assert code == 200, body
    assert [r.json["model"] for r in fake_upstream.requests if r.json] == ["cheap", "backup"]
