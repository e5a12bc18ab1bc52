"""Finding 11: a browser page (cross-site request, DNS rebinding) cannot use a keyless proxy
bound to loopback. The guard applies only on loopback binds without client keys."""

from __future__ import annotations

from pathlib import Path

import orjson
import yaml

from tests.fake_upstream import FakeUpstream
from tests.proxy_server import UPSTREAM_KEY, UPSTREAM_KEY_ENV, ServedProcess, proxy_process
from tests.security.conftest import security_policy
from tests.security.harness import raw_http, request_bytes

CHAT = orjson.dumps({"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "hi"}]})


def port_of(served: ServedProcess) -> int:
    return int(served.url.rsplit(":", 1)[1])


async def chat(port: int, host: str, headers: dict[str, str] | None = None) -> tuple[int, dict[str, object]]:
    answer = await raw_http(
        "127.0.0.1",
        port,
        request_bytes(
            "POST",
            "/v1/chat/completions",
            host=host,
            headers={"Content-Type": "text/plain", **(headers or {})},
            body=CHAT,
        ),
    )
    return answer.status, orjson.loads(answer.body)


async def test_a_foreign_host_is_refused_on_a_keyless_loopback_proxy(
    served: ServedProcess, fake_upstream: FakeUpstream
) -> None:
    port = port_of(served)
    for host in ("evil.example", f"evil.example:{port}", "127.0.0.1.evil.example", "localhost.evil"):
        status, body = await chat(port, host)
        assert status == 403, host
        assert body["error"]["code"] == "host_not_allowed"  # type: ignore[index]
    assert fake_upstream.count("/v1/chat/completions") == 0


async def test_a_cross_site_origin_is_refused_on_a_keyless_loopback_proxy(
    served: ServedProcess, fake_upstream: FakeUpstream
) -> None:
    port = port_of(served)
    for origin in ("https://evil.example", "null", f"http://127.0.0.1:{port}"):
        status, body = await chat(port, f"127.0.0.1:{port}", {"Origin": origin})
        assert status == 403, origin
        assert body["error"]["code"] == "origin_not_allowed"  # type: ignore[index]
    assert fake_upstream.count("/v1/chat/completions") == 0


async def test_loopback_names_without_origin_are_served(served: ServedProcess) -> None:
    port = port_of(served)
    for host in ("localhost", f"localhost:{port}", "127.0.0.1", f"[::1]:{port}", "LOCALHOST"):
        status, _ = await chat(port, host)
        assert status == 200, host
    health = await raw_http("127.0.0.1", port, request_bytes("GET", "/healthz", host=f"127.0.0.1:{port}"))
    assert health.status == 200


async def test_configured_hosts_and_origins_are_served(fake_upstream: FakeUpstream, tmp_path: Path) -> None:
    path = tmp_path / "policy.yaml"
    path.write_text(yaml.safe_dump(security_policy(fake_upstream)))
    async with proxy_process(
        "--policy",
        str(path),
        "--allowed-hosts",
        "proxy.internal,Dev.Box",
        "--allowed-origins",
        "http://localhost:3000",
        env={UPSTREAM_KEY_ENV: UPSTREAM_KEY},
    ) as served:
        port = port_of(served)
        assert (await chat(port, "proxy.internal:9999"))[0] == 200
        assert (await chat(port, "dev.box"))[0] == 200
        assert (await chat(port, "localhost", {"Origin": "http://localhost:3000"}))[0] == 200
        assert (await chat(port, "localhost", {"Origin": "http://localhost:3001"}))[0] == 403
        assert (await chat(port, "other.internal"))[0] == 403


async def test_the_guard_is_off_with_client_keys_or_a_non_loopback_bind(
    fake_upstream: FakeUpstream, tmp_path: Path
) -> None:
    path = tmp_path / "policy.yaml"
    path.write_text(yaml.safe_dump(security_policy(fake_upstream)))
    env = {UPSTREAM_KEY_ENV: UPSTREAM_KEY}
    async with proxy_process("--policy", str(path), "--api-keys", "sk-client-1", env=env) as served:
        headers = {"Authorization": "Bearer sk-client-1", "Origin": "https://app.example"}
        assert (await chat(port_of(served), "api.example", headers))[0] == 200
    async with proxy_process("--policy", str(path), "--host", "0.0.0.0", env=env) as served:
        port = port_of(served)
        probe = await raw_http("127.0.0.1", port, request_bytes("GET", "/healthz", host=f"10.0.0.5:{port}"))
        assert probe.status == 200
        assert (await chat(port, "pod.cluster.local"))[0] == 200
