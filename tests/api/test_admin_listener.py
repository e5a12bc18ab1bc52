"""The admin listener (``--admin-host``/``--admin-port``): probes and metrics beside the API,
and ``--metrics-port`` as its deprecated alias."""

from __future__ import annotations

import subprocess
import sys

import aiohttp
import pytest

from tests.conftest import ROOT
from tests.proxy_server import free_port, proxy_process

DEMO = str(ROOT / "policies" / "demo.yaml")


async def test_the_metrics_port_is_a_deprecated_alias_of_the_admin_port() -> None:
    port = free_port()
    async with (
        proxy_process("--policy", DEMO, "--metrics-port", str(port)) as served,
        aiohttp.ClientSession() as s,
    ):
        admin = f"http://127.0.0.1:{port}"
        assert (await s.get(admin + "/readyz")).status == 200
        assert (await s.get(admin + "/healthz")).status == 200
        assert "cognitive_proxy_info" in await (await s.get(admin + "/metrics")).text()
        refused = await s.get(admin + "/v1/models")
        assert refused.status == 404
        assert (await refused.json())["error"]["type"] == "not_found_error"
        assert (await s.get(served.url + "/v1/models")).status == 200
    assert "--metrics-port (COGPROXY_METRICS_PORT) is deprecated" in served.output[1]


async def test_the_admin_port_answers_from_the_main_runtime() -> None:
    port = free_port()
    async with (
        proxy_process("--policy", DEMO, env={"COGPROXY_ADMIN_PORT": str(port)}) as served,
        aiohttp.ClientSession() as s,
    ):
        ready = await (await s.get(f"http://127.0.0.1:{port}/readyz")).json()
        catalogue = await (await s.get(served.url + "/v1/modules")).json()
        assert ready["status"] == "ready" and ready["modules"] == len(catalogue["data"]) > 0
    assert "deprecated" not in served.output[1]


@pytest.mark.parametrize(
    ("flags", "problem"),
    [
        (["--metrics-port", "9101", "--admin-port", "9102"], "disagree"),
        (["--port", "9103", "--admin-port", "9103"], "admin_port must differ from port"),
    ],
)
def test_conflicting_admin_ports_are_refused(flags: list[str], problem: str) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "proxy", "serve", "--policy", DEMO, *flags],
        capture_output=True,
        text=True,
        timeout=30,
        cwd=ROOT,
    )
    assert done.returncode == 2 and problem in done.stderr, done.stderr
