"""No client key reaches a log line through aiohttp's own loggers: a request the HTTP parser
refuses made aiohttp write "Error handling request" with a traceback quoting the raw request
bytes, around the proxy's redaction. Every malformed shape of the framing suite, bare-LF line
ends and a header value ending in a control byte, each carrying ``Authorization: Bearer``, in both
log formats: the key is nowhere in stdout or stderr, and in the JSON format every stderr line is
one JSON object."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest
import yaml

from tests.fake_upstream import FakeUpstream
from tests.proxy_server import UPSTREAM_KEY, UPSTREAM_KEY_ENV, proxy_process
from tests.security.conftest import security_policy
from tests.security.harness import raw_http
from tests.security.test_http_framing import MALFORMED

CANARY = "sk-canary7f3e9d2b1a0c4e6f"
PLAIN = "zqplaincanary42"
"""A secret no redaction pattern knows (no ``sk-``, no ``Bearer``): only never quoting the
client's bytes keeps it out of the log."""
AUTH = f"Authorization: Bearer {CANARY}".encode()


def with_key(request: bytes) -> bytes:
    """``request`` with the key's header right after its request line (before any bad byte)."""
    line, sep, rest = request.partition(b"\r\n")
    return line + sep + AUTH + sep + rest


SHAPES: dict[str, bytes] = {
    **{what: with_key(request) for what, request in MALFORMED.items()},
    "bare LF line ends": (b"POST /v1/files HTTP/1.1\nHost: localhost\n" + AUTH + b"\nContent-Length: 0\n\n"),
    "a header value ending in \\x01": (
        b"POST /v1/files HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n"
        + AUTH
        + b"\x01\r\nContent-Length: 0\r\n\r\n"
    ),
    "a plain key ending in \\x01": (
        b"GET /v1/models HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n"
        + AUTH
        + b"\r\nX-Api-Key: "
        + PLAIN.encode()
        + b"\x01\r\n\r\n"
    ),
    "a method that is not one, first on its connection": (
        f"{PLAIN}\x01 /v1/models HTTP/1.1\r\nHost: x\r\n".encode() + AUTH + b"\r\n\r\n"
    ),
    "TLS bytes on the plain port": (
        b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03" + PLAIN.encode() + b"\r\n\r\n"
    ),
    "the key itself ending in \\x01": (
        b"GET /v1/models HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\nX-Api-Key: "
        + CANARY.encode()
        + b"\x01\r\n"
        + AUTH
        + b"\r\n\r\n"
    ),
}


@pytest.mark.parametrize("fmt", ["json", "console"])
async def test_a_refused_request_never_puts_the_key_in_a_log(
    fake_upstream: FakeUpstream, tmp_path: Path, fmt: str
) -> None:
    path = tmp_path / "policy.yaml"
    path.write_text(yaml.safe_dump(security_policy(fake_upstream)))
    args = ("--policy", str(path), "--log-format", fmt, "--log-level", "debug")
    async with proxy_process(*args, env={UPSTREAM_KEY_ENV: UPSTREAM_KEY}) as served:
        port = int(served.url.rsplit(":", 1)[1])
        for what, request in SHAPES.items():
            answer = await raw_http("127.0.0.1", port, request)
            assert answer.status == 400, (what, answer)
    stdout, stderr = served.output
    assert CANARY not in stdout + stderr
    assert CANARY[3:] not in stdout + stderr  # not even without its prefix
    assert PLAIN not in stdout + stderr, stderr
    assert "Error handling request" not in stderr  # aiohttp's traceback is replaced by one line
    assert stderr.count("proxy.malformed_request") >= len(SHAPES)
    if fmt == "json":
        for line in stderr.splitlines():
            assert isinstance(orjson.loads(line), dict), line
