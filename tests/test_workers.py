"""``cogproxy serve --workers N``: real worker processes on one port behind their supervisor.

Which worker answered is read from ``/readyz`` (each new connection lands on any worker), so
the tests see both workers serve, their counters add up, a killed one replaced, SIGHUP reach
both, and SIGTERM or the parent's death leave no process behind."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from proxy.cli import main
from proxy.settings import MAX_WORKERS
from proxy.state.spool import SPOOL_FILE, adopt_spools, spool_dir_of
from proxy.supervisor import METRICS_DIR_PREFIX, Plan, Supervisor, backoff, make_metrics_dir
from tests.conftest import MODULES, ROOT
from tests.fake_upstream import FakeUpstream, Fault
from tests.proxy_server import (
    UPSTREAM_KEY,
    UPSTREAM_KEY_ENV,
    ServedProcess,
    free_port,
    proxy_process,
    upstream_policy,
)
from tests.support.polling import eventually
from tests.support.redis_server import redis_url

REDIS_URL = redis_url(15)
WORKERS = ("--workers", "2")
ENV = {UPSTREAM_KEY_ENV: UPSTREAM_KEY}
CHAT = {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "hi"}]}
POLL_ROUNDS = 400
"""Connections held open before giving up on reaching both workers once both listen: each lands on
a worker the kernel picks by hashing the connection, so 400 misses in a row is ~2^-400."""
POLL_TIMEOUT_S = 20.0
"""Workers start, copy their gauges and reload on their own clocks: waited for up to 20 s. Fresh
connections land on a worker the kernel picks by hashing the connection, among the workers
listening by then: a count of tries (400 once) could run out before a loaded machine's second
worker had bound the port."""


def write_policy(tmp_path: Path, fake: FakeUpstream) -> Path:
    path = tmp_path / "policy.yaml"
    path.write_text(yaml.safe_dump(upstream_policy(fake)))
    return path


async def answered_by(url: str) -> int:
    """The pid of the worker that answers ``/readyz`` on a new connection."""
    async with aiohttp.ClientSession() as session, session.get(url + "/readyz") as resp:
        body = await resp.json()
    pid: int = body["worker"]["pid"]
    return pid


async def worker_pids(url: str, count: int = 2, *, besides: frozenset[int] = frozenset()) -> set[int]:
    """Poll ``/readyz`` on new connections until ``count`` workers not in ``besides`` answered."""
    seen: set[int] = set()

    async def answering() -> set[int]:
        with_pid = await answered_by(url)
        if with_pid not in besides:
            seen.add(with_pid)
        return seen

    what = f"{count} workers answering /readyz"
    return await eventually(answering, what, ready=lambda pids: len(pids) == count, timeout=POLL_TIMEOUT_S)


def total(text: str, name: str, **labels: str) -> float:
    """The sum of the samples called ``name`` whose labels include ``labels``."""
    return sum(
        sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == name and labels.items() <= sample.labels.items()
    )


async def scrape(url: str) -> str:
    async with aiohttp.ClientSession() as session, session.get(url + "/metrics") as resp:
        return await resp.text()


async def reaches(url: str, expected: float, name: str, **labels: str) -> str:
    """Scrape until ``name`` (with ``labels``) totals ``expected`` (a request may be counted just
    after its answer left); the last scrape."""

    async def counted() -> tuple[float, str]:
        text = await scrape(url)
        return total(text, name, **labels), text

    what = f"{name}{labels} totalling {expected}"
    return (await eventually(counted, what, ready=lambda seen: seen[0] == expected, timeout=POLL_TIMEOUT_S))[
        1
    ]


def running(pid: int) -> bool:
    """True while ``pid`` exists and is not a zombie (an orphan's zombie waits for init)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state != "Z"


def events(served: ServedProcess, name: str) -> list[dict[str, Any]]:
    lines = served.stderr.text().splitlines()
    return [e for e in (json.loads(line) for line in lines if line.startswith("{")) if e["event"] == name]


async def chat(session: aiohttp.ClientSession, url: str) -> int:
    async with session.post(url + "/v1/chat/completions", json=CHAT) as resp:
        await resp.read()
        return resp.status


async def test_two_workers_serve_the_port_and_their_counters_add_up(tmp_path: Path) -> None:
    async with (
        FakeUpstream.start() as fake,
        proxy_process("--policy", str(write_policy(tmp_path, fake)), *WORKERS, env=ENV) as served,
    ):
        before = total(await scrape(served.url), "cognitive_requests_total", route="/readyz")
        seen: set[int] = set()
        asked = 0
        deadline = asyncio.get_running_loop().time() + POLL_TIMEOUT_S
        while len(seen) < 2 and asyncio.get_running_loop().time() < deadline:
            seen.add(await answered_by(served.url))
            asked += 1
        assert len(seen) == 2 and all(running(pid) for pid in seen)
        # Answered by both workers, counted once each, summed:
        await reaches(served.url, before + asked, "cognitive_requests_total", route="/readyz")
        connector = aiohttp.TCPConnector(force_close=True)  # a new connection (any worker) each
        async with aiohttp.ClientSession(connector=connector) as session:
            statuses = [await chat(session, served.url) for _ in range(20)]
        route = "/v1/chat/completions"
        text = await reaches(served.url, 20, "cognitive_requests_total", route=route, status="200")
    assert statuses == [200] * 20 and fake.count("/v1/chat/completions") == 20
    assert total(text, "cognitive_upstream_latency_seconds_count") == 20  # histograms add up too
    assert total(text, "cognitive_proxy_info") == 1  # the same on each worker: not summed


async def test_open_connections_are_summed_over_the_workers(tmp_path: Path) -> None:
    admin = free_port()
    async with proxy_process(
        "--policy", str(ROOT / "policies/demo.yaml"), *WORKERS, "--admin-port", str(admin)
    ) as served:
        await worker_pids(served.url)  # both listening: before, every connection lands on the first
        port = int(served.url.rsplit(":", 1)[1])
        held: list[socket.socket] = []
        on: set[int] = set()
        try:
            while len(on) < 2 and len(held) < POLL_ROUNDS:
                sock = socket.create_connection(("127.0.0.1", port))
                held.append(sock)
                on.add(await asyncio.to_thread(readyz_pid_over, sock))

            async def counted() -> bool:
                text = await scrape(f"http://127.0.0.1:{admin}")
                return total(text, "cognitive_open_connections", listener="api") == len(held)

            # each worker copies its gauge into the shared files every second
            await eventually(counted, "every held connection counted", timeout=POLL_TIMEOUT_S)
        finally:
            for sock in held:
                sock.close()
    assert len(on) == 2


def readyz_pid_over(sock: socket.socket) -> int:
    """``GET /readyz`` on an open keep-alive connection; the answering worker's pid."""
    sock.sendall(b"GET /readyz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
    data = b""
    while b"\r\n\r\n" not in data:
        data += sock.recv(65536)
    head, body = data.split(b"\r\n\r\n", 1)
    length = int(
        next(line for line in head.split(b"\r\n") if line.lower().startswith(b"content-length")).split(b":")[
            1
        ]
    )
    while len(body) < length:
        body += sock.recv(65536)
    pid: int = json.loads(body)["worker"]["pid"]
    return pid


async def pid_over(session: aiohttp.ClientSession, url: str) -> int:
    async with session.get(url + "/readyz") as resp:
        pid: int = (await resp.json())["worker"]["pid"]
        return pid


async def test_a_killed_worker_is_replaced_and_requests_keep_succeeding(tmp_path: Path) -> None:
    async with (
        FakeUpstream.start() as fake,
        proxy_process("--policy", str(write_policy(tmp_path, fake)), *WORKERS, env=ENV) as served,
    ):
        first = await worker_pids(served.url)
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=1)) as pinned:
            victim = await pid_over(pinned, served.url)  # one keep-alive connection: one worker
            assert [await chat(pinned, served.url) for _ in range(5)] == [200] * 5
            assert await pid_over(pinned, served.url) == victim
        await reaches(served.url, 5, "cognitive_upstream_requests_total")
        os.kill(victim, signal.SIGKILL)
        (survivor,) = first - {victim}
        replacement = await worker_pids(served.url, 1, besides=frozenset({survivor}))
        assert replacement.isdisjoint(first)
        assert await worker_pids(served.url) == {survivor, *replacement}
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True)) as session:
            assert [await chat(session, served.url) for _ in range(10)] == [200] * 10
        # The killed worker's 5 stay in the total (its files outlive it).
        await reaches(served.url, 15, "cognitive_upstream_requests_total")
    exited = events(served, "proxy.worker_exited")
    assert {"pid": victim, "exit_code": -9, "signal": "SIGKILL"}.items() <= exited[0].items()
    assert [e["pid"] for e in events(served, "proxy.worker_started")][-1] in replacement


