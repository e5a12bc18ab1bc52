"""Arize Phoenix, a real OTLP trace store, on free loopback ports with a working directory of its
own: the ``phoenix`` executable of the venv ``make phoenix`` builds (``.venv-phoenix``; its heavy
dependencies stay out of the proxy's). Spans are read back over its REST API
(``GET /v1/projects/{project}/spans``), as Phoenix stored them."""

from __future__ import annotations

import os
import subprocess
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp

from tests.proxy_server import free_port
from tests.support.polling import eventually, wait_sync

ROOT = Path(__file__).resolve().parents[2]
EXECUTABLE = ROOT / ".venv-phoenix" / "bin" / "phoenix"
START_TIMEOUT_S = 120.0
"""Its first start creates its database (measured ~12 s on this project's machine; 2 shared cores)."""


@dataclass(frozen=True)
class PhoenixSpan:
    """A span as Phoenix serves it: OpenTelemetry ids in hex, attributes flat."""

    name: str
    trace_id: str
    span_id: str
    parent_id: str | None
    status_code: str
    attributes: dict[str, Any]
    events: tuple[tuple[str, dict[str, Any]], ...]

    @classmethod
    def of(cls, data: dict[str, Any]) -> PhoenixSpan:
        return cls(
            data["name"],
            data["context"]["trace_id"],
            data["context"]["span_id"],
            data.get("parent_id"),
            data["status_code"],
            data.get("attributes") or {},
            tuple((e["name"], e.get("attributes") or {}) for e in data.get("events") or ()),
        )


@dataclass(frozen=True)
class Phoenix:
    url: str
    """Its HTTP port: the UI, the REST API and the OTLP/HTTP receiver (``/v1/traces``)."""

    async def spans(self, project: str, trace_id: str) -> list[PhoenixSpan]:
        """Every span of ``trace_id`` stored in ``project`` so far (none while it does not exist)."""
        url = f"{self.url}/v1/projects/{project}/spans"
        params = {"trace_id": trace_id, "limit": "1000"}
        async with aiohttp.ClientSession() as session, session.get(url, params=params) as resp:
            if resp.status == 404:  # the project is made by the first span sent to it
                return []
            assert resp.status == 200, await resp.text()
            body = await resp.json()
        return [PhoenixSpan.of(s) for s in body["data"]]

    async def trace(self, project: str, trace_id: str, count: int) -> list[PhoenixSpan]:
        """The trace once Phoenix holds ``count`` spans of it (export is batched, in the background)."""
        return await eventually(
            lambda: self.spans(project, trace_id),
            f"{count} spans of trace {trace_id} in Phoenix",
            ready=lambda spans: len(spans) >= count,
            timeout=30.0,
        )


def _healthy(url: str) -> bool:
    with urllib.request.urlopen(f"{url}/healthz", timeout=2) as resp:
        return bool(resp.status == 200)


@contextmanager
def phoenix_server(working_dir: Path) -> Iterator[Phoenix]:
    """``phoenix serve`` on free ports, its database under ``working_dir``; stopped after."""
    port, grpc_port = free_port(), free_port()
    env = {
        **os.environ,
        "PHOENIX_WORKING_DIR": str(working_dir),
        "PHOENIX_HOST": "127.0.0.1",
        "PHOENIX_PORT": str(port),
        "PHOENIX_GRPC_PORT": str(grpc_port),
        "PHOENIX_TELEMETRY_ENABLED": "false",
    }
    log = (working_dir / "phoenix.log").open("w")
    proc = subprocess.Popen([str(EXECUTABLE), "serve"], env=env, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_sync(
            lambda: _healthy(url),
            f"Phoenix serving on {url} (log: {working_dir / 'phoenix.log'})",
            timeout=START_TIMEOUT_S,
            step=0.2,
            ignore=(urllib.error.URLError, ConnectionError),
            give_up=lambda: None if proc.poll() is None else f"phoenix exited {proc.returncode}",
        )
        yield Phoenix(url)
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()
