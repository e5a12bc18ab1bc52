"""`make run` as the README writes it: on another port by `PORT=` or by `COGPROXY_PORT`, with the
review console behind the demo admin key it prints, where the demo's reviewed answers appear."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import aiohttp
import pytest

from tests.console.harness import Reviewer
from tests.paths import ROOT
from tests.proxy_server import Drain, free_port, wait_ready

MAKE = shutil.which("make")
BIN = str(Path(sys.executable).parent)


@asynccontextmanager
async def make_run(args: list[str], env: dict[str, str], port: int) -> AsyncIterator[Drain]:
    """`make run` in the repository (the install step taken as done), until /readyz answers on
    ``port``; its standard output."""
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
    try:
        await wait_ready(f"http://127.0.0.1:{port}", proc, out, err)
        yield out
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=30)


async def first_model(url: str) -> str:
    async with aiohttp.ClientSession() as session, session.get(url + "/v1/models") as resp:
        assert resp.status == 200
        models = await resp.json()
    return str(models["data"][0]["id"])


@pytest.mark.parametrize("how", ["PORT=", "COGPROXY_PORT="])
async def test_make_run_serves_the_demo_on_the_port_asked_for(how: str) -> None:
    port, admin_port = free_port(), free_port()
    args, env = ([f"PORT={port}"], {}) if how == "PORT=" else ([], {"COGPROXY_PORT": str(port)})
    async with make_run([*args, f"ADMIN_PORT={admin_port}"], env, port):
        assert await first_model(f"http://127.0.0.1:{port}")


CONSOLE_LINE = re.compile(
    r"Review console: (http://127\.0\.0\.1:(\d+)/review/) - log in with the demo admin key (\S+) "
)


async def test_make_run_prints_a_console_login_where_the_demos_reviewed_answers_wait() -> None:
    port, admin_port = free_port(), free_port()
    async with make_run([f"PORT={port}", f"ADMIN_PORT={admin_port}"], {}, port) as out:
        found = CONSOLE_LINE.search(out.text())
        assert found, out.text()[:500]
        console, printed_port, key = found.groups()
        assert int(printed_port) == admin_port and key.startswith("sk-demo-admin-") and len(key) > 40
        async with aiohttp.ClientSession() as api:  # the tour's step 5: your own input goes to review
            mine = {"code": "def add(a, b):\n    return a+b\n", "language": "python"}
            async with api.post(
                f"http://127.0.0.1:{port}/v1/modules/code-reviewer/execute", json={"input": mine}
            ) as resp:
                assert resp.headers["X-Cognitive-Decision"] == "review"
                trace_id = resp.headers["X-Cognitive-Trace-Id"]
        async with aiohttp.ClientSession(cookie_jar=aiohttp.CookieJar(unsafe=True)) as http:
            reviewer = Reviewer(console.removesuffix("/review/"), http)
            assert await reviewer.login("sk-demo-admin-wrong") == 403
            assert await reviewer.login(key) == 303
            status, queue = await reviewer.page("/review/")
            assert status == 200 and trace_id in queue and "code-reviewer" in queue
    assert out.text().count(key) == 1  # printed once, and never logged