async def test_sighup_reloads_every_worker(tmp_path: Path) -> None:
    async with FakeUpstream.start() as fake:
        policy = upstream_policy(fake)
        path = write_policy(tmp_path, fake)
        env = {**ENV, "COGPROXY_WORKERS": "2"}  # the variable works as the flag does
        async with proxy_process("--policy", str(path), "--reload-interval", "0", env=env) as served:
            await worker_pids(served.url)  # both serving: a worker still starting gets no SIGHUP
            policy["aliases"]["after-sighup"] = "fast"
            path.write_text(yaml.safe_dump(policy))
            served.proc.send_signal(signal.SIGHUP)

            async def both_reloaded() -> bool:
                text = await scrape(served.url)
                return total(text, "cognitive_policy_reloads_total", result="ok") == 2

            await eventually(both_reloaded, "both workers reloaded", timeout=POLL_TIMEOUT_S)
            for _ in range(10):
                async with aiohttp.ClientSession() as session, session.get(served.url + "/v1/models") as resp:
                    assert "after-sighup" in [m["id"] for m in (await resp.json())["data"]]
    assert [e["reason"] for e in events(served, "proxy.reloaded")] == ["SIGHUP", "SIGHUP"]


async def test_sigterm_drains_every_worker_then_exits_zero_leaving_no_process(tmp_path: Path) -> None:
    async with FakeUpstream.start() as fake:
        fake.script("cheap", Fault.slow(1.0, "finished despite SIGTERM"))
        args = ("--policy", str(write_policy(tmp_path, fake)), *WORKERS, "--drain-timeout", "10")
        async with proxy_process(*args, env=ENV) as served:
            pids = await worker_pids(served.url)
            async with aiohttp.ClientSession() as session:
                pending = asyncio.create_task(session.post(served.url + "/v1/chat/completions", json=CHAT))

                async def in_flight() -> bool:
                    return fake.in_flight > 0

                await eventually(in_flight, "the call in flight upstream", timeout=POLL_TIMEOUT_S)
                served.proc.send_signal(signal.SIGTERM)
                resp = await pending
                body = await resp.json()
            assert await asyncio.to_thread(served.proc.wait, 30) == 0
    assert resp.status == 200 and body["choices"][0]["message"]["content"] == "finished despite SIGTERM"
    assert not any(running(pid) for pid in pids)  # reaped by the parent before it exited
    assert {e["exit_code"] for e in events(served, "proxy.worker_exited")} == {0}


