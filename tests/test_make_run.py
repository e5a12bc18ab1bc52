"""`make run` as the README writes it: on another port by `PORT=` or by `COGPROXY_PORT`."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import aiohttp
import pytest

from tests.paths import ROOT
from tests.proxy_server import Drain, free_port, wait_ready

MAKE = shutil.which("make")
BIN = str(Path(sys.executable).parent)


async def serve_with_make(args: list[str], env: dict[str, str], port: int) -> str:
    """`make run` in the repository (the install step taken as done), until /readyz answers on ``port``."""
    assert MAKE is not None
    proc = subprocess.Popen(
        [MAKE, "-s", "-o", "install", "run", f"BIN={BIN}", *args],
        cwd=ROOT,
        env={**os.environ, **env},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    assert proc.stdout is not None and proc.stderr is not None
    out, err = Drain(proc.stdout), Drain(proc.stderr)
    url = f"http://127.0.0.1:{port}"
    try:
        await wait_ready(url, proc, out, err)
        async with aiohttp.ClientSession() as session, session.get(url + "/v1/models") as resp:
            assert resp.status == 200
            models = await resp.json()
        return str(models["data"][0]["id"])
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=30)


@pytest.mark.parametrize("how", ["PORT=", "COGPROXY_PORT="])
async def test_make_run_serves_the_demo_on_the_port_asked_for(how: str) -> None:
    port = free_port()
    args, env = ([f"PORT={port}"], {}) if how == "PORT=" else ([], {"COGPROXY_PORT": str(port)})
    assert await serve_with_make(args, env, port)
