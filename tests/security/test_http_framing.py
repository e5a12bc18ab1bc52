"""Requests aiohttp's parser refuses (smuggling shapes, duplicate Host, oversized heads, ``*``)
are answered in the proxy's error format on both listeners, never forwarded, and never echo the
bytes the client sent.

aiohttp answered them with its own ``text/plain`` page quoting the offending bytes
("Got more than 8190 bytes when reading: bytearray(b'/v1/aaa...')").
"""

from __future__ import annotations

from pathlib import Path

import orjson
import yaml

from tests.fake_upstream import FakeUpstream
from tests.proxy_server import UPSTREAM_KEY, UPSTREAM_KEY_ENV, free_port, proxy_process
from tests.security.conftest import security_policy
from tests.security.harness import raw_http

BODY = b'{"model": "text-embedding-3-small", "input": "x"}'
MARKER = "zqxmarker"
MALFORMED = {
    "Transfer-Encoding and Content-Length": (
        b"POST /v1/embeddings HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n"
        b"Content-Type: application/json\r\nContent-Length: 4\r\nTransfer-Encoding: chunked\r\n\r\n"
        + b"%x\r\n" % len(BODY)
        + BODY
        + b"\r\n0\r\n\r\n"
    ),
    "two Content-Length": (
        b"POST /v1/embeddings HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n"
        b"Content-Length: 4\r\nContent-Length: 49\r\n\r\n" + BODY
    ),
    "duplicate Host": (
        f"GET /v1/models HTTP/1.1\r\nHost: 127.0.0.1\r\nHost: {MARKER}.example\r\nConnection: close\r\n\r\n"
    ).encode(),
    "a target past the line limit": (
        f"GET /v1/{MARKER}{'a' * 9000} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"
    ).encode(),
    "a header past the line limit": (
        f"GET /v1/models HTTP/1.1\r\nHost: 127.0.0.1\r\nX-{MARKER}: {'a' * 9000}\r\nConnection: close\r\n\r\n"
    ).encode(),
    "asterisk-form on GET": b"GET * HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n",
    "a chunk size that is not hex": (
        b"POST /v1/embeddings HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n"
        b"Transfer-Encoding: chunked\r\n\r\nzz\r\n" + BODY + b"\r\n0\r\n\r\n"
    ),
}


async def test_requests_the_parser_refuses_get_a_json_error_and_go_nowhere(
    fake_upstream: FakeUpstream, tmp_path: Path
) -> None:
    path = tmp_path / "policy.yaml"
    path.write_text(yaml.safe_dump(security_policy(fake_upstream)))
    admin = free_port()
    async with proxy_process(
        "--policy", str(path), "--admin-port", str(admin), env={UPSTREAM_KEY_ENV: UPSTREAM_KEY}
    ) as served:
        api = int(served.url.rsplit(":", 1)[1])
        for port in (api, admin):
            for what, request in MALFORMED.items():
                answer = await raw_http("127.0.0.1", port, request)
                assert answer.status == 400, (what, port, answer)
                assert answer.headers["Content-Type"].startswith("application/json"), (what, answer)
                error = orjson.loads(answer.body)["error"]
                assert error["code"] == "malformed_request" and error["type"] == "invalid_request_error"
                assert MARKER not in error["message"] and "bytearray" not in error["message"], what
                assert answer.headers.get("Connection", "").lower() == "close", what
        # OPTIONS * is valid HTTP: the API refuses the target itself, the admin port has no route
        options = b"OPTIONS * HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"
        answer = await raw_http("127.0.0.1", api, options)
        assert answer.status == 400 and orjson.loads(answer.body)["error"]["code"] == "invalid_request_target"
        answer = await raw_http("127.0.0.1", admin, options)
        assert answer.status == 404 and orjson.loads(answer.body)["error"]["code"] == "not_found"
    assert fake_upstream.requests == []