async def test_workers_whose_parent_dies_drain_and_exit() -> None:
    async with proxy_process("--policy", str(ROOT / "policies/demo.yaml"), *WORKERS) as served:
        pids = await worker_pids(served.url)
        served.proc.kill()
        await asyncio.to_thread(served.proc.wait)

        async def gone() -> bool:
            return not any(running(pid) for pid in pids)

        await eventually(gone, "the orphaned workers gone", timeout=POLL_TIMEOUT_S)


def test_a_bad_policy_is_refused_before_any_worker_starts(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump({"version": 1, "providers": {"p": {"kind": "openai"}}, "ladder": []}))
    result = serve_once("--policy", str(bad), *WORKERS)
    assert result.returncode == 2
    assert f"serve: {bad}: ladder: must contain at least 1 items" in result.stderr
    assert "proxy.worker_started" not in result.stderr


def test_a_worker_failing_at_start_up_stops_the_parent_without_restarts(tmp_path: Path) -> None:
    # The parent checks flags, not the spool directory: each worker opens it as it starts, and fails
    # (a file where the directory should be).
    spool = tmp_path / "spool"
    spool.write_bytes(b"")
    result = serve_once(
        "--policy",
        str(ROOT / "policies/demo.yaml"),
        *WORKERS,
        "--redis-url",
        "redis://127.0.0.1:1/0",
        "--spool-dir",
        str(spool),
    )
    assert result.returncode == 2
    assert f"--spool-dir {spool}" in result.stderr
    assert "proxy.workers_failed" in result.stderr and "proxy.worker_restarting" not in result.stderr


