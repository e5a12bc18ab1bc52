"""The proxy against a managed-style Redis: TLS only (a CA and certificates the test makes with
openssl, clients' certificates checked) and an ACL user holding exactly the rule
docs/deployment.md gives. Limits, the result cache and the context writes go through it; a wrong
CA or a missing command degrades (log line naming it, requests still answered), never crashes;
no log line shows a password."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml

from proxy.state.feedback import KEY_PREFIX
from tests.api.test_limits import KEYS, keyed_proxy, post_chat
from tests.api.test_routing import answer
from tests.api.test_stream_recovery import SSE
from tests.console.harness import ADMIN, CLIENT, Reviewer, send_to_review_at
from tests.console.test_console_shared import listed
from tests.context.helpers import execute
from tests.context.test_cache import REVIEW, cached_policy, review_answer
from tests.fake_upstream import FakeUpstream
from tests.paths import ROOT
from tests.proxy_server import (
    UPSTREAM_KEY,
    UPSTREAM_KEY_ENV,
    free_port,
    proxy_process,
    running_proxy,
    upstream_policy,
)
from tests.stream.client import read_sse
from tests.support.polling import eventually
from tests.support.redis_tls import TlsRedis, tls_redis
from tests.support.tls_certs import make_ca

PASSWORD = "acl-pw-5d1c-never-logged"
RPM = 4
ACL_LINE = re.compile(r"^\s*(ACL SETUSER cogproxy on .*)$", re.MULTILINE)


def documented_rule() -> list[str]:
    """The ACL rule of docs/deployment.md, as ACL SETUSER arguments (its password this test's)."""
    (line,) = ACL_LINE.findall((ROOT / "docs" / "deployment.md").read_text(encoding="utf-8"))
    words = line.split()[3:]  # after ACL SETUSER cogproxy
    assert ">PASSWORD" in words
    return [f">{PASSWORD}" if word == ">PASSWORD" else word for word in words]


@pytest.fixture(scope="module")
def tls(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TlsRedis]:
    with tls_redis(tmp_path_factory.mktemp("tls-redis")) as server:
        yield server


@pytest.fixture
async def admin(tls: TlsRedis) -> AsyncIterator[Any]:
    client = tls.admin()
    await client.flushall()
    await client.acl_log_reset()
    await client.execute_command("ACL", "DELUSER", "cogproxy")
    yield client
    await client.aclose()


def tls_settings(tls: TlsRedis, ca: Path | None = None) -> dict[str, Any]:
    certs = tls.certs
    return {
        "redis_url": tls.url(0),
        "redis_ca_file": ca or certs.ca.cert,
        "redis_cert_file": certs.client.cert,
        "redis_key_file": certs.client.key,
    }


def limited_cached_policy(fake: FakeUpstream) -> dict[str, Any]:
    return {**cached_policy(fake), "limits": {"clients": {"alice": {"rpm": RPM}}}}


async def module_call(base: str) -> tuple[int, str]:
    status, headers, _ = await execute(base, "code-reviewer", REVIEW, {"Authorization": "Bearer sk-alice"})
    return status, headers.get("X-Cognitive-Cache", "")


async def limits_cache_and_context(base: str, fake: FakeUpstream, admin: Any) -> None:
    """A miss, its write reaching Redis, a hit, then chat up to the limit: all through Redis."""
    fake.script("cheap", review_answer())
    assert await module_call(base) == (200, "miss")
    await eventually(lambda: admin.keys("cogproxy:ctx*"), "the cached answer written to Redis")
    assert await module_call(base) == (200, "hit")
    async with aiohttp.ClientSession() as session:
        statuses = [(await post_chat(session, base, "sk-alice")).status for _ in range(RPM - 1)]
    assert statuses == [200] * (RPM - 2) + [429]  # the module calls took two of the RPM
    assert await admin.keys("{cogproxy:limits}:*"), "the windows are counted in Redis"


async def streamed_module_call(base: str, fake: FakeUpstream, admin: Any) -> None:
    """A streamed answer (bob: no limit), mirrored to Redis for recovery on another replica."""
    fake.script("cheap", answer(0.92))
    headers = {**SSE, "Authorization": "Bearer sk-bob"}
    async with (
        aiohttp.ClientSession() as session,
        session.post(
            f"{base}/v1/modules/code-reviewer/execute", json={"input": REVIEW}, headers=headers
        ) as resp,
    ):
        events = await read_sse(resp)
    assert resp.status == 200 and events
    await eventually(lambda: admin.keys("*cogproxy:stream:*"), "the stream session mirrored to Redis")


async def test_limits_cache_and_context_work_over_tls_with_client_certificates(
    fake_upstream: FakeUpstream,
    tls: TlsRedis,
    admin: Any,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setenv(UPSTREAM_KEY_ENV, UPSTREAM_KEY)
    async with keyed_proxy(tmp_path, limited_cached_policy(fake_upstream), **tls_settings(tls)) as px:
        await limits_cache_and_context(px.url, fake_upstream, admin)
    out = capsys.readouterr()
    assert "limits_degraded" not in out.out + out.err and "redis_unavailable" not in out.out + out.err


async def test_a_wrong_ca_degrades_and_says_so_without_failing_a_request(
    fake_upstream: FakeUpstream,
    tls: TlsRedis,
    admin: Any,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    wrong = make_ca(tmp_path / "other", "some-other-ca")
    settings = tls_settings(tls, ca=wrong.cert)
    async with (
        keyed_proxy(tmp_path, limited_cached_policy(fake_upstream), **settings) as px,
        aiohttp.ClientSession() as session,
    ):
        statuses = [(await post_chat(session, px.url, "sk-alice")).status for _ in range(RPM + 1)]
        metrics = await (await session.get(px.url + "/metrics")).text()
    assert statuses == [200] * RPM + [429]  # the local windows enforce the limit meanwhile
    assert "cognitive_limits_degraded 1.0" in metrics
    out = capsys.readouterr()
    (line,) = [line for line in out.out.splitlines() if "proxy.limits_degraded" in line]
    assert "CERTIFICATE_VERIFY_FAILED" in line
    assert await admin.keys("*") == []  # nothing reached the server


async def test_the_documented_acl_rule_is_all_the_proxy_needs(
    fake_upstream: FakeUpstream, tls: TlsRedis, admin: Any, tmp_path: Path
) -> None:
    """``cogproxy serve`` with the TLS files, the user and the password file, as the overlay runs it."""
    await admin.execute_command("ACL", "SETUSER", "cogproxy", *documented_rule())
    (tmp_path / "keys").write_text(KEYS, encoding="utf-8")
    (tmp_path / "password").write_text(PASSWORD + "\n", encoding="utf-8")
    (tmp_path / "policy.yaml").write_text(
        yaml.safe_dump(limited_cached_policy(fake_upstream)), encoding="utf-8"
    )
    certs = tls.certs
    async with proxy_process(
        "--policy", str(tmp_path / "policy.yaml"), "--api-keys-file", str(tmp_path / "keys"),
        "--redis-url", tls.url(0), "--redis-ca-file", str(certs.ca.cert),
        "--redis-cert-file", str(certs.client.cert), "--redis-key-file", str(certs.client.key),
        "--redis-username", "cogproxy", "--redis-password-file", str(tmp_path / "password"),
        env={UPSTREAM_KEY_ENV: UPSTREAM_KEY},
    ) as served:  # fmt: skip
        await limits_cache_and_context(served.url, fake_upstream, admin)
        await streamed_module_call(served.url, fake_upstream, admin)
        clients = await admin.client_list()
        assert {c["user"] for c in clients if c["user"] != "default"} == {"cogproxy"}
    denied = await admin.acl_log()
    assert denied == [], f"the documented rule lacks what the proxy ran: {denied}"
    out, err = served.output
    assert PASSWORD not in out + err


async def test_a_user_lacking_a_command_is_named_in_the_log_and_the_proxy_keeps_serving(
    fake_upstream: FakeUpstream,
    tls: TlsRedis,
    admin: Any,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    rule = [word for word in documented_rule() if word != "+evalsha"]
    await admin.execute_command("ACL", "SETUSER", "cogproxy", *rule)
    settings = {**tls_settings(tls), "redis_username": "cogproxy", "redis_password": PASSWORD}
    async with (
        keyed_proxy(tmp_path, limited_cached_policy(fake_upstream), **settings) as px,
        aiohttp.ClientSession() as session,
    ):
        statuses = [(await post_chat(session, px.url, "sk-alice")).status for _ in range(2)]
    assert statuses == [200, 200]
    out = capsys.readouterr().out
    (line,) = [line for line in out.splitlines() if "proxy.limits_degraded" in line]
    assert "no permissions to run the 'evalsha' command" in line
    assert PASSWORD not in out


async def test_a_password_in_the_url_is_in_no_log_line(
    fake_upstream: FakeUpstream,
    tls: TlsRedis,
    admin: Any,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    await admin.execute_command("ACL", "SETUSER", "cogproxy", *documented_rule())
    wrong = "wrong-" + PASSWORD
    settings = {**tls_settings(tls), "redis_url": tls.url(0, credentials=f"cogproxy:{wrong}@")}
    async with (
        keyed_proxy(tmp_path, limited_cached_policy(fake_upstream), **settings) as px,
        aiohttp.ClientSession() as session,
    ):
        fake_upstream.script("cheap", review_answer())
        assert await module_call(px.url) == (200, "miss")
        assert (await post_chat(session, px.url, "sk-alice")).status == 200
    captured = capsys.readouterr()
    logged = captured.out + captured.err
    assert "invalid username-password pair" in logged  # the failure is said...
    assert wrong not in logged and PASSWORD not in logged  # ...the password never


async def test_the_review_console_works_as_the_documented_acl_user(
    fake_upstream: FakeUpstream, tls: TlsRedis, admin: Any, tmp_path: Path
) -> None:
    """The console on the Redis review stream: the queue, an item, a verdict (the claim script), a
    verdict that finds no record (its claim taken back), one through ``POST /v1/feedback`` (the
    item found in the stream and closed) and the reliability view (the records scanned)."""
    await admin.execute_command("ACL", "SETUSER", "cogproxy", *documented_rule())
    settings = {**tls_settings(tls), "redis_username": "cogproxy", "redis_password": PASSWORD}
    review = {"sink": "redis-stream", "stream": "cognitive:review:acl", "maxlen": 100}
    admin_port = free_port()
    async with (
        running_proxy(
            tmp_path,
            upstream_policy(fake_upstream, review=review, feedback={"max_entries": 1}),
            api_keys=frozenset({CLIENT}),
            admin_keys=frozenset({ADMIN}),
            admin_port=admin_port,
            **settings,
        ) as px,
        aiohttp.ClientSession(cookie_jar=aiohttp.CookieJar(unsafe=True)) as http,
    ):
        reviewer = Reviewer(f"http://127.0.0.1:{admin_port}", http)
        assert await reviewer.login() == 303
        # a store of one here: the first answer's record is in Redis only, and deleted there
        unrecorded, judged, by_api = [await send_to_review_at(px.base, fake_upstream) for _ in range(3)]
        paths = [await listed(reviewer, trace_id) for trace_id in (judged, unrecorded, by_api)]
        assert (await reviewer.page(paths[0]))[0] == 200
        await eventually(lambda: admin.exists(KEY_PREFIX + unrecorded), "the shared record")
        await admin.delete(KEY_PREFIX + unrecorded)
        for path, expected in ((paths[0], 303), (paths[1], 404)):
            token = await reviewer.csrf(path)
            status, _, _ = await reviewer.post(
                path.replace("?", "/verdict?"), {"csrf": token, "verdict": "correct"}
            )
            assert status == expected
        assert (await reviewer.page(paths[1]))[0] == 200
        async with http.post(
            px.base + "/feedback",
            json={"trace_id": by_api, "verdict": "incorrect"},
            headers={"Authorization": f"Bearer {CLIENT}"},
        ) as resp:
            assert resp.status == 200
        assert (await reviewer.page(paths[2]))[0] == 404
        assert (await reviewer.page("/review/reliability"))[0] == 200
    denied = await admin.acl_log()
    assert denied == [], f"the documented rule lacks what the console ran: {denied}"
