"""Finding 14: the keyed LLM API stays on loopback; the pod IP gets only the admin listener.

The proxy runs as ``cogproxy serve`` with the bind addresses the Kubernetes manifests set
(``deploy/k8s/base``), on free ports; the tests reach it over this machine's non-loopback
address, as another pod reaches the pod IP, and speak raw HTTP to the admin port.
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import orjson
import pytest
import yaml

from tests.deploy.facts import env_values, pod, proxy_container
from tests.fake_upstream import FakeUpstream
from tests.proxy_server import UPSTREAM_KEY, UPSTREAM_KEY_ENV, ServedProcess, free_port, proxy_process
from tests.security.conftest import security_policy
from tests.security.harness import Canary, raw_http, request_bytes

# Addresses whose route tells which local interface faces the network; a UDP connect sends nothing.
_PROBE_DESTINATIONS = ("192.0.2.1", "10.255.255.255", "172.31.255.255", "192.168.255.255")


def pod_ip() -> str:
    """A non-loopback IPv4 address of this machine: what another pod would connect to."""
    candidates: list[str] = []
    for destination in _PROBE_DESTINATIONS:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
            try:
                probe.connect((destination, 9))
            except OSError:
                continue
            candidates.append(probe.getsockname()[0])
    candidates += socket.gethostbyname_ex(socket.gethostname())[2]
    usable = [a for a in candidates if not ipaddress.ip_address(a).is_loopback]
    assert usable, f"this machine has no non-loopback IPv4 address to test against ({candidates})"
    return usable[0]


@dataclass(frozen=True)
class Sidecar:
    served: ServedProcess
    api_port: int
    admin_port: int


@pytest.fixture
async def sidecar(fake_upstream: FakeUpstream, tmp_path: Path) -> AsyncIterator[Sidecar]:
    """``cogproxy serve`` with the deploy's bind addresses, in front of the fake upstream."""
    deploy = env_values(proxy_container(pod("base")))
    admin_port = free_port()
    env = {
        "COGPROXY_HOST": deploy["COGPROXY_HOST"],
        "COGPROXY_ADMIN_HOST": deploy["COGPROXY_ADMIN_HOST"],
        "COGPROXY_ADMIN_PORT": str(admin_port),
        UPSTREAM_KEY_ENV: UPSTREAM_KEY,
    }
    path = tmp_path / "policy.yaml"
    path.write_text(yaml.safe_dump(security_policy(fake_upstream)))
    async with proxy_process("--policy", str(path), env=env) as served:
        yield Sidecar(served, int(served.url.rsplit(":", 1)[1]), admin_port)


async def connect_refused(host: str, port: int) -> bool:
    try:
        _, writer = await asyncio.open_connection(host, port)
    except ConnectionRefusedError:
        return True
    writer.close()
    await writer.wait_closed()
    return False


async def test_the_api_port_is_not_reachable_on_the_pod_ip(
    sidecar: Sidecar, fake_upstream: FakeUpstream
) -> None:
    address = pod_ip()
    assert await connect_refused(address, sidecar.api_port), f"the API answers on {address}"
    # The app reaches the API over localhost; probes and Prometheus reach the admin port.
    local = await raw_http("127.0.0.1", sidecar.api_port, request_bytes("GET", "/v1/models"))
    assert local.status == 200 and orjson.loads(local.body)["object"] == "list"
    for path in ("/healthz", "/readyz", "/metrics"):
        answer = await raw_http(address, sidecar.admin_port, request_bytes("GET", path, host=address))
        assert answer.status == 200, path
    metrics = await raw_http(address, sidecar.admin_port, request_bytes("GET", "/metrics"))
    assert b"cognitive_proxy_info" in metrics.body
    assert fake_upstream.requests == []


def hostile_requests(api_port: int, canary: Canary) -> list[bytes]:
    chat = orjson.dumps({"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "hi"}]})
    module = orjson.dumps({"input": {"code": "x = 1", "language": "python"}})
    return [
        request_bytes(
            "POST", "/v1/chat/completions", body=chat, headers={"Content-Type": "application/json"}
        ),
        request_bytes("POST", "/v1/modules/code-reviewer/execute", body=module),
        request_bytes("POST", "/v1/responses", body=chat),
        request_bytes("POST", "/v1/embeddings", body=b'{"model": "e", "input": "x"}'),
        request_bytes("GET", "/v1/models"),
        request_bytes("GET", "/v1/modules"),
        request_bytes("GET", "/v1/capabilities"),
        request_bytes("GET", "/v1/files/file-1/content"),
        request_bytes("GET", "/openapi.json"),
        request_bytes("GET", "/v1/../v1/models"),
        request_bytes("GET", "/healthz/../v1/models"),
        request_bytes("GET", "//v1/models"),
        request_bytes("GET", "/%2e%2e/v1/models"),
        request_bytes("GET", f"http://127.0.0.1:{api_port}/v1/models"),
        request_bytes("GET", f"{canary.url}/v1/models"),
        request_bytes("POST", "/healthz", body=chat),
        request_bytes("DELETE", "/metrics"),
    ]


async def test_the_admin_port_serves_only_health_readiness_and_metrics(
    sidecar: Sidecar, fake_upstream: FakeUpstream, canary: Canary
) -> None:
    address = pod_ip()
    for raw in hostile_requests(sidecar.api_port, canary):
        answer = await raw_http(address, sidecar.admin_port, raw)
        line = raw.split(b"\r\n", 1)[0]
        assert answer.status in (400, 404, 405), (line, answer.status, answer.body)
        error = orjson.loads(answer.body)["error"]
        assert set(error) == {"message", "type", "param", "code"}, (line, error)
    assert fake_upstream.requests == [], "the admin port reached the provider"
    assert (
        b"cognitive_requests_total"
        in (await raw_http(address, sidecar.admin_port, request_bytes("GET", "/metrics"))).body
    )