def test_a_taken_port_is_the_single_process_error(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = serve_once("--policy", str(ROOT / "policies/demo.yaml"), *WORKERS, "--port", str(port))
    assert result.returncode == 2
    assert result.stderr.strip().splitlines()[-1] == (
        f"cannot listen on 127.0.0.1:{port}: address already in use (is another cogproxy running?)"
    )
    assert "proxy.worker_started" not in result.stderr


def serve_once(*args: str) -> subprocess.CompletedProcess[str]:
    """``serve ARGS`` that is expected to exit by itself (port given first: ARGS may replace it)."""
    command = [sys.executable, "-m", "proxy", "serve", "--port", str(free_port()), "--modules", str(MODULES)]
    return subprocess.run([*command, *args], capture_output=True, text=True, timeout=60, check=False)


@pytest.mark.parametrize(
    ("flags", "problem"),
    [
        (["--workers", "0"], f"workers must be 1-{MAX_WORKERS}, not 0"),
        (["--workers", str(MAX_WORKERS + 1)], f"workers must be 1-{MAX_WORKERS}, not {MAX_WORKERS + 1}"),
        (["--workers", "2", "--port", "0"], "workers > 1 need a fixed port"),
        (["--workers", "2", "--worker-slot", "2"], "worker slot 2 is not one of 0-1"),
    ],
)
def test_a_worker_count_out_of_range_is_refused(
    flags: list[str], problem: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["serve", "--policy", str(ROOT / "policies/demo.yaml"), *flags]) == 2
    assert f"serve: {problem}" in capsys.readouterr().err


async def test_each_worker_keeps_its_own_spool(tmp_path: Path) -> None:
    spool = tmp_path / "spool"
    args = ("--policy", str(ROOT / "policies/demo.yaml"), *WORKERS, "--redis-url", REDIS_URL)
    async with proxy_process(*args, "--spool-dir", str(spool)) as served:
        await worker_pids(served.url)
        assert (spool / SPOOL_FILE).exists() and (spool / "worker-1" / SPOOL_FILE).exists()


def test_spools_of_slots_gone_are_adopted_by_slot_zero(tmp_path: Path) -> None:
    assert spool_dir_of(tmp_path, None) == spool_dir_of(tmp_path, 0) == tmp_path
    for slot, line in ((1, b'{"a": 1}\n'), (2, b'{"b": 2}\n{"tor'), (3, b'{"c": 3}\n')):
        spool_dir_of(tmp_path, slot).mkdir()
        (spool_dir_of(tmp_path, slot) / SPOOL_FILE).write_bytes(line)
    (tmp_path / SPOOL_FILE).write_bytes(b'{"z": 0}\n')
    adopt_spools(tmp_path, 2)  # slot 1 still has a worker; slots 2 and 3 do not
    # Slot 2's torn last append stays a line of its own: slot 3's first record is kept whole.
    assert (tmp_path / SPOOL_FILE).read_bytes() == b'{"z": 0}\n{"b": 2}\n{"tor\n{"c": 3}\n'
    assert sorted(p.name for p in tmp_path.iterdir()) == [SPOOL_FILE, "worker-1"]


def test_restarts_back_off_from_a_tenth_of_a_second_to_ten() -> None:
    assert [backoff(n) for n in (0, 1, 2, 3, 8, 20)] == [0.1, 0.1, 0.2, 0.4, 10.0, 10.0]


def test_metrics_directories_of_killed_supervisors_are_removed() -> None:
    dead = subprocess.Popen([sys.executable, "-c", ""])
    dead.wait()  # its pid is free now
    earlier = make_metrics_dir()
    stale = earlier.parent / f"{METRICS_DIR_PREFIX}{dead.pid}-x"
    alive = earlier.parent / f"{METRICS_DIR_PREFIX}{os.getppid()}-x"  # pytest's parent runs on
    stale.mkdir()
    alive.mkdir()
    made = [earlier]
    try:
        made.append(make_metrics_dir())
        assert not stale.exists() and not earlier.exists()  # this pid's earlier one is stale too
        assert alive.exists() and not any(made[-1].iterdir())
    finally:
        for directory in (*made, stale, alive):
            shutil.rmtree(directory, ignore_errors=True)


async def test_a_worker_that_cannot_be_started_at_all_stops_the_supervisor(tmp_path: Path) -> None:
    plan = Plan(workers=2, host="127.0.0.1", port=free_port(), drain_timeout_s=1.0, shared_state=False)
    supervisor = Supervisor(plan, [str(tmp_path / "no-such-python")], tmp_path)
    assert await supervisor.run() == 1
