"""Structured logs: one JSON line per request with the canonical fields; secrets never logged."""

from __future__ import annotations

import asyncio
import io
import json
import logging
import re
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import structlog
import yaml

from proxy.observability import logging as proxy_logging
from proxy.observability.logging import (
    REDACTED,
    IsoStamper,
    add_request,
    bind_request,
    configure_logging,
    redact_secrets,
    request_line,
)
from tests.api.test_routing import REVIEW_INPUT, answer, routing_policy
from tests.fake_upstream import FakeUpstream
from tests.proxy_server import UPSTREAM_KEY, UPSTREAM_KEY_ENV, proxy_process

CLIENT_KEY = "sk-client-very-secret-123"


async def test_one_json_line_per_request_and_no_secret_in_any_line(
    fake_upstream: FakeUpstream, tmp_path: Path
) -> None:
    fake_upstream.script("cheap", answer(0.3))
    fake_upstream.script("strong", answer(0.93))
    policy = tmp_path / "policy.yaml"
    policy.write_text(yaml.safe_dump(routing_policy(fake_upstream)))
    env = {UPSTREAM_KEY_ENV: UPSTREAM_KEY, "COGPROXY_API_KEYS": CLIENT_KEY}
    async with proxy_process("--policy", str(policy), "--log-format", "json", env=env) as served:
        headers = {"Authorization": f"Bearer {CLIENT_KEY}", "X-Request-Id": "req-log-1"}
        async with aiohttp.ClientSession(headers=headers) as session:
            resp = await session.post(
                served.url + "/v1/modules/code-reviewer/execute",
                json={"input": {**REVIEW_INPUT, "api_key": "sk-in-the-input-9999"}},
            )
            assert resp.status == 200
            resp = await session.post(
                served.url + "/v1/chat/completions",
                json={"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "hi"}]},
            )
            assert resp.status == 200
    stderr = served.output[1]
    lines = [json.loads(line) for line in stderr.splitlines() if line.startswith("{")]
    assert lines, stderr
    requests = [entry for entry in lines if entry["event"] == "proxy.request"]
    module_line = next(e for e in requests if e.get("module") == "code-reviewer")
    for field in (
        "trace_id",
        "route",
        "module",
        "tier",
        "decision",
        "confidence",
        "risk",
        "attempts",
        "target",
        "status",
        "upstream_ms",
        "overhead_ms",
    ):
        assert field in module_line, field
    assert module_line["trace_id"] == "req-log-1"
    assert module_line["route"] == "/v1/modules/{name}/execute"
    assert (module_line["decision"], module_line["attempts"], module_line["target"]) == (
        "escalated",
        2,
        "up/strong",
    )
    assert any(e["event"] == "proxy.escalated" and e["from_rung"] == "fast" for e in lines)
    passthrough = next(e for e in requests if e.get("module") == "none")
    assert passthrough["status"] == 200 and passthrough["target"] == "up/cheap"
    for secret in (CLIENT_KEY, UPSTREAM_KEY, "sk-in-the-input-9999"):
        assert secret not in stderr


def test_redaction_processor() -> None:
    event: dict[str, Any] = {
        "event": "x",
        "password": "hunter2",
        "api_key": "k",
        "headers": {"Authorization": "Bearer abcdefgh"},
        "note": "called with Bearer abcdefghijk and sk-proj-ABCDEFGH1234",
        "max_tokens": 10,
        "nested": [{"client_secret": "s", "ok": "fine"}],
    }
    out = redact_secrets(None, "info", event)
    assert out["password"] == out["api_key"] == out["headers"]["Authorization"] == REDACTED
    assert out["nested"][0] == {"client_secret": REDACTED, "ok": "fine"}
    assert "abcdefghijk" not in out["note"] and "ABCDEFGH1234" not in out["note"]
    assert out["max_tokens"] == 10


@pytest.mark.parametrize(
    ("text", "secret"),
    [
        ("Bearer\tabcdefghijk", "abcdefghijk"),  # a tab, no '-'
        ("BEARER\u00a0abcdefghijk", "abcdefghijk"),  # a Unicode space, upper case
        ("key=sk-abcdefgh12345", "abcdefgh12345"),  # no space at all
        ("pk-live12345678", "live12345678"),
        ("x sk-ant-api03-abcdefgh", "api03-abcdefgh"),
    ],
)
def test_the_quick_look_before_redaction_misses_no_secret(text: str, secret: str) -> None:
    """Texts with neither '-' nor white space skip the masking patterns: each neighbouring shape
    that does hold a secret must still be masked, in a value of any type the processor skips less."""
    out = redact_secrets(None, "info", {"note": text, "nested": {"ok": text}, "count": 3, "flag": True})
    assert secret not in out["note"] and secret not in out["nested"]["ok"]
    assert out["count"] == 3 and out["flag"] is True


def test_texts_without_a_secret_come_out_as_they_went_in() -> None:
    event = {"route": "/v1/chat/completions", "trace_id": "a" * 32, "note": "no-secret here"}
    assert redact_secrets(None, "info", dict(event)) == event


async def test_lines_carry_the_trace_id_of_their_own_request_and_of_tasks_it_started() -> None:
    seen: list[dict[str, Any]] = []

    async def request(trace_id: str) -> None:
        bind_request(trace_id, "/v1/chat/completions")

        async def started_by_it() -> None:
            seen.append(dict(add_request(None, "info", {"event": "proxy.review"})))

        await asyncio.create_task(started_by_it())
        seen.append(dict(add_request(None, "info", {"event": "proxy.request", "trace_id": "kept"})))

    await asyncio.gather(asyncio.create_task(request("a")), asyncio.create_task(request("b")))
    assert sorted(e["trace_id"] for e in seen if e["event"] == "proxy.review") == ["a", "b"]
    assert [e["trace_id"] for e in seen if e["event"] == "proxy.request"] == ["kept", "kept"]
    assert add_request(None, "info", {"event": "x"}) == {"event": "x"}  # no request bound here


def test_the_timestamp_is_utc_iso_with_microseconds_like_structlogs() -> None:
    ours = IsoStamper()(None, "info", {})["timestamp"]
    theirs = structlog.processors.TimeStamper(fmt="iso", utc=True)(None, "info", {})["timestamp"]
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z", ours)
    stamped = datetime.fromisoformat(ours.replace("Z", "+00:00"))
    reference = datetime.fromisoformat(theirs.replace("Z", "+00:00"))
    assert stamped.tzinfo == UTC and abs((reference - stamped).total_seconds()) < 1


@pytest.fixture
def json_sink(monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[[str], io.BytesIO]]:
    """``configure_logging("json", level)`` writing into a buffer; structlog's configuration, the
    logging module's state and the bound request are restored afterwards."""
    saved = structlog.get_config()
    root = logging.getLogger()
    monkeypatch.setattr(root, "handlers", list(root.handlers))
    monkeypatch.setattr(root, "level", root.level)
    monkeypatch.setattr(proxy_logging, "_LINES", proxy_logging._LINES)
    monkeypatch.setattr(proxy_logging, "_LEVEL", proxy_logging._LEVEL)

    def configure(level: str) -> io.BytesIO:
        sink = io.BytesIO()
        configure_logging("json", level, stream=sink)
        return sink

    yield configure
    structlog.configure(**saved)
    proxy_logging._REQUEST.set(None)  # what a test bound stays out of later tests


def lines_of(sink: io.BytesIO) -> list[dict[str, Any]]:
    lines = proxy_logging.log_lines()
    assert lines is not None
    lines.flush()
    return [json.loads(line) for line in sink.getvalue().splitlines()]


def test_the_request_line_is_the_line_structlog_writes(json_sink: Callable[[str], io.BytesIO]) -> None:
    """The request line skips structlog's dispatch, not its processors: same keys in the same
    order, redaction included, for a bound request."""
    sink = json_sink("info")
    fields: dict[str, Any] = {"method": "POST", "status": 200, "target": "up/m", "note": "Bearer abcdefghijk"}
    bind_request("trace-1", "/v1/chat/completions")
    structlog.get_logger("proxy").info("proxy.request", **fields)
    request_line("proxy.request", dict(fields))
    theirs, ours = lines_of(sink)
    assert list(ours) == list(theirs) == [*fields, "event", "trace_id", "route", "level", "timestamp"]
    assert {**ours, "timestamp": None} == {**theirs, "timestamp": None}
    assert ours["note"] == f"Bearer {REDACTED}" and ours["trace_id"] == "trace-1"


@pytest.mark.parametrize(
    "extra",
    [
        {},  # a plain line: written without the per-field redaction pass, as the same bytes
        {"note": "Bearer abcdefghijk"},
        {"detail": {"api_key": "x", "ok": 1}},
        {"ids": ["sk-abcdefghijkl"]},
        {"token": "abc"},
        {"odd": "tab\there", "wide": "a\u2003b"},
        {"level": "mine"},
    ],
)
def test_the_request_line_redacts_as_structlog_does(
    json_sink: Callable[[str], io.BytesIO], extra: dict[str, Any]
) -> None:
    """Whatever the fields, the request line is structlog's line: same keys, same order, same
    redaction (a plain line is written without the per-field pass, which would change nothing)."""
    sink = json_sink("info")
    fields: dict[str, Any] = {"method": "POST", "status": 200, "upstream_ms": 1.5, "target": "up/m", **extra}
    bind_request("0123456789abcdef0123456789abcdef", "/v1/chat/completions")
    structlog.get_logger("proxy").info("proxy.request", **fields)
    request_line("proxy.request", dict(fields))
    theirs, ours = lines_of(sink)
    assert list(ours) == list(theirs)
    assert {**ours, "timestamp": None} == {**theirs, "timestamp": None}
    assert "sk-abcdefghijkl" not in json.dumps(ours) and "abcdefghijk" not in json.dumps(ours)


def test_quiet_request_lines_are_debug_lines(json_sink: Callable[[str], io.BytesIO]) -> None:
    sink = json_sink("info")
    request_line("proxy.request", {"route_kind": "probe"}, quiet=True)
    request_line("proxy.request", {"route_kind": "api"})
    assert [line["route_kind"] for line in lines_of(sink)] == ["api"]
    sink = json_sink("debug")
    request_line("proxy.request", {"route_kind": "probe"}, quiet=True)
    assert [(line["route_kind"], line["level"]) for line in lines_of(sink)] == [("probe", "debug")]
    sink = json_sink("warning")
    request_line("proxy.request", {"route_kind": "api"})
    assert lines_of(sink) == []


def test_a_value_json_cannot_hold_is_written_as_its_repr(json_sink: Callable[[str], io.BytesIO]) -> None:
    sink = json_sink("info")
    request_line("proxy.request", {"where": Path("/x")})
    structlog.get_logger("proxy").info("proxy.request", where=Path("/x"))
    assert [line["where"] for line in lines_of(sink)] == [repr(Path("/x"))] * 2


@pytest.mark.parametrize(
    "name",
    ["aiohttp.server", "aiohttp.web", "aiohttp.access", "aiohttp.client", "aiohttp.internal", "asyncio"],
)
def test_library_records_are_redacted_json_lines(json_sink: Callable[[str], io.BytesIO], name: str) -> None:
    """A standard-library record (aiohttp's "Error handling request" traceback, asyncio's) goes
    through the proxy's processors: one JSON line, the key masked in its message and traceback."""
    sink = json_sink("info")
    try:
        raise ValueError(f"bad request b'Authorization: Bearer {CLIENT_KEY}\\n'")
    except ValueError:
        logging.getLogger(name).exception("Error handling request %s", f"Bearer {CLIENT_KEY}")
    (line,) = lines_of(sink)
    assert CLIENT_KEY not in json.dumps(line)
    assert line["logger"] == name and line["level"] == "error"
    assert line["event"] == f"Error handling request Bearer {REDACTED}"
    assert "ValueError" in line["exception"] and REDACTED in line["exception"]
