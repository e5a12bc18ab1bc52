"""Provider failure -> HTTP answer (``api.failures``), walked kind by kind: in-process for the pure
mapping, then through a served proxy against the fake upstream's faults for chat completions
(``failed_call``) and the ``/v1/*`` reverse proxy (``failed_relay``). The expected answers are
written out here, not read from the module's table."""

from __future__ import annotations

from typing import Any, get_args

import aiohttp
import orjson
import pytest

from proxy.api.failures import (
    FAILURE_ANSWERS,
    broken_stream_event,
    failed_call,
    failed_relay,
)
from proxy.contract.errors import Code, http_status
from proxy.upstream.base import FailureKind, ProviderError
from proxy.upstream.router import RungFailed
from tests.fake_upstream import DROP, FakeUpstream, Fault
from tests.proxy_server import RunningProxy, upstream_policy

# kind, upstream status, the failure's Retry-After -> status, type, code, Retry-After header
PROXY_ANSWERS: list[tuple[FailureKind, int | None, float | None, int, str, str, str | None]] = [
    ("connect", None, None, 502, "server_error", "upstream_error", None),
    ("server_error", 500, None, 502, "server_error", "upstream_error", None),
    ("server_error", 503, 2.5, 503, "server_error", "upstream_unavailable", "3"),
    ("server_error", 503, None, 503, "server_error", "upstream_unavailable", "1"),
    ("malformed", 200, None, 502, "server_error", "upstream_error", None),
    ("timeout", None, None, 504, "server_error", "upstream_timeout", None),
    ("rate_limited", 429, 7.0, 429, "rate_limit_error", "rate_limited", "7"),
    ("rate_limited", 429, None, 429, "rate_limit_error", "rate_limited", "1"),
    ("client_error", 400, None, 400, "invalid_request_error", "upstream_client_error", None),
]


def answer_of(response: Any) -> tuple[int, dict[str, Any], str | None]:
    return response.status, orjson.loads(response.body), response.headers.get("Retry-After")


def test_every_failure_kind_has_an_answer() -> None:
    assert set(FAILURE_ANSWERS) == set(get_args(FailureKind))


def test_module_calls_answer_the_same_statuses_in_their_envelopes() -> None:
    """Every provider rate limited: 429 (E4002); none available: 503 (E4001), as the table says."""
    assert http_status(Code.RATE_LIMITED) == FAILURE_ANSWERS["rate_limited"].status == 429
    assert http_status(Code.PROVIDER_UNAVAILABLE) == FAILURE_ANSWERS["circuit_open"].status == 503


@pytest.mark.parametrize(
    ("kind", "upstream", "retry_after", "status", "type_", "code", "header"), PROXY_ANSWERS
)
def test_a_failure_without_an_upstream_answer_to_pass_on_is_the_proxys_error(
    kind: FailureKind,
    upstream: int | None,
    retry_after: float | None,
    status: int,
    type_: str,
    code: str,
    header: str | None,
) -> None:
    """No body to pass on (a client error without one included): the proxy's OpenAI error, the
    same from both mappings."""
    failure = ProviderError(kind, "boom", status=upstream, retry_after=retry_after)
    for mapping in (failed_call, failed_relay):
        got_status, body, got_header = answer_of(mapping(RungFailed([failure])))
        assert (got_status, got_header) == (status, header)
        assert body["error"] == {
            "message": "Upstream provider failed: boom",
            "type": type_,
            "param": None,
            "code": code,
        }


def test_the_largest_retry_after_of_the_tries_wins_over_the_last_failures_own() -> None:
    tries = [
        ProviderError("rate_limited", "a", status=429, retry_after=30.0),
        ProviderError("rate_limited", "b", status=429, retry_after=4.0),
    ]
    status, body, header = answer_of(failed_call(RungFailed(tries)))
    assert (status, header) == (429, "30") and body["error"]["message"] == "Upstream provider failed: b"


def test_a_breaker_skip_after_a_real_failure_names_the_real_one() -> None:
    tries = [
        ProviderError("timeout", "slow", status=None),
        ProviderError("circuit_open", "skipped", retry_after=12.0),
    ]
    status, body, header = answer_of(failed_call(RungFailed(tries)))
    assert (status, body["error"]["code"], header) == (504, "upstream_timeout", None)


@pytest.mark.parametrize(
    ("failures", "message", "header"),
    [
        ([ProviderError("circuit_open", "x", retry_after=12.2)], "circuit breakers open", "13"),
        ([], "no provider target", "1"),
    ],
)
def test_nothing_sent_is_the_proxys_503_with_the_time_until_a_trial(
    failures: list[ProviderError], message: str, header: str
) -> None:
    for mapping in (failed_call, failed_relay):
        status, body, got_header = answer_of(mapping(RungFailed(failures)))
        assert (status, got_header) == (503, header)
        assert body["error"] == {
            "message": f"Every provider target is unavailable ({message})",
            "type": "server_error",
            "param": None,
            "code": "provider_unavailable",
        }


def test_a_chat_call_passes_an_upstream_client_error_on_as_it_came() -> None:
    sent = ProviderError(
        "client_error",
        "upstream answered 422",
        status=422,
        body=b'{"error": "theirs"}',
        headers={"Content-Type": "application/problem+json; charset=utf-8", "X-Theirs": "1"},
    )
    for failed in (RungFailed([sent]), RungFailed([], final=sent)):
        response = failed_call(failed)
        assert (response.status, response.body) == (422, b'{"error": "theirs"}')
        assert response.content_type == "application/problem+json" and "X-Theirs" not in response.headers


