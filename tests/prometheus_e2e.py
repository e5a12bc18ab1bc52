"""A real, throwaway Prometheus server for end-to-end tests (Debian's ``prometheus`` binary).

Usage::

    async with run_prometheus(binary, tmp_path / "prom", ["127.0.0.1:8080"], rule_files=[rules]) as prom:
        await prom.wait_until_up()
        result = await prom.query('sum(rate(cognitive_requests_total[1m]))')

It always listens on a free loopback port of its own (never 9090, where a packaged Prometheus
service may run), keeps its TSDB under the given directory and is terminated on exit.
"""

from __future__ import annotations

import asyncio
import socket
import subprocess
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import yaml

from tests.support.polling import settled

JOB = "cognitive-proxy"


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


class PrometheusError(AssertionError):
    """The Prometheus server or its API did not behave (message carries the log tail)."""


@dataclass
class PrometheusServer:
    url: str
    proc: subprocess.Popen[bytes]
    log_path: Path
    session: aiohttp.ClientSession

    def log_tail(self, lines: int = 30) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return "(no log)"
        return "\n".join(text.splitlines()[-lines:])

    def _check_alive(self) -> None:
        if self.proc.poll() is not None:
            raise PrometheusError(f"prometheus exited with {self.proc.returncode}:\n{self.log_tail()}")

    async def api(self, path: str, params: dict[str, str] | None = None) -> Any:
        """GET an ``/api/v1`` endpoint; the ``data`` of a success answer, PrometheusError otherwise."""
        self._check_alive()
        async with self.session.get(f"{self.url}/api/v1/{path}", params=params) as resp:
            body = await resp.json(content_type=None)
        if body.get("status") != "success":
            raise PrometheusError(f"{path} {params}: {body.get('errorType')}: {body.get('error')}")
        return body["data"]

    async def query(self, expr: str) -> list[dict[str, Any]]:
        """Instant query (POSTed, so long expressions are fine); the result vector."""
        self._check_alive()
        async with self.session.post(f"{self.url}/api/v1/query", data={"query": expr}) as resp:
            body = await resp.json(content_type=None)
        if body.get("status") != "success":
            raise PrometheusError(f"{body.get('errorType')}: {body.get('error')}")
        result: list[dict[str, Any]] = body["data"]["result"]
        return result

    async def wait_until_up(self, timeout: float = 15.0) -> None:
        """Until every scrape target has been scraped successfully (health "up")."""

        async def active() -> list[dict[str, Any]]:
            targets: list[dict[str, Any]] = (await self.api("targets"))["activeTargets"]
            return targets

        def up(targets: list[dict[str, Any]]) -> bool:
            return bool(targets) and all(t["health"] == "up" for t in targets)

        targets = await settled(active, ready=up, timeout=timeout, step=0.2)
        if up(targets):
            return
        states = [(t["scrapeUrl"], t["health"], t.get("lastError")) for t in targets]
        raise PrometheusError(f"targets never came up: {states}\n{self.log_tail()}")


def write_config(
    path: Path, targets: Sequence[str], rule_files: Sequence[Path] = (), interval: str = "1s"
) -> Path:
    """A prometheus.yml scraping ``targets`` (host:port, path /metrics) every ``interval``."""
    config = {
        "global": {"scrape_interval": interval, "scrape_timeout": interval, "evaluation_interval": interval},
        "rule_files": [str(p) for p in rule_files],
        "scrape_configs": [
            {"job_name": JOB, "metrics_path": "/metrics", "static_configs": [{"targets": list(targets)}]}
        ],
    }
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


@asynccontextmanager
async def run_prometheus(
    binary: str,
    workdir: Path,
    targets: Sequence[str],
    *,
    rule_files: Sequence[Path] = (),
    interval: str = "1s",
    start_timeout: float = 20.0,
) -> AsyncIterator[PrometheusServer]:
    """Start ``binary`` on a free loopback port scraping ``targets``; terminate it on exit."""
    workdir.mkdir(parents=True, exist_ok=True)
    config = write_config(workdir / "prometheus.yml", targets, rule_files, interval)
    port = free_port()
    log_path = workdir / "prometheus.log"
    with log_path.open("wb") as log:
        proc = subprocess.Popen(
            [
                binary,
                f"--config.file={config}",
                f"--storage.tsdb.path={workdir / 'data'}",
                f"--web.listen-address=127.0.0.1:{port}",
                "--log.level=info",
            ],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    try:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as session:
            server = PrometheusServer(f"http://127.0.0.1:{port}", proc, log_path, session)
            await _wait_ready(server, start_timeout)
            yield server
    finally:
        proc.terminate()
        try:
            await asyncio.to_thread(proc.wait, 10)
        except subprocess.TimeoutExpired:
            proc.kill()
            await asyncio.to_thread(proc.wait)


async def _wait_ready(server: PrometheusServer, timeout: float) -> None:
    async def ready() -> bool:
        server._check_alive()
        try:
            async with server.session.get(server.url + "/-/ready") as resp:
                return resp.status == 200
        except aiohttp.ClientError:
            return False

    if await settled(ready, timeout=timeout, step=0.1):
        return
    raise PrometheusError(f"prometheus not ready after {timeout} s:\n{server.log_tail()}")