def test_a_relayed_call_passes_any_upstream_answer_on_with_the_largest_retry_after() -> None:
    first = ProviderError("server_error", "503", status=503, retry_after=40.0, body=b"first")
    last = ProviderError(
        "server_error",
        "503",
        status=503,
        retry_after=5.0,
        body=b"last",
        headers={"retry-after": "5", "Set-Cookie": "a=b", "Connection": "close", "X-Request-Id": "r1"},
    )
    response = failed_relay(RungFailed([first, last]))
    assert (response.status, response.body) == (503, b"last")
    assert response.headers["Retry-After"] == "40" and response.headers["X-Request-Id"] == "r1"
    assert "Set-Cookie" not in response.headers and "Connection" not in response.headers


@pytest.mark.parametrize(
    ("named", "event"),
    [
        (False, b'data: {"error":{"message":"Upstream stream failed (stalled): no chunk in 5 s",'),
        (True, b'event: error\ndata: {"type":"error","code":"upstream_stream_error",'),
    ],
)
def test_a_stream_broken_after_its_first_byte_ends_with_one_error_event(named: bool, event: bytes) -> None:
    sent = broken_stream_event("stalled", "no chunk in 5 s", named=named)
    assert sent.startswith(event) and sent.endswith(b"\n\n") and sent.count(b"\n\n") == 1
    data = orjson.loads(sent.split(b"data: ", 1)[1])
    assert data["error"]["code"] == "upstream_stream_error" and data["error"]["type"] == "server_error"


# -- through a served proxy against the fake upstream ----------------------------------------------

PER_TRY_S = 0.3
SLOW = Fault.slow(PER_TRY_S * 10)
FAKE_ERROR = "fake upstream fault: HTTP {}"


@pytest.fixture
def policy(fake_upstream: FakeUpstream) -> dict[str, Any]:
    """Any ``up/<model>``, one try each: every case its own target, so no breaker opens."""
    doc = upstream_policy(
        fake_upstream,
        failover={"retries": 0, "timeout": {"per_try_s": PER_TRY_S, "total_s": 5}},
    )
    doc["providers"]["up"]["allow_any_model"] = True
    return doc


async def post(px: RunningProxy, path: str, body: dict[str, Any]) -> tuple[int, dict[str, str], Any]:
    async with aiohttp.ClientSession() as session:
        resp = await session.post(px.base + path, json=body, headers={"Authorization": "Bearer sk-c"})
        return resp.status, dict(resp.headers), await resp.json(content_type=None)


# fault -> status, code (None: the upstream's own body), Retry-After
CHAT_FAULTS: list[tuple[Fault, int, str | None, str | None]] = [
    (DROP, 502, "upstream_error", None),
    (Fault.http(500), 502, "upstream_error", None),
    (Fault.malformed(), 502, "upstream_error", None),
    (Fault.http(503, retry_after=7), 503, "upstream_unavailable", "7"),
    (Fault.http(429, retry_after=7), 429, "rate_limited", "7"),
    (SLOW, 504, "upstream_timeout", None),
    (Fault.http(400), 400, None, None),
]


async def test_chat_completions_answer_each_failure_kind_from_the_table(
    proxy: RunningProxy, fake_upstream: FakeUpstream
) -> None:
    for i, (fault, status, code, retry_after) in enumerate(CHAT_FAULTS):
        fake_upstream.script(f"case-{i}", fault)
        chat = {"model": f"up/case-{i}", "messages": [{"role": "user", "content": "hi"}]}
        got, headers, body = await post(proxy, "/chat/completions", chat)
        assert (got, headers.get("Retry-After")) == (status, retry_after), (fault, body)
        if code is None:  # the upstream's own answer, as it came
            assert body["error"]["message"] == FAKE_ERROR.format(status)
        else:
            assert body["error"]["code"] == code and body["error"]["message"].startswith("Upstream provider")


# fault -> status, code (None: the upstream's own answer), Retry-After
RELAY_FAULTS: list[tuple[Fault, int, str | None, str | None]] = [
    (DROP, 502, "upstream_error", None),
    (SLOW, 504, "upstream_timeout", None),
    (Fault.http(500), 500, None, None),
    (Fault.http(503, retry_after=7), 503, None, "7"),
    (Fault.http(429, retry_after=7), 429, None, "7"),
    (Fault.http(404), 404, None, None),
]


async def test_the_reverse_proxy_passes_on_the_upstreams_answer_else_the_tables(
    proxy: RunningProxy, fake_upstream: FakeUpstream
) -> None:
    for i, (fault, status, code, retry_after) in enumerate(RELAY_FAULTS):
        fake_upstream.script(f"embed-{i}", fault)
        got, headers, body = await post(proxy, "/embeddings", {"model": f"embed-{i}", "input": "x"})
        assert (got, headers.get("Retry-After")) == (status, retry_after), (fault, body)
        if code is None:  # the upstream's own answer, its headers with it
            assert body["error"]["message"] == FAKE_ERROR.format(status)
            assert "x-request-id" in {name.lower() for name in headers}
        else:
            assert body["error"]["code"] == code and body["error"]["message"].startswith("Upstream provider")
