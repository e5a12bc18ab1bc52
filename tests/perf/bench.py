"""Benchmark: the proxy against the practical floor of its own stack, measured in one run.

Run by hand (not part of ``make test``)::

    make bench            # or: .venv/bin/python tests/perf/bench.py [--duration 8]

It starts a no-delay fake upstream (its own process), the floor relay (``floor_relay.py``: bare
aiohttp + uvloop + orjson, parse the body, rewrite ``model``, forward with a pooled session, return
the upstream's bytes) and ``cogproxy serve`` with every default on (metrics, the per-request log
line written to a file, tracing, the contract), all three in front of the same upstream. ``wrk``
(Debian package ``wrk``) drives the upstream directly, the floor, passthrough chat and a module
call at concurrency 1, 16 and 64, in ``ROUNDS`` interleaved rounds (the order reversed in every
other round) so that machine drift hits the floor and the proxy alike; streamed time-to-first-byte
is measured with a small asyncio client. It prints p50/p99 latency, the overhead (minus direct),
requests/s, the ratio to direct, CPU milliseconds per request (process CPU time / requests) for
the floor and the proxy, their RSS after the load, and issue #21's goals as ratios of this run
(``--relay`` runs only this part). Everything shares the machine's cores: read ratios, not
absolute numbers. In the full run the same section also measures other gateways (``peers.py``:
Portkey's, LiteLLM's; installed by ``make peers``, left out with the reason when missing) at c=1 and
c=16 in the same rounds, and prints a comparison: overhead p50 at c=1, throughput at c=16 as a
share of direct (``--peers`` runs only this part).

Then the memory section: the proxy's baseline RSS, then its peak RSS (VmHWM) while
``LARGE_BODIES`` bodies of ``LARGE_BODY_BYTES`` are sent at once, for two shapes: many small
keys (costly once parsed) and one long string. ``--memory-only`` runs just that section
(no wrk needed).

The streaming section measures a streamed module answer's time to first delta chunk (``POST
/execute`` with ``Accept: text/event-stream``) against the time to the provider's first frame
holding a ``data.rationale`` token, fetched directly, at concurrency 1 (``--stream`` runs only
that section, no wrk needed). Goal: overhead <= 2 ms p50. Then where the proxy's time goes, step
by step, from a proxy started with ``ttfd_probe.py``; ``--busy N`` runs N spinning processes
beside the section (a loaded machine).

``--context`` runs only the context-protocol section (also part of the full run): the result
cache's hit latency p50 at concurrency 1 through a proxy on the benchmark's own
``redis-server`` (started on a free port; never a Redis it did not start), against a cache-bypassed call
of the same module in the same run; and, in process, what the context steps add to a module
call that carries no context, against the input check and prompt rendering of the same call.

``--redis-paths`` runs only the Redis-on-the-request-path section (also in the full run, after
the context section; no wrk; ``redis_paths.py``): p50 at c=1 of plain chat, plain chat with limits,
a module call with limits, cache and context, and a context session call, with Redis off and with
the benchmark's own ``redis-server`` behind a relay adding +0 ms and +5 ms per round trip (the
cells' requests interleaved); each as a difference from Redis off in the same run, the round trips
each answer waits on (in the run's cost of one), and issue #32's goals at +5 ms.

``--stream-copy`` runs only the stream-recovery copy section (also in the full run, after the Redis
paths; no wrk; the load of ``tests/state/test_stream_mirror.py``, from ``tests/support/stream_copy.py``):
16 concurrent module streams through one in-process ``SessionHub`` copying to the benchmark's own
``redis-server``, directly and through a relay process adding +0 ms and +5 ms per round trip; per
row, the share of the sessions whole in Redis within 1 s and 2 s of their last chunk (the test's
goal: >= 99% within 1 s on loopback, 2 s at +5 ms) and the lag's p50 and p99.

``--limits`` runs only the limit-check micro-benchmark (no wrk; the benchmark's own
``redis-server`` on a free loopback port): p50 of one request's limit check
(client + team + global windows, requests and tokens, day and month budgets) in memory and in
Redis (one EVALSHA round trip), and of its settlement after the answer; baselines in the same
run: a check with no limits configured, and one Redis PING round trip.

``--feedback`` runs only the feedback micro-benchmark (no servers): what remembering a module
answer for ``POST /v1/feedback`` and calibrating its confidence add to one module call (record,
LRU write into a full store, calibration map, calibrated histogram, header), p50 in
microseconds, beside the per-answer metrics the proxy already recorded (the baseline).

``--instructions`` runs only the instruction count (also in the full run, after the relay
section; needs valgrind): user-space instructions per passthrough request of the floor relay and
of the proxy under callgrind, counted only while wrk drives them at c=8 — the one figure here that
machine load does not move; then per streamed passthrough request of 20 chunks (the fake upstream
writes ``max_tokens`` frames at 50 per second, so each is a read of its own) and, from the slope
between 20 and 80 chunks, the instructions each chunk costs the floor and the proxy; then per
streamed module call (``/execute``, SSE, one at a time, each read to its end) against the floor
relaying the same upstream stream (``--module-instructions`` runs only that row); last, apart,
the instructions per second of a proxy serving nothing, with the default ``--reload-interval``
(its file polls) and with ``--reload-interval 0`` (what is left: timers, the log flusher).

``--ablation`` runs only the ablation (needs valgrind; not in the full run): instructions per
passthrough request of the proxy with one part of its per-request work switched off at a time
(the log line, metrics, breakers, the edge checks, usage accounting, the retry loop;
``ablated_proxy.py``), then all of them, against the whole proxy in the same run: what each costs.

``--workers-bench`` runs only the workers section (last in the full run): ``serve --workers 1``
against ``--workers 2``, passthrough chat at c=64, requests/s, CPU per request over all the
proxy's processes and the ratio, each worker's CPU per request and share of the requests, and
the machine's CPU by consumer (the proxy, wrk, the upstream, interrupts, other processes); then
why a worker's CPU per request moves (``workers_cost.py``, needs valgrind): instructions per
request under callgrind of 1 worker, 1 worker with multiprocess metric files, one worker of two
alone and 2 workers, a no-proxy control's CPU per unit alone and beside a twin, and the rise split
into more instructions, slower instructions and the kernel; then what summing metrics over
workers costs (multiprocess files against per-worker registries).

``--retries`` runs only the retry section (no wrk; also in the full run, before the workers):
the success rate at 30% independent 503s on both providers of a rung, 16 clients, every default,
over repeated runs with new seeds, against the budget without its per-target floor (#29.3) and
against one client; reported, not asserted.

Last, the soak (``tests/perf/soak.py``; ``--soak`` runs only it, ``BENCH_SOAK_S`` seconds): the
default bounds filled under load, peak RSS against ``proxy.memory_budget``'s table, and CPU per
request in the first and last minute as a ratio.

``--parse`` runs only the contract parse micro-benchmark (no wrk, no servers): the time to parse
hostile model answers (a fence followed by 40,000 spaces, brace floods, long strings), as a
ratio to parsing a normal envelope in the same run and in microseconds per KB of answer.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import math
import os
import re
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, NoReturn

if TYPE_CHECKING:
    from tests.perf.peers import Peer

ROOT = Path(__file__).resolve().parents[2]
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")

ENVELOPE: dict[str, Any] = {
    "ok": True,
    "meta": {"confidence": 0.93, "risk": "low", "explain": "One small style issue."},
    "data": {
        "issues": [
            {
                "severity": "minor",
                "category": "style",
                "line": 1,
                "description": "Name is short.",
                "suggestion": "Use a descriptive name.",
                "risk": "low",
            }
        ],
        "summary": "Fine overall.",
        "verdict": "approve",
        "rationale": "The function is correct; one naming nit.",
    },
}
COMPLETION: dict[str, Any] = {
    "id": "chatcmpl-bench",
    "object": "chat.completion",
    "created": 0,
    "model": "m",
    "choices": [
        {
            "index": 0,
            "message": {"role": "assistant", "content": json.dumps(ENVELOPE)},
            "finish_reason": "stop",
        }
    ],
    "usage": {"prompt_tokens": 10, "completion_tokens": 10, "total_tokens": 20},
}
CHAT_BODY: dict[str, object] = {"model": "bench", "messages": [{"role": "user", "content": "hello"}]}
STREAM_BODY = {**CHAT_BODY, "stream": True}
MODULE_BODY: dict[str, object] = {"input": {"code": "def f(x):\n    return x\n", "language": "python"}}


def envelope_frames() -> list[bytes]:
    """The module answer streamed the way models write it: the first frame ends with the first
    word of ``data.rationale`` (the provider's first token of a streamed field), then a word per
    frame, a finish frame, a usage frame and [DONE]."""
    text = json.dumps(ENVELOPE)
    start = text.index('"rationale": "') + len('"rationale": "')
    first = text.index(" ", start)
    pieces = [text[:first], *re.findall(r"\s*\S+", text[first:])]

    def frame(obj: dict[str, object]) -> bytes:
        return b"data: " + json.dumps(obj).encode() + b"\n\n"

    base = {"id": "c", "object": "chat.completion.chunk", "created": 0, "model": "m"}
    out = [
        frame({**base, "choices": [{"index": 0, "delta": {"content": p}, "finish_reason": None}]})
        for p in pieces
    ]
    out.append(frame({**base, "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}))
    out.append(frame({**base, "choices": [], "usage": COMPLETION["usage"]}))
    return [*out, b"data: [DONE]\n\n"]


TOKEN_PACE_S = 0.02
"""The fake upstream's pace for a stream that names ``max_tokens``: 50 tokens/s, slow enough that
each frame is a read of its own even for a server under callgrind (~50x slower)."""


def token_frames(tokens: int) -> list[bytes]:
    """A streamed chat answer of ``tokens`` frames (the last one with ``finish_reason``) and [DONE]."""
    base = {"id": "c", "object": "chat.completion.chunk", "created": 0, "model": "m"}

    def frame(finish: str | None) -> bytes:
        choice = {"index": 0, "delta": {"content": "hi "}, "finish_reason": finish}
        return b"data: " + json.dumps({**base, "choices": [choice]}).encode() + b"\n\n"

    return [*(frame(None) for _ in range(tokens - 1)), frame("stop"), b"data: [DONE]\n\n"]


def upstream_main(port: int) -> None:
    """The no-delay fake upstream: precomputed bytes, nothing else."""
    from aiohttp import web

    body = json.dumps(COMPLETION).encode()
    chunk = {
        "id": "c",
        "object": "chat.completion.chunk",
        "created": 0,
        "model": "m",
        "choices": [{"index": 0, "delta": {"content": "hi "}, "finish_reason": None}],
    }
    frames = [b"data: " + json.dumps(chunk).encode() + b"\n\n"] * 5 + [b"data: [DONE]\n\n"]
    module_frames = envelope_frames()

    async def chat(request: web.Request) -> web.StreamResponse:
        payload = await request.json()
        if not payload.get("stream"):
            return web.Response(body=body, content_type="application/json")
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        tokens = payload.get("max_tokens")
        if isinstance(tokens, int):  # a model writing: one frame per token, paced
            for frame in token_frames(tokens):
                await resp.write(frame)
                await asyncio.sleep(TOKEN_PACE_S)
            await resp.write_eof()
            return resp
        roles = [m.get("role") for m in payload.get("messages", [])]
        for frame in module_frames if "system" in roles else frames:
            await resp.write(frame)
        await resp.write_eof()
        return resp

    app = web.Application(client_max_size=64 * 1024 * 1024)  # the memory section's 10 MB bodies
    app.router.add_post("/v1/chat/completions", chat)
    try:
        import uvloop

        loop = uvloop.new_event_loop()
    except ImportError:
        loop = None
    web.run_app(app, host="127.0.0.1", port=port, access_log=None, print=None, loop=loop)


def serve_command(policy: Path, port: int, *extra: str) -> list[str]:
    """``cogproxy serve`` on ``port`` with ``policy`` and the bundled modules, as every proxy of
    the benchmark is started (``extra``: more flags)."""
    command = [sys.executable, "-m", "proxy", "serve", "--policy", str(policy), "--port", str(port)]
    return [*command, "--modules", str(ROOT / "modules"), *extra]


def bench_policy(up_port: int) -> str:
    """The policy every proxy of the benchmark runs: one rung, one target, the no-delay upstream.

    The feedback store remembers each module answer (about 1 KiB, up to 10,000 by default): it
    is kept small here so that "RSS after load" is the proxy's own footprint, not a store sized by
    configuration (docs/feedback-and-calibration.md: ``feedback.max_entries``)."""
    return (
        "version: 1\n"
        f"providers:\n  up: {{kind: openai, base_url: 'http://127.0.0.1:{up_port}/v1'}}\n"
        "ladder:\n  - {name: fast, targets: [up/m]}\n"
        "aliases: {bench: fast}\n"
        "feedback: {max_entries: 1000}\n"
    )


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def wait_port(port: int, timeout: float = 20) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with socket.socket() as sock:
            if sock.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.05)
    raise RuntimeError(f"nothing listens on {port}")


@dataclass
class WrkResult:
    rps: float
    p50_ms: float
    p99_ms: float
    requests: int


_UNITS = {"us": 0.001, "ms": 1.0, "s": 1000.0}


def _ms(text: str) -> float:
    match = re.match(r"([\d.]+)(us|ms|s)", text)
    if not match:
        raise ValueError(text)
    return float(match[1]) * _UNITS[match[2]]


def wrk(
    url: str,
    body: dict[str, object],
    connections: int,
    duration: int,
    script_dir: Path,
    headers: dict[str, str] | None = None,
) -> WrkResult:
    script = script_dir / "post.lua"
    sets = "".join(f'wrk.headers["{name}"] = "{value}"\n' for name, value in (headers or {}).items())
    script.write_text(
        'wrk.method = "POST"\nwrk.headers["Content-Type"] = "application/json"\n'
        f"{sets}wrk.body = [[{json.dumps(body)}]]\n"
    )
    threads = min(connections, 2)
    out = subprocess.run(
        ["wrk", f"-t{threads}", f"-c{connections}", f"-d{duration}s", "--latency", "-s", str(script), url],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    rps = float(re.search(r"Requests/sec:\s+([\d.]+)", out)[1])  # type: ignore[index]
    p50 = _ms(re.search(r"^\s+50%\s+(\S+)", out, re.M)[1])  # type: ignore[index]
    p99 = _ms(re.search(r"^\s+99%\s+(\S+)", out, re.M)[1])  # type: ignore[index]
    total = int(re.search(r"(\d+) requests in", out)[1])  # type: ignore[index]
    errors = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    if errors:
        raise RuntimeError(f"{url}: {errors[1]} non-2xx answers during the load")
    return WrkResult(rps, p50, p99, total)


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS


def tree_cpu_seconds(pid: int) -> float:
    """CPU seconds of ``pid`` and its children (a peer's workers), those alive now."""
    children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    return cpu_seconds(pid) + sum(tree_cpu_seconds(int(child)) for child in children)


def rss_mb(pid: int, field: str = "VmRSS") -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1]) / 1024
    return float("nan")


LARGE_BODIES = 8
LARGE_BODY_BYTES = 10 * 1024 * 1024 - 1024
"""Just under the default --max-body-bytes (10 MiB), so the proxy reads every body."""


def large_body(shape: str) -> bytes:
    """A ~10 MB chat request: ``keys`` carries many small keys, ``string`` one long message."""
    base: dict[str, object] = {"model": "bench", "messages": [{"role": "user", "content": "hi"}]}
    if shape == "string":
        base["messages"] = [{"role": "user", "content": "x" * LARGE_BODY_BYTES}]
        return json.dumps(base).encode()
    item = len('"k0000000":1,')
    base["metadata"] = {f"k{i:07d}": 1 for i in range(LARGE_BODY_BYTES // item)}
    return json.dumps(base, separators=(",", ":")).encode()


async def send_at_once(url: str, body: bytes, count: int) -> dict[int, int]:
    """POST ``body`` ``count`` times concurrently; answers counted by status."""
    import aiohttp

    statuses: dict[int, int] = {}
    timeout = aiohttp.ClientTimeout(total=120)
    async with aiohttp.ClientSession(timeout=timeout) as session:

        async def one() -> None:
            try:
                async with session.post(url, data=body, headers={"Content-Type": "application/json"}) as resp:
                    await resp.read()
                    statuses[resp.status] = statuses.get(resp.status, 0) + 1
            except aiohttp.ClientError:
                statuses[0] = statuses.get(0, 0) + 1  # 0: the connection broke

        await asyncio.gather(*(one() for _ in range(count)))
    return statuses


def memory_section(url: str, pid: int) -> None:
    """Baseline RSS, then peak RSS while large bodies arrive at once, per body shape."""
    print(f"proxy baseline RSS: {rss_mb(pid):.1f} MB")
    for shape in ("keys", "string"):
        body = large_body(shape)
        Path(f"/proc/{pid}/clear_refs").write_text("5")  # reset VmHWM to the current RSS
        statuses = asyncio.run(send_at_once(url, body, LARGE_BODIES))
        answers = ", ".join(f"{status}: {n}" for status, n in sorted(statuses.items()))
        print(
            f"{LARGE_BODIES} x {len(body) / 1e6:.1f} MB bodies ({shape}) at once: peak RSS "
            f"{rss_mb(pid, 'VmHWM'):.1f} MB (answers {answers})"
        )


async def ttfb(url: str, concurrency: int, total: int, headers: dict[str, str] | None = None) -> list[float]:
    """Time to the first streamed byte, in ms, over ``total`` requests ``concurrency`` at a time."""
    import aiohttp

    samples: list[float] = []
    connector = aiohttp.TCPConnector(limit=concurrency)
    async with aiohttp.ClientSession(connector=connector) as session:
        queue = iter(range(total))

        async def worker() -> None:
            for _ in queue:
                start = time.perf_counter()
                async with session.post(url, json=STREAM_BODY, headers=headers) as resp:
                    await resp.content.readany()
                    samples.append((time.perf_counter() - start) * 1000)
                    await resp.read()

        await asyncio.gather(*(worker() for _ in range(concurrency)))
    return samples


@dataclass(frozen=True)
class Endpoints:
    """Ports of the three servers measured side by side."""

    upstream: int
    floor: int
    proxy: int

    def chat(self, port: int) -> str:
        return f"http://127.0.0.1:{port}/v1/chat/completions"

    @property
    def module(self) -> str:
        return f"http://127.0.0.1:{self.proxy}/v1/modules/code-reviewer/execute"


@dataclass
class Runs:
    """One case at one concurrency over the interleaved rounds."""

    results: list[WrkResult]
    cpu_ms: list[float]

    @property
    def p50(self) -> float:
        return statistics.fmean(r.p50_ms for r in self.results)

    @property
    def p99(self) -> float:
        return statistics.fmean(r.p99_ms for r in self.results)

    @property
    def rps(self) -> float:
        return statistics.fmean(r.rps for r in self.results)

    @property
    def cpu(self) -> float:
        return statistics.fmean(self.cpu_ms) if self.cpu_ms else float("nan")


ROUNDS = 2
"""Each case runs this many times, interleaved with the others (the order reversed in every
other round), so machine drift hits the floor and the proxy alike."""


@dataclass(frozen=True)
class Case:
    """One row of the relay section: a server (``pid``, None for the upstream itself) and a call."""

    name: str
    url: str
    body: dict[str, object]
    pid: int | None
    headers: dict[str, str] | None = None
    peer: bool = False
    """Another gateway (``peers.py``): measured at ``PEER_CONCURRENCY`` only; one that fails under
    the load is left out with the reason, not the bench."""


PEER_CONCURRENCY = (1, 16)


def _measure(
    case: Case, conc: int, args: argparse.Namespace, tmp: Path, runs: dict[tuple[str, int], Runs]
) -> None:
    cpu0 = tree_cpu_seconds(case.pid) if case.pid else 0.0
    res = wrk(case.url, case.body, conc, args.duration, tmp, case.headers)
    entry = runs.setdefault((case.name, conc), Runs([], []))
    entry.results.append(res)
    if case.pid:
        entry.cpu_ms.append((tree_cpu_seconds(case.pid) - cpu0) * 1000 / max(res.requests, 1))


def relay_section(
    ends: Endpoints,
    floor_pid: int,
    proxy_pid: int,
    args: argparse.Namespace,
    tmp: Path,
    peers: Sequence[Peer] = (),
) -> None:
    """The floor relay and the proxy (and ``peers``) against the same upstream in one run, and the
    #21 goals."""
    cases = [
        Case("direct", ends.chat(ends.upstream), CHAT_BODY, None),
        Case("floor relay", ends.chat(ends.floor), CHAT_BODY, floor_pid),
        Case("passthrough", ends.chat(ends.proxy), CHAT_BODY, proxy_pid),
        *(Case(p.name, p.url, CHAT_BODY, p.process.pid, p.headers, peer=True) for p in peers),
    ]
    if not args.peers_only:
        cases.append(Case("module (execute)", ends.module, MODULE_BODY, proxy_pid))
    for case in cases[1:]:
        wrk(case.url, case.body, 4, 2, tmp, case.headers)  # warm-up: imports, pools, caches
    runs: dict[tuple[str, int], Runs] = {}
    failed: set[str] = set()
    for round_no in range(ROUNDS):
        order = cases if round_no % 2 == 0 else cases[::-1]
        for conc in args.concurrency:
            for case in order:
                if case.peer and (conc not in PEER_CONCURRENCY or case.name in failed):
                    continue
                try:
                    _measure(case, conc, args, tmp, runs)
                except (RuntimeError, subprocess.CalledProcessError) as exc:
                    if not case.peer:
                        raise
                    print(f"peers: {case.name} left out: {exc}")
                    failed.add(case.name)
    print(
        f"{'case':<22}{'conc':>5}{'direct p50':>12}{'p50':>9}{'overhead p50':>14}{'p99':>9}"
        f"{'rps':>9}{'vs direct':>11}{'cpu ms/req':>12}"
    )
    for conc in args.concurrency:
        base = runs[("direct", conc)]
        for case in cases[1:]:
            run = runs.get((case.name, conc))
            if run is None or case.name in failed:
                continue
            print(
                f"{case.name:<22}{conc:>5}{base.p50:>12.3f}{run.p50:>9.3f}{run.p50 - base.p50:>14.3f}"
                f"{run.p99:>9.3f}{run.rps:>9.0f}{run.rps / base.rps:>11.3f}{run.cpu:>12.3f}"
            )
    streamed = [c for c in cases if c.name != "module (execute)" and c.name not in failed]
    ttfb_ms: dict[str, list[float]] = {case.name: [] for case in streamed}
    for _ in range(5):
        for case in streamed:
            ttfb_ms[case.name] += asyncio.run(ttfb(case.url, 1, 80, case.headers))
    direct_ttfb = pct(ttfb_ms["direct"], 50)
    for case in streamed[1:]:
        p50 = pct(ttfb_ms[case.name], 50)
        label = f"stream TTFB {case.name}"
        print(f"{label:<26}{1:>1}" if len(label) < 26 else f"{label} 1", end="")
        print(f"{direct_ttfb:>12.3f}{p50:>9.3f}{p50 - direct_ttfb:>14.3f}")
    print_peers([c.name for c in streamed[1:]], runs, ttfb_ms)
    rss = {"floor relay": rss_mb(floor_pid), "proxy": rss_mb(proxy_pid)}
    print(f"RSS after load: floor relay {rss['floor relay']:.1f} MB, proxy {rss['proxy']:.1f} MB")
    if not args.peers_only:
        print_goals(runs, args.concurrency, pct(ttfb_ms["passthrough"], 50) - direct_ttfb, rss["proxy"])


def print_peers(names: list[str], runs: dict[tuple[str, int], Runs], ttfb_ms: dict[str, list[float]]) -> None:
    """The README's comparison: each server's overhead over direct at c=1 and its throughput at
    c=16 as a share of direct's, from this run's rows above."""
    if ("direct", 1) not in runs or ("direct", 16) not in runs:
        return
    direct_ttfb = pct(ttfb_ms["direct"], 50)
    print(
        f"{'comparison (same run)':<22}{'overhead p50 c=1 ms':>21}{'rps c=16 / direct':>19}"
        f"{'cpu ms/req c=16':>17}{'TTFB overhead ms':>18}"
    )
    for name in names:
        one, sixteen = runs.get((name, 1)), runs.get((name, 16))
        if one is None or sixteen is None:
            continue
        label = "cognitive-proxy" if name == "passthrough" else name
        print(
            f"{label:<22}{one.p50 - runs[('direct', 1)].p50:>21.3f}"
            f"{sixteen.rps / runs[('direct', 16)].rps:>19.3f}{sixteen.cpu:>17.3f}"
            f"{pct(ttfb_ms[name], 50) - direct_ttfb:>18.3f}"
        )


def print_goals(
    runs: dict[tuple[str, int], Runs], concurrency: list[int], ttfb_overhead: float, rss: float
) -> None:
    """Issue #21's goals as ratios of this run."""
    goals: list[tuple[str, float, str, bool]] = []
    if 1 in concurrency:
        direct = runs[("direct", 1)].p50
        floor = runs[("floor relay", 1)].p50 - direct
        passthrough = runs[("passthrough", 1)].p50 - direct
        ratio = passthrough / floor if floor > 0 else float("inf")
        goals.append(("passthrough overhead p50 c=1 / floor's", ratio, "<= 1.30", ratio <= 1.3))
        module = runs[("module (execute)", 1)].p50 - runs[("passthrough", 1)].p50
        goals.append(("module p50 - passthrough p50, c=1 (ms)", module, "<= 0.60", module <= 0.6))
    if 16 in concurrency:
        share = runs[("passthrough", 16)].rps / runs[("floor relay", 16)].rps
        goals.append(("throughput c=16, proxy / floor", share, ">= 0.85", share >= 0.85))
    goals.append(("SSE TTFB overhead p50 c=1 (ms)", ttfb_overhead, "<= 0.50", ttfb_overhead <= 0.5))
    goals.append(("proxy RSS after load (MB)", rss, "<= 80", rss <= 80))
    print(f"{'goal':<42}{'this run':>10}  {'target':<9}")
    for name, value, target, met in goals:
        print(f"{name:<42}{value:>10.3f}  {target:<9}{'met' if met else 'MISSED'}")


STREAM_MODULE_BODY = {
    "model": "m",
    "stream": True,
    "messages": [{"role": "system", "content": "module"}, {"role": "user", "content": "hello"}],
}


async def first_delta(url: str, body: dict[str, object], marker: bytes, total: int) -> list[float]:
    """Ms from sending the request to the first bytes holding ``marker``, one request at a time."""
    import aiohttp

    samples: list[float] = []
    headers = {"Accept": "text/event-stream"}
    async with aiohttp.ClientSession() as session:
        for _ in range(total):
            start = time.perf_counter()
            async with session.post(url, json=body, headers=headers) as resp:
                seen = b""
                while marker not in seen:
                    piece = await resp.content.readany()
                    if not piece:
                        raise RuntimeError(f"{url}: the stream ended before {marker!r}")
                    seen += piece
                samples.append((time.perf_counter() - start) * 1000)
                await resp.read()
    return samples


@contextlib.contextmanager
def busy_loops(count: int) -> Iterator[None]:
    """``count`` processes spinning on a core each (a loaded machine), stopped on leaving."""
    loops = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(count)]
    try:
        yield
    finally:
        for loop in loops:
            loop.terminate()
            loop.wait(timeout=30)


def floor_command(port: int, up_port: int) -> list[str]:
    """The floor relay (``floor_relay.py``) on ``port`` in front of the upstream on ``up_port``."""
    relay = str(Path(__file__).with_name("floor_relay.py"))
    return [sys.executable, relay, "--port", str(port), "--upstream", f"http://127.0.0.1:{up_port}/v1"]


@contextlib.contextmanager
def running_floor(up_port: int) -> Iterator[int]:
    """A floor relay for the block; its port."""
    port = free_port()
    floor = subprocess.Popen(floor_command(port, up_port))
    try:
        wait_port(port)
        yield port
    finally:
        floor.terminate()
        floor.wait(timeout=30)


def stream_section(up_port: int, proxy_port: int, tmp: Path, busy: int = 0, total: int = 300) -> None:
    """Time to first delta of a streamed module answer (execute, SSE) against the time to the
    provider's first frame holding a ``data.rationale`` token, measured directly and through the
    floor relay, at c=1. The three alternate in rounds so that all see the same machine load: the
    floor's overhead is what any relay pays for the extra hops on this machine (on a loaded one,
    mostly waiting for a core), the proxy's beyond it is its own. Then where the time goes
    (``stream_breakdown``). ``busy``: that many spinning processes beside."""
    with busy_loops(busy), running_floor(up_port) as floor_port:
        if busy:
            print(f"stream: {busy} busy loop(s) running beside (load)")
        _stream_ttfd(up_port, floor_port, proxy_port, total)
        stream_breakdown(up_port, tmp, total)


def stream_breakdown(up_port: int, tmp: Path, total: int) -> None:
    """The proxy's time from a streamed module call's arrival to its first delta written, step by
    step: a proxy started with ``ttfd_probe.py`` (timestamps at each step, written at exit) serves
    ``total`` calls at c=1; per step, the p50 of its time since the step before, over the calls."""
    sys.path.insert(0, str(ROOT))
    from tests.perf.ttfd_probe import STEPS

    policy = tmp / "probe-policy.yaml"
    policy.write_text(bench_policy(up_port))
    marks_file, port = tmp / "ttfd-marks.jsonl", free_port()
    probe = str(Path(__file__).with_name("ttfd_probe.py"))
    command = [sys.executable, probe, str(marks_file), *serve_command(policy, port)[3:]]
    log = (tmp / "probe.log").open("wb")
    proxy = subprocess.Popen(command, cwd=ROOT, stderr=log)
    url = f"http://127.0.0.1:{port}/v1/modules/code-reviewer/execute"
    try:
        wait_port(port)
        asyncio.run(first_delta(url, MODULE_BODY, b"event: chunk", 50))  # warm-up
        client = asyncio.run(first_delta(url, MODULE_BODY, b"event: chunk", total))
    finally:
        proxy.terminate()
        proxy.wait(timeout=60)
        log.close()
    calls = [json.loads(line) for line in marks_file.read_text().splitlines()][50:]
    names = [name for name, _ in STEPS]
    complete = [c for c in calls if all(name in c for name in names)]
    if not complete:
        print(f"stream breakdown: no call passed every step ({len(calls)} calls)", file=sys.stderr)
        return
    order = sorted(names, key=lambda name: statistics.median(c[name] - c["arrive"] for c in complete))
    print(
        f"{'TTFD breakdown (module stream, c=1)':<60}{'at p50 ms':>10}{'step p50 ms':>12}{'CPU p50 ms':>12}"
    )
    what = dict(STEPS)
    for before, name in itertools.pairwise(order):
        at = statistics.median((c[name] - c["arrive"]) / 1e6 for c in complete)
        step = statistics.median((c[name] - c[before]) / 1e6 for c in complete)
        cpu_step = statistics.median((c["cpu_" + name] - c["cpu_" + before]) / 1e6 for c in complete)
        print(f"{'  ' + what[name]:<60}{at:>10.3f}{step:>12.3f}{cpu_step:>12.3f}")
    inside = [(c["delta_written"] - c["arrive"]) / 1e6 for c in complete]
    cpu = [(c["cpu_delta_written"] - c["cpu_arrive"]) / 1e6 for c in complete]
    print(f"the proxy's CPU (its thread's time), arrival -> first delta written: p50 {pct(cpu, 50):.3f} ms")
    print(
        f"in the proxy, arrival -> first delta written: p50 {pct(inside, 50):.3f} ms, "
        f"p99 {pct(inside, 99):.3f} ms ({len(complete)} calls); "
        f"the client saw TTFD p50 {pct(client, 50):.3f} ms"
    )


def _stream_ttfd(up_port: int, floor_port: int, proxy_port: int, total: int) -> None:
    direct = f"http://127.0.0.1:{up_port}/v1/chat/completions"
    floor = f"http://127.0.0.1:{floor_port}/v1/chat/completions"
    module = f"http://127.0.0.1:{proxy_port}/v1/modules/code-reviewer/execute"
    asyncio.run(first_delta(module, MODULE_BODY, b"event: chunk", 50))  # warm-up
    asyncio.run(first_delta(floor, STREAM_MODULE_BODY, b"data: ", 50))
    print(f"{'case':<22}{'conc':>5}{'direct p50':>12}{'floor p50':>11}{'proxy p50':>11}", end="")
    print(f"{'overhead p50':>14}{'floor overhead':>16}{'proxy p99':>11}")
    d: list[float] = []
    f: list[float] = []
    p: list[float] = []
    for _ in range(5):
        d += asyncio.run(first_delta(direct, STREAM_MODULE_BODY, b"data: ", total // 5))
        f += asyncio.run(first_delta(floor, STREAM_MODULE_BODY, b"data: ", total // 5))
        p += asyncio.run(first_delta(module, MODULE_BODY, b"event: chunk", total // 5))
    print(
        f"{'stream TTFD (module)':<22}{1:>5}{pct(d, 50):>12.3f}{pct(f, 50):>11.3f}{pct(p, 50):>11.3f}"
        f"{pct(p, 50) - pct(d, 50):>14.3f}{pct(f, 50) - pct(d, 50):>16.3f}{pct(p, 99):>11.3f}"
    )
    print(
        f"  the proxy's own TTFD overhead (beyond the floor relay's), p50: {pct(p, 50) - pct(f, 50):.3f} ms"
        f" (goal <= 2 ms); ratio p50 proxy/direct {pct(p, 50) / pct(d, 50):.2f}"
    )


def pct(values: list[float], q: float) -> float:
    return statistics.quantiles(values, n=100)[int(q) - 1] if len(values) > 1 else values[0]


def _parse_seconds(text: str, repeat: int) -> float:
    from proxy.contract.parse import ParseFailure, parse_json_object

    times = []
    for _ in range(repeat):
        started = time.perf_counter()
        with contextlib.suppress(ParseFailure):
            parse_json_object(text)
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def parse_bench() -> None:
    """Parse time of hostile answers against a normal envelope (the baseline), one run."""
    sys.path.insert(0, str(ROOT))
    normal = json.dumps(ENVELOPE)
    cases = {
        "normal envelope": normal,
        "fence + 40,000 spaces": "```" + " " * 40_000 + "x",
        "prose + envelope": "Here it is:\n```json\n" + normal + "\n```\nDone.",
        "'{' x 1 MB": "{" * 1_000_000,
        "'[] ' x 1 MB": "[] " * 350_000,
        "unterminated string 1 MB": '{"a": "' + "x\\" * 500_000,
        "big envelope 1 MB": json.dumps(
            {**ENVELOPE, "data": {**ENVELOPE["data"], "issues": ENVELOPE["data"]["issues"] * 4_000}}
        ),
    }
    base = _parse_seconds(normal, 2_000)
    print(f"{'parse case':<28}{'bytes':>10}{'ms':>10}{'x normal':>12}{'us/KB':>10}")
    for name, text in cases.items():
        seconds = _parse_seconds(text, 2_000 if len(text) < 10_000 else 5)
        print(
            f"{name:<28}{len(text):>10}{seconds * 1000:>10.3f}{seconds / base:>12.1f}"
            f"{seconds * 1e6 / (len(text) / 1024):>10.1f}"
        )


REDIS_DB = 15  # of the benchmark's own redis-server (tests.support.redis_server), flushed


async def _sequential(url: str, body: dict[str, object], count: int, headers: dict[str, str]) -> list[float]:
    import aiohttp

    out = []
    async with aiohttp.ClientSession() as session:
        for _ in range(count):
            started = time.perf_counter()
            async with session.post(url, json=body, headers=headers) as resp:
                await resp.read()
                assert resp.status == 200, resp.status
            out.append((time.perf_counter() - started) * 1000)
    return out


def _step_seconds(repeat: int) -> tuple[float, float, float]:
    """Per call: the context steps (prepare + emit) for a module without context, the baseline
    (input check + prompt rendering), and the steps for the §8.1 module in a session."""
    from proxy.context.identity import Identity, namespace_of
    from proxy.context.step import CallerContext, emit, prepare
    from proxy.context.store import MemoryContextStore
    from proxy.contract.inputs import check_input
    from proxy.module.loader import load_module
    from proxy.pipeline import build_messages

    module = load_module(ROOT / "modules" / "code-reviewer")
    reviewer = load_module(ROOT / "modules" / "interactive-reviewer")
    value = MODULE_BODY["input"]
    call = CallerContext(MemoryContextStore(), Identity(namespace_of("sk-bench")))
    session = CallerContext(MemoryContextStore(), Identity(namespace_of("sk-bench"), "s1"))
    envelope = {**ENVELOPE}

    async def steps(ctx: CallerContext, mod: object, value: object) -> None:
        prepared = await prepare(mod, value, ctx)  # type: ignore[arg-type]
        await emit(mod, ctx, prepared, "accept", envelope, None)  # type: ignore[arg-type]

    async def measure() -> tuple[float, float, float]:
        timings: dict[str, list[float]] = {"ctx": [], "base": [], "session": []}
        for _ in range(repeat):
            t0 = time.perf_counter()
            await steps(call, module, value)
            t1 = time.perf_counter()
            check_input(module, value)
            build_messages(module, value)
            t2 = time.perf_counter()
            await steps(session, reviewer, {"code": "x", "file": "a.py"})
            t3 = time.perf_counter()
            timings["ctx"].append(t1 - t0)
            timings["base"].append(t2 - t1)
            timings["session"].append(t3 - t2)
        return tuple(statistics.median(v) for v in timings.values())  # type: ignore[return-value]

    return asyncio.run(measure())


def context_bench(tmpdir: Path, up_port: int) -> None:
    """Cache-hit latency through Redis, and the context steps' overhead, each against a baseline."""
    import redis

    sys.path.insert(0, str(ROOT))
    ctx_s, base_s, session_s = _step_seconds(5_000)
    print(
        f"context steps, module without context: {ctx_s * 1e3:.4f} ms per call "
        f"(input check + prompt render of the same call: {base_s * 1e3:.4f} ms; ratio {ctx_s / base_s:.2f})"
    )
    print(f"context steps, §8.1 module in a session (memory store): {session_s * 1e3:.4f} ms per call")
    from tests.support.redis_server import redis_url

    bench_redis = redis_url(REDIS_DB)
    redis.Redis.from_url(bench_redis).flushdb()
    port = free_port()
    policy = tmpdir / "cache-policy.yaml"
    policy.write_text(
        "version: 1\n"
        f"providers:\n  up: {{kind: openai, base_url: 'http://127.0.0.1:{up_port}/v1'}}\n"
        "ladder:\n  - {name: fast, targets: [up/m]}\n"
        "cache:\n  modules:\n    code-reviewer: {ttl_s: 600}\n"
    )
    proxy = subprocess.Popen(
        serve_command(policy, port, "--log-level", "warning", "--redis-url", bench_redis), cwd=ROOT
    )
    try:
        wait_port(port)
        url = f"http://127.0.0.1:{port}/v1/modules/code-reviewer/execute"
        asyncio.run(_sequential(url, MODULE_BODY, 50, {}))  # warm-up; the first call fills the cache
        hits = asyncio.run(_sequential(url, MODULE_BODY, 2_000, {}))
        bypass = asyncio.run(_sequential(url, MODULE_BODY, 2_000, {"Cache-Control": "no-cache"}))
        print(
            f"cache hit p50 (c=1, Redis on loopback): {pct(hits, 50):.3f} ms, p99 {pct(hits, 99):.3f} ms; "
            f"cache bypassed (model called) p50 {pct(bypass, 50):.3f} ms; ratio hit/bypass "
            f"{pct(hits, 50) / pct(bypass, 50):.2f}"
        )
    finally:
        proxy.terminate()
        proxy.wait(timeout=30)
        from tests.support.redis_server import redis_url

    bench_redis = redis_url(REDIS_DB)
    redis.Redis.from_url(bench_redis).flushdb()


SHADOW_ROUNDS, SHADOW_BLOCK = 10, 200
"""Calls per variant: rounds of one block of sequential calls per variant, the variants taking
turns in a rotating order (the machine's other load falls on each alike)."""
SHADOW_RATES = {"off": 0.0, "off again": 0.0, "rate 0.05": 0.05, "rate 0.25": 0.25, "rate 1": 1.0}
"""Two processes with shadow judging off: their KS is the floor two identical variants show on
this machine (process placement, drift)."""
KS_C_ALPHA = 1.3581
"""c(alpha) of the two-sample Kolmogorov-Smirnov test at alpha 0.05: sqrt(-ln(alpha / 2) / 2)."""


def ks_statistic(a: list[float], b: list[float]) -> float:
    """The two-sample Kolmogorov-Smirnov statistic: the largest gap between the two empirical
    distribution functions."""
    xs, ys = sorted(a), sorted(b)
    i = j = 0
    gap = 0.0
    while i < len(xs) and j < len(ys):
        step = min(xs[i], ys[j])
        while i < len(xs) and xs[i] == step:
            i += 1
        while j < len(ys) and ys[j] == step:
            j += 1
        gap = max(gap, abs(i / len(xs) - j / len(ys)))
    return gap


def ks_critical(n: int, m: int) -> float:
    """The statistic past which the two samples differ at alpha 0.05 (large-sample form)."""
    return KS_C_ALPHA * math.sqrt((n + m) / (n * m))


def _shadow_policy(up_port: int, rate: float) -> str:
    """Two rungs on the no-delay upstream; code-reviewer accepted on the first, judged on the
    second in the background when ``rate`` > 0 (``feedback.shadow``)."""
    return (
        "version: 1\n"
        f"providers:\n  up: {{kind: openai, base_url: 'http://127.0.0.1:{up_port}/v1'}}\n"
        "ladder:\n  - {name: fast, targets: [up/m]}\n  - {name: strong, targets: [up/judge]}\n"
        f"feedback: {{max_entries: 1000, shadow: {{rate: {rate}, judge_rung: strong, "
        f"seed: {SHADOW_SEED!r}}}}}\n"
    )


def _proxy_figures(port: int) -> dict[str, float]:
    """From the proxy's /metrics: shadow judgements by result and skips by reason, and the sums and
    counts of its own time on the module route and of the client rung's upstream attempts."""
    import urllib.request

    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as resp:
        text = resp.read().decode()
    figures: dict[str, float] = {}
    route = "/v1/modules/{name}/execute"
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            labels, key = sample.labels, ""
            if sample.name in ("cognitive_shadow_judgements_total", "cognitive_shadow_skipped_total"):
                key = labels.get("result") or labels.get("reason", "")
            elif sample.name.startswith("cognitive_proxy_overhead_seconds_") and labels.get("route") == route:
                key = "overhead" + sample.name.removeprefix("cognitive_proxy_overhead_seconds")
            elif sample.name.startswith("cognitive_upstream_latency_seconds_") and labels.get("model") == "m":
                key = "upstream" + sample.name.removeprefix("cognitive_upstream_latency_seconds")
            if key and not key.endswith("_bucket") and not key.endswith("_created"):
                figures[key] = figures.get(key, 0.0) + sample.value
    return figures


_JUDGED = ("agree", "disagree", "failed", "gone", "busy", "over_budget")


def _judgements_settled(port: int) -> dict[str, float]:
    """Wait until the proxy's judgements stop growing (none left in the background)."""
    last = _proxy_figures(port)
    while True:
        time.sleep(0.2)
        now = _proxy_figures(port)
        if all(now.get(k) == last.get(k) for k in _JUDGED):
            return now
        last = now


def _cpu_s(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` so far (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def _sequential_traced(url: str, body: dict[str, object], traces: list[str]) -> list[float]:
    """``_sequential`` with an ``X-Request-Id`` per call (the judge's sample is then known)."""
    import aiohttp

    out = []
    async with aiohttp.ClientSession() as session:
        for trace in traces:
            started = time.perf_counter()
            async with session.post(url, json=body, headers={"X-Request-Id": trace}) as resp:
                await resp.read()
                assert resp.status == 200, resp.status
            out.append((time.perf_counter() - started) * 1000)
    return out


SHADOW_SEED = "the bench's shadow sample"
"""The policies' ``feedback.shadow.seed``: the bench knows which of its calls are judged."""


def _in_sample(trace: str, rate: float) -> bool:
    from proxy.service.shadow import sample_key, sampled

    return sampled(trace, rate, sample_key(SHADOW_SEED))


@dataclass
class _ShadowVariant:
    port: int
    rate: float
    pid: int
    lag_file: Path
    latencies: list[float]
    windows: list[tuple[float, float]]
    sampled: int = 0
    backlog_max: int = 0
    """Judgements still queued or running when a block's last call was answered (the largest)."""
    judged_in_blocks: int = 0
    """Judgements that ended while a block of client calls ran."""
    proxy_cpu_s: float = 0.0
    upstream_cpu_s: float = 0.0
    overhead_s: float = 0.0
    upstream_s: float = 0.0


def _lags_ms(variant: _ShadowVariant) -> list[float]:
    """The loop's lateness samples taken while a block of client calls ran."""
    samples = json.loads(variant.lag_file.read_text())
    windows = variant.windows
    return [late * 1000 for at, late in samples if any(a <= at <= b for a, b in windows)]


def shadow_bench(tmpdir: Path, up_port: int, up_pid: int) -> None:
    """Client latency of module calls (c=1) with shadow judging off and at rates 0.05, 0.25 and 1
    (every answer judged on the second rung in the background), in the same run: rounds of one
    block per variant, the order rotating; each variant's distribution compared with off's
    (percentiles, two-sample KS); the judge's lag (its backlog when a block ends, drops); and
    where the difference comes from: CPU seconds per call of the proxy and the upstream, the
    proxy's own time per call (``cognitive_proxy_overhead_seconds``), and the proxy's event-loop
    lateness during the blocks (``lag_probe_proxy.py``)."""
    variants: dict[str, _ShadowVariant] = {}
    procs = []
    probe = Path(__file__).with_name("lag_probe_proxy.py")
    try:
        for name, rate in SHADOW_RATES.items():
            port = free_port()
            policy = tmpdir / f"shadow-{port}.yaml"
            policy.write_text(_shadow_policy(up_port, rate))
            lag_file = tmpdir / f"lag-{port}.json"
            serve = serve_command(policy, port, "--log-level", "warning")[3:]  # from "serve" on: the CLI's
            proc = subprocess.Popen([sys.executable, str(probe), str(lag_file), *serve], cwd=ROOT)
            procs.append(proc)
            variants[name] = _ShadowVariant(port, rate, proc.pid, lag_file, [], [])
        for v in variants.values():
            wait_port(v.port, timeout=60)  # five processes starting at once on a loaded machine
            url = f"http://127.0.0.1:{v.port}/v1/modules/code-reviewer/execute"
            asyncio.run(_sequential_traced(url, MODULE_BODY, [f"warm-{v.port}-{i}" for i in range(50)]))
            _judgements_settled(v.port)
        names = list(variants)
        for block in range(SHADOW_ROUNDS):
            for name in names[block % len(names) :] + names[: block % len(names)]:
                v = variants[name]
                url = f"http://127.0.0.1:{v.port}/v1/modules/code-reviewer/execute"
                traces = [f"shadow-{v.port}-{block}-{i}" for i in range(SHADOW_BLOCK)]  # X-Request-Ids
                sampled = sum(_in_sample(t, v.rate) for t in traces)
                before = _proxy_figures(v.port)
                cpu = (_cpu_s(v.pid), _cpu_s(up_pid))
                started = time.monotonic()
                v.latencies += asyncio.run(_sequential_traced(url, MODULE_BODY, traces))
                v.windows.append((started, time.monotonic()))
                end = _proxy_figures(v.port)
                v.proxy_cpu_s += _cpu_s(v.pid) - cpu[0]
                v.upstream_cpu_s += _cpu_s(up_pid) - cpu[1]
                done = sum(end.get(k, 0.0) - before.get(k, 0.0) for k in _JUDGED)
                v.backlog_max = max(v.backlog_max, sampled - round(done))
                v.judged_in_blocks += round(sum(end.get(k, 0.0) - before.get(k, 0.0) for k in _JUDGED[:4]))
                v.sampled += sampled
                for part in ("overhead", "upstream"):
                    gained = end.get(part + "_sum", 0.0) - before.get(part + "_sum", 0.0)
                    setattr(v, part + "_s", getattr(v, part + "_s") + gained)
                _judgements_settled(v.port)
        counts = {name: _proxy_figures(v.port) for name, v in variants.items()}
    finally:
        for proc in procs:
            proc.terminate()
            proc.wait(timeout=30)
    _shadow_report(variants, counts)


def _shadow_report(variants: dict[str, _ShadowVariant], counts: dict[str, dict[str, float]]) -> None:
    off = variants["off"].latencies
    print(
        f"shadow judging: module call c=1, {SHADOW_ROUNDS} rounds x {SHADOW_BLOCK} calls per variant; "
        "latency in ms; KS against off (critical value at alpha 0.05)"
    )
    for name, v in variants.items():
        values, n = v.latencies, len(v.latencies)
        ks = "" if name == "off" else f", KS {ks_statistic(values, off):.3f} ({ks_critical(n, len(off)):.3f})"
        lags = _lags_ms(v)
        judged = ", ".join(f"{k} {counts[name].get(k, 0):.0f}" for k in _JUDGED if counts[name].get(k))
        mean, own, upstream = statistics.fmean(values), v.overhead_s / n * 1e3, v.upstream_s / n * 1e3
        print(
            f"  {name:<9} p50 {pct(values, 50):.3f} p90 {pct(values, 90):.3f} p99 {pct(values, 99):.3f}{ks}\n"
            f"            mean {mean:.3f} = proxy's own time {own:.3f} + client rung upstream "
            f"{upstream:.3f} + the rest {mean - own - upstream:.3f} (outside the proxy's handler: "
            "sockets, scheduling, the client)\n"
            f"            CPU per call: proxy {v.proxy_cpu_s / n * 1e3:.3f} ms, upstream "
            f"{v.upstream_cpu_s / n * 1e3:.3f} ms; loop lateness during the blocks ({len(lags)} probes): "
            f"p50 {pct(lags, 50):.3f} p99 {pct(lags, 99):.3f} max {max(lags):.3f}\n"
            f"            sampled {v.sampled}, judged while the blocks ran {v.judged_in_blocks}, backlog "
            f"at a block's end <= {v.backlog_max}; in all: {judged or 'none judged'}"
        )


LIMIT_ROUNDS = 3000


async def _p50_us(action: object, rounds: int = LIMIT_ROUNDS) -> float:
    times = []
    for _ in range(rounds):
        started = time.perf_counter()
        await action()  # type: ignore[operator]
        times.append(time.perf_counter() - started)
    return statistics.median(times) * 1e6


def _sync_p50_us(fn: object, repeat: int) -> float:
    assert callable(fn)
    times = []
    for _ in range(repeat):
        started = time.perf_counter()
        fn()
        times.append(time.perf_counter() - started)
    return statistics.median(times) * 1e6


async def _limits_bench() -> None:
    import redis.asyncio as aioredis

    from proxy.clients import Caller, ClientIdentity
    from proxy.limits.limiter import Limiter
    from proxy.limits.windows import MemoryCounters, RedisCounters
    from proxy.policy.limits import LimitSpec, LimitsPolicy
    from tests.support.redis_server import redis_url

    url = redis_url(14)
    big = LimitSpec(rpm=10**9, tpm=10**12, usd_per_day=10**6, usd_per_month=10**7)
    policy = LimitsPolicy(clients={"default": big}, teams={"default": big}, global_=big)
    caller = Caller("bench", ClientIdentity("bench", "team"))
    memory = Limiter(MemoryCounters())
    client = aioredis.from_url(url)
    shared = Limiter(RedisCounters(client), shared=True)
    try:
        rows: list[tuple[str, float, str]] = []
        none = await _p50_us(lambda: memory.admit(LimitsPolicy(), caller, 100))
        rows.append(("no limits configured", none, "baseline"))
        ping = await _p50_us(client.ping)
        rows.append(("redis: PING", ping, "baseline"))
        typical = LimitsPolicy(clients={"default": LimitSpec(rpm=10**9, tpm=10**12, usd_per_day=10**6)})
        for label, limits in (("client rpm+tpm+day", typical), ("client+team+global, all", policy)):
            admitted = await memory.admit(limits, caller, 100)
            mem = await _p50_us(lambda limits=limits: memory.admit(limits, caller, 100))
            rows.append((f"memory: check, {label}", mem, f"{mem / none:.1f}x baseline"))
            mem_settle = await _p50_us(lambda admitted=admitted: memory.settle(admitted, 120, 0.001))
            rows.append((f"memory: settle, {label}", mem_settle, f"{mem_settle / none:.1f}x baseline"))
            admitted = await shared.admit(limits, caller, 100)
            red = await _p50_us(lambda limits=limits: shared.admit(limits, caller, 100))
            rows.append((f"redis: check, {label}", red, f"{red / ping:.2f}x PING"))
            red_settle = await _p50_us(lambda admitted=admitted: shared.settle(admitted, 120, 0.001))
            rows.append((f"redis: settle, {label}", red_settle, f"{red_settle / ping:.2f}x PING"))
        print(f"{'limit check (one request)':<44}{'p50 us':>10}  ratio")
        for name, us, ratio in rows:
            print(f"{name:<44}{us:>10.1f}  {ratio}")
        keys = await client.keys("{cogproxy:limits}:*")
        if keys:
            await client.delete(*keys)
    finally:
        await shared.aclose()
        await memory.aclose()


def redis_paths_bench() -> None:
    """``--redis-paths``: Redis on the request path, per kind of request (``redis_paths.py``)."""
    sys.path.insert(0, str(ROOT))
    from tests.perf import redis_paths

    with tempfile.TemporaryDirectory() as tmp:
        redis_paths.run(serve_command, free_port, wait_port, Path(tmp))


def limits_bench() -> None:
    sys.path.insert(0, str(ROOT))
    asyncio.run(_limits_bench())


STREAM_COPY_DB = 12
STREAM_COPY_ANSWERS = 8
"""Answers per stream: 16 x 8 = 128 sessions per row."""
STREAM_COPY_STEP_S = 0.005
STREAM_COPY_GIVE_UP_S = 10.0
STREAM_COPY_WINDOWS_S = (1.0, 2.0)


def _lag_ms(lags: list[float | None], q: float) -> str:
    """The ``q``-th percentile of ``lags`` in ms; a session never whole counts as past the last."""
    ordered = sorted(math.inf if lag is None else lag for lag in lags)
    value = ordered[min(len(ordered) - 1, math.ceil(q / 100 * len(ordered)) - 1)]
    return f">{STREAM_COPY_GIVE_UP_S:g} s" if math.isinf(value) else f"{value * 1000:.1f}"


def stream_copy_bench() -> None:
    """``--stream-copy``: the stream-recovery copy at 16 concurrent module streams (#32 item 2),
    the test's load (``tests/support/stream_copy.py``), Redis direct, and through a relay process
    adding +0 ms and +5 ms per round trip (``tests/redis_relay.py``)."""
    sys.path.insert(0, str(ROOT))
    from tests.perf.redis_paths import relay
    from tests.support.redis_db import fresh_db
    from tests.support.redis_server import redis_port, redis_url
    from tests.support.stream_copy import STREAMS, copy_lags, share_within

    async def row(url: str) -> list[float | None]:
        async with fresh_db(STREAM_COPY_DB) as store:
            return await copy_lags(
                url, store, STREAM_COPY_GIVE_UP_S, answers=STREAM_COPY_ANSWERS, step=STREAM_COPY_STEP_S
            )

    sessions = STREAMS * STREAM_COPY_ANSWERS
    print(
        f"stream-recovery copy: {STREAMS} concurrent module streams x {STREAM_COPY_ANSWERS} answers "
        f"({sessions} sessions a row); lag = last chunk to whole in Redis, looked for every "
        f"{STREAM_COPY_STEP_S * 1000:g} ms"
    )
    windows = "".join(f"{f'within {w:g} s':>12}" for w in STREAM_COPY_WINDOWS_S)
    print(f"{'Redis':<18}{windows}{'lag p50 ms':>12}{'lag p99 ms':>12}")
    cells: list[tuple[str, float | None]] = [
        ("+0 ms (direct)", None),
        ("+0 ms (relay)", 0.0),
        ("+5 ms (relay)", 5.0),
    ]
    for label, delay_ms in cells:
        with contextlib.ExitStack() as stack:
            if delay_ms is None:
                url = redis_url(STREAM_COPY_DB)
            else:
                url = (
                    f"redis://127.0.0.1:{stack.enter_context(relay(redis_port(), delay_ms))}/{STREAM_COPY_DB}"
                )
            lags = asyncio.run(row(url))
        shares = "".join(f"{share_within(lags, w):>12.1%}" for w in STREAM_COPY_WINDOWS_S)
        print(f"{label:<18}{shares}{_lag_ms(lags, 50):>12}{_lag_ms(lags, 99):>12}")


def composition_bench(repeat: int = 3_000) -> None:
    """Composition overhead per step: a 3-step sequential composite (mapping, a condition on
    meta, merge) against the same 3 module calls made directly, through an instant in-process
    provider, in the same run. Overhead per step = (composite - 3 direct calls) / 3."""
    sys.path.insert(0, str(ROOT))
    from proxy.compose.run import Composer
    from proxy.module.registry import ModuleRegistry
    from proxy.pipeline import ModuleRun, run_module
    from proxy.policy.loader import parse_policy
    from proxy.state.memory import MemoryBreakerStore
    from proxy.upstream.breaker import Breakers
    from proxy.upstream.router import Router
    from tests.compose.build import answer, make_module

    reply = {
        **COMPLETION,
        "choices": [
            {
                **COMPLETION["choices"][0],
                "message": {"role": "assistant", "content": answer(0.9, summary="s")},
            }
        ],
    }

    class Instant:
        async def complete(self, body: object, model: str, ctx: object, timeout: float) -> dict[str, object]:
            return reply

    with tempfile.TemporaryDirectory() as tmp:
        mods = Path(tmp)
        for name in ("s1", "s2", "s3"):
            make_module(mods, name)
        make_module(
            mods,
            "pipe",
            composition={
                "requires": [{"name": n, "version": ">=1.0.0"} for n in ("s1", "s2", "s3")],
                "dataflow": [
                    {"from": "input", "to": "s1", "mapping": {"text": "$.text"}},
                    {
                        "from": "s1.output",
                        "to": "s2",
                        "mapping": {"summary": "$.data.summary"},
                        "condition": "$.meta.confidence > 0.5",
                    },
                    {
                        "from": ["input", "s2.output"],
                        "to": "s3",
                        "mapping": {"text": "$.input.text", "prior": "$.s2.data"},
                    },
                    {"from": ["s1.output", "s2.output", "s3.output"], "to": "output", "aggregate": "merge"},
                ],
            },
        )
        registry = ModuleRegistry.load([mods])
    policy = parse_policy(
        {
            "version": 1,
            "providers": {"up": {"kind": "openai", "base_url": "http://127.0.0.1:9/v1"}},
            "ladder": [{"name": "only", "targets": ["up/m"]}],
        }
    )
    providers = {"up": Instant()}
    value = {"text": "hello"}

    async def measure() -> tuple[float, float]:
        router = Router(Breakers(MemoryBreakerStore()))
        composer = Composer(registry.modules, run_module)
        direct: list[float] = []
        composed: list[float] = []
        for _ in range(repeat):
            t0 = time.perf_counter()
            for name in ("s1", "s2", "s3"):
                await run_module(ModuleRun(registry.modules[name], value, policy, providers, router))  # type: ignore[arg-type]
            t1 = time.perf_counter()
            pipe = registry.modules["pipe"]
            answer_ = await composer.run(ModuleRun(pipe, value, policy, providers, router))  # type: ignore[arg-type]
            t2 = time.perf_counter()
            assert answer_.envelope["ok"] is True, answer_.envelope
            direct.append(t1 - t0)
            composed.append(t2 - t1)
        return statistics.median(direct), statistics.median(composed)

    direct_s, composed_s = asyncio.run(measure())
    per_step_ms = (composed_s - direct_s) / 3 * 1e3
    print(
        f"composition, 3-step sequential composite: {composed_s * 1e3:.4f} ms p50; the same 3 module calls "
        f"direct: {direct_s * 1e3:.4f} ms p50 (ratio {composed_s / direct_s:.2f}); overhead per step "
        f"{per_step_ms:.4f} ms p50 (goal <= 0.3 ms)"
    )


def feedback_bench() -> None:
    """Added per-call cost of feedback and calibration, against the existing per-answer metrics."""
    sys.path.insert(0, str(ROOT))
    from proxy.api.envelopes import answer_headers
    from proxy.contract.errors import Origin
    from proxy.module.registry import ModuleRegistry
    from proxy.observability.metrics import Metrics
    from proxy.pipeline import Attempt, ModuleAnswer
    from proxy.policy.loader import parse_policy
    from proxy.service.instrument import record_module_answer
    from proxy.service.records import answer_record
    from proxy.state.feedback import MemoryFeedbackStore

    module = ModuleRegistry.load((ROOT / "modules",)).modules["code-reviewer"]
    doc = {
        "version": 1,
        "providers": {"up": {"kind": "openai", "base_url": "http://127.0.0.1:1/v1"}},
        "ladder": [{"name": "fast", "targets": ["up/m"]}],
    }
    mapped = parse_policy(
        {**doc, "calibration": {"up/m": {"points": [[0.5, 0.2], [0.7, 0.4], [0.9, 0.6], [1.0, 0.7]]}}}
    )
    metrics = Metrics()
    store = MemoryFeedbackStore()
    bound = mapped.feedback.max_entries
    attempt = Attempt("fast", "up/m", "accept", 0.93, "low", 12.0, calibrated=0.66, model_risk="low")
    answer = ModuleAnswer(
        module, json.loads(json.dumps(ENVELOPE)), "accept", Origin.MODEL, (attempt,), "up/m"
    )
    counter = iter(range(10**9))
    for i in range(bound):  # a full store: every write also evicts
        store.remember(answer_record(answer, module, mapped, f"warm-{i}", "sk-client") or _fail(), bound)

    def added() -> None:
        mapped.calibrate("up/m", 0.93)
        metrics.confidence_calibrated.labels(module.name, module.tier).observe(0.66)
        record = answer_record(answer, module, mapped, f"t-{next(counter)}", "sk-client")
        assert record is not None
        store.remember(record, bound)
        answer_headers(answer)

    def baseline() -> None:
        record_module_answer(metrics, mapped, answer)

    repeat = 20_000
    base, extra = _sync_p50_us(baseline, repeat), _sync_p50_us(added, repeat)
    print(f"{'feedback per module call':<34}{'p50 us':>10}{'x baseline':>12}")
    print(f"{'baseline: per-answer metrics':<34}{base:>10.2f}{1.0:>12.2f}")
    print(f"{'added: feedback + calibration':<34}{extra:>10.2f}{extra / base:>12.2f}")


WORKERS_BENCH_CONCURRENCY = 64
METRICS_COST_CODE = r"""
import json, statistics, sys, time
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families
from proxy.observability.metrics import Metrics

mode, action = sys.argv[1], sys.argv[2]
MODULES = [f"module-{i}" for i in range(11)]
ROUTES = [f"/route/{i}" for i in range(10)]
TARGETS = [(f"p{i}", f"m{i}") for i in range(4)]


def populate(m):
    # The series a proxy with 11 modules, 10 routes and 4 targets carries after some traffic.
    for route in ROUTES:
        for status in (200, 400, 429, 502):
            m.observe_request(route, "none", status, "none", 0.0004)
    for provider, model in TARGETS:
        for outcome in ("ok", "timeout"):
            m.observe_upstream(provider, model, outcome, 0.2)
        for kind in ("prompt", "completion"):
            m.tokens.labels(provider, model, kind).inc(10)
    for module in MODULES:
        for tier in ("exec", "decision", "exploration"):
            for attempt in ("final", "intermediate"):
                m.confidence.labels(module, tier, attempt).observe(0.8)
            m.decisions.labels(module, tier, "accept").inc()
        for provider, model in TARGETS:
            m.cost.labels(module, provider, model, "other").inc(0.001)


def per_op_us(fn, n=50_000):
    runs = []
    for _ in range(5):
        t = time.perf_counter()
        for _ in range(n):
            fn()
        runs.append((time.perf_counter() - t) / n * 1e6)
    return statistics.median(runs)


def ms(fn, n=30):
    runs = []
    for _ in range(n):
        t = time.perf_counter()
        fn()
        runs.append((time.perf_counter() - t) * 1e3)
    return statistics.median(runs)


def summed(texts):
    # What a parent scraping per-worker ports would do: parse each, add up, render.
    totals = {}
    for text in texts:
        for family in text_string_to_metric_families(text):
            for s in family.samples:
                key = (s.name, tuple(sorted(s.labels.items())))
                totals[key] = totals.get(key, 0.0) + s.value
    return "".join(
        f"{name}{{{','.join(f'{k}={v!r}' for k, v in labels)}}} {value}\n"
        for (name, labels), value in totals.items()
    )


m = Metrics(multiprocess=mode == "multiprocess")
populate(m)
if action == "populate":
    raise SystemExit(0)
c = m.requests.labels("/v1/chat/completions", "none", "200", "none")
h = m.overhead.labels("/v1/chat/completions")
out = {
    "inc_us": per_op_us(c.inc),
    "observe_us": per_op_us(lambda: h.observe(0.0004)),
    "request_us": per_op_us(
        lambda: (
            m.observe_request("/v1/chat/completions", "none", 200, "none", 0.0004),
            m.observe_upstream("up", "m", "ok", 0.01),
        )
    ),
    "scrape_ms": ms(lambda: generate_latest(m.exposed())),
}
if mode == "ports":
    others = [m]
    for _ in range(int(sys.argv[3]) - 1):
        other = Metrics()
        populate(other)
        others.append(other)
    out["scrape_ms"] = ms(lambda: summed([generate_latest(o.registry).decode() for o in others]))
print(json.dumps(out))
"""


def _metrics_cost(mode: str, workers: int) -> dict[str, float]:
    """``METRICS_COST_CODE`` in a fresh interpreter (the multiprocess mode is chosen at import);
    in that mode ``workers - 1`` other processes write their files first, so the scrape adds up
    ``workers`` workers' files."""
    env = {k: v for k, v in os.environ.items() if k != "PROMETHEUS_MULTIPROC_DIR"}
    with tempfile.TemporaryDirectory(dir="/dev/shm" if os.access("/dev/shm", os.W_OK) else None) as shared:
        if mode == "multiprocess":
            env["PROMETHEUS_MULTIPROC_DIR"] = shared
            for _ in range(workers - 1):
                subprocess.run(
                    [sys.executable, "-c", METRICS_COST_CODE, mode, "populate"], env=env, cwd=ROOT, check=True
                )
        out = subprocess.run(
            [sys.executable, "-c", METRICS_COST_CODE, mode, "measure", str(workers)],
            env=env,
            cwd=ROOT,
            check=True,
            capture_output=True,
            text=True,
        ).stdout
    result: dict[str, float] = json.loads(out)
    return result


def _proxy_pids(parent: int) -> list[int]:
    children = Path(f"/proc/{parent}/task/{parent}/children").read_text().split()
    return [parent, *map(int, children)]


def _wait_workers(port: int, workers: int) -> None:
    """Until ``workers`` distinct worker pids answered /readyz (a new connection each)."""
    import urllib.request

    seen: set[int] = set()
    deadline = time.monotonic() + 60
    while len(seen) < workers and time.monotonic() < deadline:
        with (
            contextlib.suppress(OSError),
            urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=5) as resp,
        ):
            seen.add(json.loads(resp.read())["worker"]["pid"])
    if len(seen) < workers:
        raise RuntimeError(f"only {len(seen)} of {workers} workers answered")


def _scrape_ms(port: int, count: int = 30) -> float:
    import urllib.request

    samples = []
    for _ in range(count):
        started = time.perf_counter()
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
            resp.read()
        samples.append((time.perf_counter() - started) * 1000)
    return statistics.median(samples)


def _serve_workers(policy: Path, port: int, workers: int, log: IO[bytes]) -> subprocess.Popen[bytes]:
    """``serve --workers N`` with every default on: its log lines go to ``log``."""
    command = serve_command(policy, port, "--workers", str(workers))
    proxy = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=log)
    wait_port(port)
    if workers > 1:
        _wait_workers(port, workers)
    return proxy


def _machine_jiffies() -> tuple[int, int, int]:
    """(busy, kernel interrupts, total) CPU jiffies of the whole machine so far (``/proc/stat``):
    interrupts (irq, softirq: loopback TCP is processed there) are charged to no process."""
    fields = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = fields[3] + fields[4]  # idle + iowait
    total = sum(fields[:8])  # guest time is counted in user time already
    return total - idle, fields[5] + fields[6], total


def _children_cpu_seconds() -> float:
    """CPU seconds of this process's waited-for children (each wrk run)."""
    import resource

    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _system_seconds(pid: int) -> float:
    """The kernel's part of ``cpu_seconds(pid)``."""
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[12]) / CLOCK_TICKS


def _requests_per_pid(parent: int) -> dict[int, float]:
    """``cognitive_requests_total`` per worker pid, from the multiprocess metric files the
    supervisor ``parent`` gave its workers (``/dev/shm`` or the temporary directory); {} when
    there are none (one worker keeps its metrics in memory)."""
    from prometheus_client.mmap_dict import MmapedDict

    from proxy.supervisor import METRICS_DIR_BASES, METRICS_DIR_PREFIX

    counts: dict[int, float] = {}
    for base in (*METRICS_DIR_BASES, tempfile.gettempdir()):
        for path in Path(base).glob(f"{METRICS_DIR_PREFIX}{parent}-*/counter_*.db"):
            pid = int(path.stem.removeprefix("counter_"))
            values = MmapedDict.read_all_values_from_file(str(path))  # type: ignore[no-untyped-call]  # untyped library
            for key, value, _, _ in values:
                if json.loads(key)[1] == "cognitive_requests_total":
                    counts[pid] = counts.get(pid, 0.0) + value
    return counts


@dataclass
class WorkersRun:
    """One wrk run against ``serve --workers N``: what it served and what it cost whom."""

    result: WrkResult
    worker_cpu_ms: dict[int, float]
    """CPU ms per request of each worker process (its CPU time / the requests it served)."""
    worker_sys_ms: dict[int, float]
    """The kernel's part of ``worker_cpu_ms`` (system time: sockets, epoll)."""
    worker_share: dict[int, float]
    """Each worker's share of the requests."""
    worker_syscalls: dict[int, dict[str, float]]
    """Each worker's system calls and event-loop waits per request (``workers_cost.syscalls``)."""
    proxy_cpu_ms: float
    """All the proxy's processes (the supervisor too) per request."""
    machine: dict[str, float]
    """Shares of the machine's CPU capacity (cores x wall time) during the run: the proxy, wrk, the
    upstream, kernel interrupts (loopback TCP), every other process, idle."""


def _workers_run(
    proxy: subprocess.Popen[bytes], port: int, upstream_pid: int, workers: int, duration: int, tmp: Path
) -> WorkersRun:
    from tests.perf import workers_cost

    pids = _proxy_pids(proxy.pid)
    workers_pids = pids[1:] if workers > 1 else pids
    cpu0 = {pid: cpu_seconds(pid) for pid in pids}
    sys0 = {pid: _system_seconds(pid) for pid in pids}
    served0 = _requests_per_pid(proxy.pid)
    up0, wrk0, (busy0, irq0, total0) = cpu_seconds(upstream_pid), _children_cpu_seconds(), _machine_jiffies()
    with workers_cost.syscalls(workers_pids) as calls:
        res = wrk(
            f"http://127.0.0.1:{port}/v1/chat/completions",
            CHAT_BODY,
            WORKERS_BENCH_CONCURRENCY,
            duration,
            tmp,
        )
    busy1, irq1, total1 = _machine_jiffies()
    capacity = (total1 - total0) / CLOCK_TICKS
    spent = {pid: cpu_seconds(pid) - cpu0[pid] for pid in pids}
    kernel = {pid: _system_seconds(pid) - sys0[pid] for pid in pids}
    up, wrk_cpu = cpu_seconds(upstream_pid) - up0, _children_cpu_seconds() - wrk0
    served = _requests_per_pid(proxy.pid)
    per_worker = (
        {pid: served.get(pid, 0.0) - served0.get(pid, 0.0) for pid in workers_pids}
        if workers > 1
        else {pids[0]: float(res.requests)}
    )
    total_served = sum(per_worker.values()) or 1.0
    proxy_cpu = sum(spent.values())
    busy, irq = (busy1 - busy0) / CLOCK_TICKS, (irq1 - irq0) / CLOCK_TICKS
    machine = {
        "proxy": proxy_cpu / capacity,
        "wrk": wrk_cpu / capacity,
        "upstream": up / capacity,
        "interrupts": irq / capacity,
        "other": max(busy - irq - proxy_cpu - wrk_cpu - up, 0.0) / capacity,
        "idle": 1 - busy / capacity,
    }
    return WorkersRun(
        res,
        {pid: spent[pid] * 1000 / max(n, 1.0) for pid, n in per_worker.items()},
        {pid: kernel[pid] * 1000 / max(n, 1.0) for pid, n in per_worker.items()},
        {pid: n / total_served for pid, n in per_worker.items()},
        {pid: {k: v / max(per_worker[pid], 1.0) for k, v in calls[pid].items()} for pid in calls},
        proxy_cpu * 1000 / max(res.requests, 1),
        machine,
    )


def _workers_cost(cpu_ms: dict[int, float], kernel_ms: dict[int, float], policy: Path, tmp: Path) -> None:
    """Why a worker's CPU per request moved (``workers_cost``): instructions per request under
    callgrind and the no-proxy control, set against the wrk rounds' ``cpu_ms`` and ``kernel_ms``
    (per request per worker, by worker count); left out with the reason without valgrind."""
    if shutil.which("valgrind") is None or shutil.which("callgrind_control") is None:
        print("workers: instructions left out: valgrind is not installed (apt-get install -y valgrind)")
        return
    from tests.perf import workers_cost

    def load(port: int, seconds: int) -> int:
        url = f"http://127.0.0.1:{port}/v1/chat/completions"
        return wrk(url, CHAT_BODY, workers_cost.INSTRUCTIONS_CONCURRENCY, seconds, tmp).requests

    rows = workers_cost.instructions(serve_command, free_port, load, policy, tmp)
    split = workers_cost.Split(cpu_ms, kernel_ms, rows, workers_cost.control())
    for line in workers_cost.report(split):
        print(line)


def workers_bench(duration: int, rounds: int = 2) -> None:
    """``serve --workers 1`` against ``--workers 2`` in front of the same no-delay upstream:
    passthrough chat at c=64 (wrk), in alternating rounds (both proxies run throughout, so both
    see the same machine load): requests/s, the CPU of all the proxy's processes per request
    and a /metrics scrape after the load; per worker process, its CPU time per request it served
    and its share of the requests (how evenly SO_REUSEPORT spread wrk's connections); the shares
    of the machine's CPU the proxy, wrk, the upstream and everything else took. Then what summing
    metrics over workers costs: prometheus-client's multiprocess files (what ``--workers`` uses)
    against per-worker registries a parent would scrape and add up (``ports``; HTTP round trips
    not counted).

    Why per-request CPU: on a machine whose cores wrk and the upstream share, the second worker
    cannot show its throughput; if each worker's CPU per request stays what one worker's is, the
    workers do not contend and throughput scales with the free cores. Its user and kernel parts
    are kept apart for ``_workers_cost``, which says what moved it."""
    if shutil.which("wrk") is None:
        print("wrk is not installed: apt-get install -y wrk", file=sys.stderr)
        return
    sys.path.insert(0, str(ROOT))
    up_port = free_port()
    with tempfile.TemporaryDirectory() as tmp, contextlib.ExitStack() as stack:
        tmpdir = Path(tmp)
        policy = tmpdir / "policy.yaml"
        policy.write_text(bench_policy(up_port))
        upstream = subprocess.Popen([sys.executable, __file__, "--upstream", str(up_port)])
        proxies: dict[int, tuple[subprocess.Popen[bytes], int]] = {}
        try:
            wait_port(up_port)
            for workers in (1, 2):
                port = free_port()
                log = stack.enter_context((tmpdir / f"workers-{workers}.log").open("wb"))
                proxies[workers] = (_serve_workers(policy, port, workers, log), port)
                wrk(f"http://127.0.0.1:{port}/v1/chat/completions", CHAT_BODY, 4, 2, tmpdir)  # warm-up
            direct = wrk(f"http://127.0.0.1:{up_port}/v1/chat/completions", CHAT_BODY, 64, duration, tmpdir)
            print(f"workers: direct upstream at c={WORKERS_BENCH_CONCURRENCY}: {direct.rps:.0f} rps")
            print(
                f"{'workers':<9}{'rps':>9}{'p50 ms':>9}{'p99 ms':>9}{'cpu ms/req':>12}{'scrape ms':>11}"
                f"  {'per worker: cpu ms/req (share of requests)':<44}"
                f"{'machine CPU: proxy / wrk / upstream / interrupts / other processes / idle'}"
            )
            runs: dict[int, list[WorkersRun]] = {1: [], 2: []}
            for _ in range(rounds):
                for workers, (proxy, port) in proxies.items():
                    run = _workers_run(proxy, port, upstream.pid, workers, duration, tmpdir)
                    runs[workers].append(run)
                    each = ", ".join(
                        f"{run.worker_cpu_ms[pid]:.3f} ({run.worker_share[pid]:.0%})"
                        for pid in run.worker_cpu_ms
                    )
                    shares = " / ".join(f"{v:.0%}" for v in run.machine.values())
                    print(
                        f"{workers:<9}{run.result.rps:>9.0f}{run.result.p50_ms:>9.2f}{run.result.p99_ms:>9.2f}"
                        f"{run.proxy_cpu_ms:>12.3f}{_scrape_ms(port):>11.2f}  {each:<44}{shares}"
                    )
            ratio = statistics.median(r.result.rps for r in runs[2]) / statistics.median(
                r.result.rps for r in runs[1]
            )
            per_req = {
                n: statistics.median(statistics.fmean(r.worker_cpu_ms.values()) for r in runs[n])
                for n in runs
            }
            kernel_ms = {
                n: statistics.median(statistics.fmean(r.worker_sys_ms.values()) for r in runs[n])
                for n in runs
            }
            calls = {
                n: {
                    kind: statistics.median(
                        statistics.fmean(c.get(kind, 0.0) for c in r.worker_syscalls.values())
                        for r in runs[n]
                    )
                    for kind in ("syscalls", "loop waits", "getpid")
                }
                for n in runs
                if all(r.worker_syscalls for r in runs[n])
            }
            free = statistics.median(r.machine["idle"] for r in runs[2])
            print(
                f"workers: rps ratio 2/1 = {ratio:.2f} (medians of {rounds} rounds), {os.cpu_count()} CPUs; "
                f"CPU per request per worker {per_req[1]:.3f} ms with 1, {per_req[2]:.3f} ms with 2 "
                f"({per_req[2] / per_req[1]:.2f}x: flat means no contention between workers), of which "
                f"the kernel {kernel_ms[1]:.3f} and {kernel_ms[2]:.3f} ms; "
                f"idle CPU left during the 2-worker runs {free:.0%}"
            )
            if len(calls) == 2:  # perf could trace both
                print(
                    f"workers: per request per worker, system calls {calls[1]['syscalls']:.1f} with 1, "
                    f"{calls[2]['syscalls']:.1f} with 2; event-loop waits {calls[1]['loop waits']:.2f} and "
                    f"{calls[2]['loop waits']:.2f} (fewer: more requests served per pass of the loop); "
                    f"getpid (the metric files' fork check) {calls[1]['getpid']:.1f} and "
                    f"{calls[2]['getpid']:.1f}"
                )
            _workers_cost(per_req, kernel_ms, policy, tmpdir)
        finally:
            for proxy, _ in proxies.values():
                proxy.terminate()
                proxy.wait(timeout=60)
            upstream.terminate()
            upstream.wait(timeout=30)
    print(
        f"{'metrics across 2 workers':<28}{'inc us':>9}{'observe us':>12}{'request us':>12}{'scrape ms':>11}"
    )
    for label, mode in (
        ("one process (baseline)", "single"),
        ("multiprocess files", "multiprocess"),
        ("per-worker ports, summed", "ports"),
    ):
        cost = _metrics_cost(mode, 2)
        print(
            f"{label:<28}{cost['inc_us']:>9.3f}{cost['observe_us']:>12.3f}{cost['request_us']:>12.3f}"
            f"{cost['scrape_ms']:>11.2f}"
        )


INSTRUCTIONS_SECONDS = 15
"""How long wrk drives each server under callgrind (about 1,000 requests: it runs ~50x slower)."""
STREAM_TOKENS = (20, 80)
"""Streamed answers of this many frames (plus [DONE]): the first is the cell of the goal, the
slope between them is what each further chunk costs."""
COUNTED_FLAGS = ("--reload-interval", "0")
"""The proxies whose instructions are counted per request do not poll their files: the poll costs
per second, not per request (``_idle_rate`` prints it), and would be spread over however many
requests the loaded machine let through."""
IDLE_SECONDS = 10
IDLE_SETTLE_SECONDS = 2
STREAM_REQUESTS = 32
STREAM_CONCURRENCY = 4


@contextlib.contextmanager
def _callgrind(command: list[str], port: int, tmp: Path, name: str) -> Iterator[Callable[[], float]]:
    """``command`` under callgrind, counting off until the first ``count()``; each later one
    returns the user-space instructions since the one before."""
    out = tmp / f"callgrind.{name}"
    server = subprocess.Popen(
        ["valgrind", "--tool=callgrind", "--instr-atstart=no", f"--callgrind-out-file={out}", *command],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    dumps = -1

    def control(*flags: str) -> None:
        subprocess.run(["callgrind_control", *flags, str(server.pid)], check=True, capture_output=True)

    def count() -> float:
        nonlocal dumps
        if dumps < 0:
            dumps = 0
            control("-i", "on")
            return 0.0
        control("-i", "off")
        control("-d")  # dumps the counts and zeroes them
        dumps += 1
        dump = tmp / f"callgrind.{name}.{dumps}"  # the exit dump has no number
        if not dump.exists():
            raise RuntimeError(f"callgrind wrote no {dump.name}: {sorted(p.name for p in tmp.iterdir())}")
        totals = subprocess.run(["callgrind_annotate", str(dump)], check=True, capture_output=True, text=True)
        found = re.search(r"^([\d,]+) .*PROGRAM TOTALS", totals.stdout, re.M)
        if found is None:
            raise RuntimeError(f"no totals in {dump}")
        control("-i", "on")
        return int(found[1].replace(",", ""))

    try:
        wait_port(port, timeout=300)
        yield count
    finally:
        server.terminate()
        server.wait(timeout=120)


def _instructions(command: list[str], port: int, url: str, tmp: Path, name: str) -> float:
    """User-space instructions per request of ``command`` serving ``url``: counted by callgrind
    only while wrk runs (c=8), so start-up is left out. Repeatable whatever else the machine does."""
    with _callgrind(command, port, tmp, name) as count:
        wrk(url, CHAT_BODY, 8, 3, tmp)  # warm-up, not counted
        count()  # zero: counting starts here
        res = wrk(url, CHAT_BODY, 8, INSTRUCTIONS_SECONDS, tmp)
        return count() / max(res.requests, 1)


async def _streams(url: str, tokens: int, requests: int) -> None:
    """``requests`` streamed chat answers of ``tokens`` frames, ``STREAM_CONCURRENCY`` at a time,
    each read to its end and checked whole (every frame and [DONE], nothing else)."""
    import aiohttp

    body = {**STREAM_BODY, "max_tokens": tokens}
    left = requests
    async with aiohttp.ClientSession() as session:

        async def worker() -> None:
            nonlocal left
            while left > 0:
                left -= 1
                async with session.post(url, json=body) as resp:
                    data = await resp.read()
                frames = data.count(b"\n\n")
                if resp.status != 200 or frames != tokens + 1 or not data.endswith(b"data: [DONE]\n\n"):
                    raise RuntimeError(f"{url}: {resp.status}, {frames} frames: {data[-200:]!r}")

        await asyncio.gather(*(worker() for _ in range(STREAM_CONCURRENCY)))


def _stream_instructions(command: list[str], port: int, url: str, tmp: Path, name: str) -> list[float]:
    """Instructions per streamed request of each length of ``STREAM_TOKENS`` (callgrind, exactly
    ``STREAM_REQUESTS`` requests counted per length: none cut by the start or end of counting)."""
    per_request = []
    with _callgrind(command, port, tmp, name) as count:
        asyncio.run(_streams(url, STREAM_TOKENS[0], STREAM_CONCURRENCY * 2))  # warm-up, not counted
        count()
        for tokens in STREAM_TOKENS:
            asyncio.run(_streams(url, tokens, STREAM_REQUESTS))
            per_request.append(count() / STREAM_REQUESTS)
    return per_request


MODULE_STREAM_CALLS = 100
"""Streamed module calls counted per server (c=1, each read to its end): ~10 s under callgrind."""


def _module_stream_instructions(
    command: list[str], port: int, url: str, body: dict[str, object], marker: bytes, tmp: Path, name: str
) -> float:
    """Instructions per streamed module call of ``command`` (callgrind): ``MODULE_STREAM_CALLS``
    calls one at a time, each read past its first ``marker`` to its end, start-up and warm-up left
    out. The whole call: the cut of what precedes the first delta, not work moved after it."""
    with _callgrind(command, port, tmp, name) as count:
        asyncio.run(first_delta(url, body, marker, 20))  # warm-up, not counted
        count()
        asyncio.run(first_delta(url, body, marker, MODULE_STREAM_CALLS))
        return count() / MODULE_STREAM_CALLS


def module_stream_rows(up_port: int, tmp: Path) -> dict[str, float]:
    """Instructions per streamed module call (``/execute``, SSE, code-reviewer's bench input), and
    the floor relay's for the same upstream stream (the answer's frames relayed as they are)."""
    policy = tmp / "module-instructions-policy.yaml"
    policy.write_text(bench_policy(up_port))
    floor_port, proxy_port = free_port(), free_port()
    floor_url = f"http://127.0.0.1:{floor_port}/v1/chat/completions"
    proxy_url = f"http://127.0.0.1:{proxy_port}/v1/modules/code-reviewer/execute"
    floor = _module_stream_instructions(
        floor_command(floor_port, up_port),
        floor_port,
        floor_url,
        STREAM_MODULE_BODY,
        b"data: ",
        tmp,
        "floor-module",
    )
    proxy = _module_stream_instructions(
        serve_command(policy, proxy_port, *COUNTED_FLAGS),
        proxy_port,
        proxy_url,
        MODULE_BODY,
        b"event: chunk",
        tmp,
        "proxy-module",
    )
    return {"floor relay, streamed module answer": floor, "streamed module call (execute, SSE)": proxy}


def module_instructions_section(up_port: int, tmp: Path) -> None:
    """Only the streamed module call's row of the instructions section (``--module-instructions``)."""
    if shutil.which("valgrind") is None or shutil.which("callgrind_control") is None:
        print("instructions: valgrind is not installed (apt-get install -y valgrind)", file=sys.stderr)
        return
    rows = module_stream_rows(up_port, tmp)
    floor = rows["floor relay, streamed module answer"]
    print(f"{'instructions per request (callgrind)':<40}{'Ir':>12}  ratio")
    for name, count in rows.items():
        print(f"{name:<40}{count:>12,.0f}  {count / floor:.2f}")


def _idle_rate(command: list[str], port: int, tmp: Path, name: str) -> float:
    """Instructions per second of ``command`` serving nothing (callgrind)."""
    with _callgrind(command, port, tmp, name) as count:
        # A rate per second is measured over seconds: these are the measurement's windows (start-up's
        # tail, dropped; then the idle window), not waits for a condition that could be polled.
        time.sleep(IDLE_SETTLE_SECONDS)
        count()
        time.sleep(IDLE_SECONDS)
        return count() / IDLE_SECONDS


def instructions_section(up_port: int, tmp: Path) -> None:
    """Instructions per request, floor relay and proxy, under callgrind: the one measure here that
    machine load does not move (both run the same Python and aiohttp). Passthrough chat, plain and
    streamed (``STREAM_TOKENS`` frames at 50 per second), and the instructions each further
    streamed chunk adds (the slope between the two lengths)."""
    if shutil.which("valgrind") is None or shutil.which("callgrind_control") is None:
        print("instructions: valgrind is not installed (apt-get install -y valgrind)", file=sys.stderr)
        return
    policy = tmp / "instructions-policy.yaml"
    policy.write_text(bench_policy(up_port))
    floor_port, proxy_port = free_port(), free_port()
    floor = [sys.executable, str(Path(__file__).with_name("floor_relay.py")), "--port", str(floor_port)]
    floor += ["--upstream", f"http://127.0.0.1:{up_port}/v1"]
    proxy = serve_command(policy, proxy_port, *COUNTED_FLAGS)
    floor_url = f"http://127.0.0.1:{floor_port}/v1/chat/completions"
    proxy_url = f"http://127.0.0.1:{proxy_port}/v1/chat/completions"
    plain = {
        "floor relay": _instructions(floor, floor_port, floor_url, tmp, "floor"),
        "passthrough": _instructions(proxy, proxy_port, proxy_url, tmp, "proxy"),
    }
    floor_streams = _stream_instructions(floor, floor_port, floor_url, tmp, "floor-stream")
    proxy_streams = _stream_instructions(proxy, proxy_port, proxy_url, tmp, "proxy-stream")
    short, long = STREAM_TOKENS
    rows = {**plain, f"floor relay, streamed {short} chunks": floor_streams[0]}
    rows[f"passthrough, streamed {short} chunks"] = proxy_streams[0]
    floors = dict.fromkeys(plain, plain["floor relay"])
    floors.update({name: floor_streams[0] for name in rows if "streamed" in name})
    module_rows = module_stream_rows(up_port, tmp)
    rows.update(module_rows)
    floors.update(dict.fromkeys(module_rows, module_rows["floor relay, streamed module answer"]))
    print(f"{'instructions per request (callgrind)':<40}{'Ir':>12}  ratio")
    for name, count in rows.items():
        print(f"{name:<40}{count:>12,.0f}  {count / floors[name]:.2f}")
    floor_chunk = (floor_streams[1] - floor_streams[0]) / (long - short)
    proxy_chunk = (proxy_streams[1] - proxy_streams[0]) / (long - short)
    print(f"{f'per chunk ({short} -> {long} chunks)':<40}{'floor':>12}{'proxy':>10}{'added':>10}")
    added = proxy_chunk - floor_chunk
    print(f"{'instructions per streamed chunk':<40}{floor_chunk:>12,.0f}{proxy_chunk:>10,.0f}{added:>10,.0f}")
    idle_port = free_port()
    idle = _idle_rate(serve_command(policy, idle_port), idle_port, tmp, "idle")
    print(f"{'proxy idle, default --reload-interval':<40}{idle:>12,.0f}  per second (left out above)")
    idle_port = free_port()
    idle = _idle_rate(serve_command(policy, idle_port, *COUNTED_FLAGS), idle_port, tmp, "idle-no-reload")
    print(f"{'proxy idle, --reload-interval 0':<40}{idle:>12,.0f}  per second (the log flusher, timers)")


def ablation_section(up_port: int, tmp: Path) -> None:
    """Instructions per passthrough request of the proxy with one part of its per-request work
    switched off at a time (``ablated_proxy.ABLATIONS``), then all of them: what each part costs,
    against the whole proxy measured in the same run (callgrind, as ``--instructions``)."""
    sys.path.insert(0, str(ROOT))
    from tests.perf.ablated_proxy import ABLATIONS

    if shutil.which("valgrind") is None or shutil.which("callgrind_control") is None:
        print("ablation: valgrind is not installed (apt-get install -y valgrind)", file=sys.stderr)
        return
    policy = tmp / "ablation-policy.yaml"
    policy.write_text(bench_policy(up_port))
    launcher = str(Path(__file__).with_name("ablated_proxy.py"))
    runs = ["none", *ABLATIONS, ",".join(ABLATIONS)]
    counts: dict[str, float] = {}
    for parts in runs:
        port = free_port()
        command = [sys.executable, launcher, parts, *serve_command(policy, port, *COUNTED_FLAGS)[3:]]
        url = f"http://127.0.0.1:{port}/v1/chat/completions"
        counts[parts] = _instructions(command, port, url, tmp, f"ablation-{len(counts)}")
    whole = counts["none"]
    print(f"{'switched off (callgrind, passthrough)':<40}{'Ir/request':>12}{'saves':>10}{'share':>8}")
    for parts, count in counts.items():
        name = (
            "nothing (the whole proxy)"
            if parts == "none"
            else ("all of the above" if "," in parts else parts)
        )
        print(f"{name:<40}{count:>12,.0f}{whole - count:>10,.0f}{(whole - count) / whole:>8.1%}")


RETRY_RUNS = 5


async def _retry_runs(budget: dict[str, int] | None, concurrency: int, runs: int) -> list[float]:
    """Success rates of ``runs`` loads (a new seed each) at 30% independent 503s on both providers
    of one rung, the policy's default failover with ``budget`` as its retry budget if given."""
    from tests.api.test_failover_load import chaos_policy, load
    from tests.fake_upstream import UNAVAILABLE, FakeUpstream, FaultMix
    from tests.proxy_server import UPSTREAM_KEY, UPSTREAM_KEY_ENV, running_proxy

    os.environ[UPSTREAM_KEY_ENV] = UPSTREAM_KEY
    rates = []
    for run in range(runs):
        async with FakeUpstream.start(api_key=UPSTREAM_KEY) as fake:
            policy = chaos_policy(fake)
            if budget is not None:
                policy["failover"] = {"retry_budget": budget}
            with tempfile.TemporaryDirectory() as tmp:
                async with running_proxy(Path(tmp), policy) as px:
                    fake.set_fault_mix("m-a", FaultMix(((UNAVAILABLE, 0.3),), seed=100 + 2 * run))
                    fake.set_fault_mix("m-b", FaultMix(((UNAVAILABLE, 0.3),), seed=101 + 2 * run))
                    rates.append((await load(px.url, fake, concurrency=concurrency)).success_rate)
    return rates


def _allowed_by_retries(run: int, requests: int = 600, tries: int = 3) -> float:
    """The success rate the policy's retries allow for a run's fault draws, taken one request at a
    time: every try on a, then every try on b, until one does not draw a 503."""
    import random

    draws = (random.Random(100 + 2 * run), random.Random(101 + 2 * run))
    ok = sum(any(rng.random() >= 0.3 for rng in draws for _ in range(tries)) for _ in range(requests))
    return ok / requests


def retries_bench(runs: int = RETRY_RUNS) -> None:
    """#29.3: success at 30% independent 503s on both providers, 16 clients, every default, over
    repeated runs; against what the configured retries allow for the same fault draws (the
    baseline of the ratio), the budget without its per-target floor and one client."""
    sys.path.insert(0, str(ROOT))
    from proxy.observability.logging import configure_logging

    configure_logging("console", "error")  # the proxies run in this process: their lines are noise here
    cases = [
        ("defaults, 16 clients", None, 16),
        ("no per-target floor, 16 clients", {"min_per_target": 0}, 16),
        ("defaults, 1 client (baseline)", None, 1),
    ]
    head = f"{'30% 503s on both providers (600 requests)':<44}{'min':>8}{'mean':>8}{'max':>8}"
    print(f"{head}{'x allowed':>11}  runs")
    rows = [("what retries: 2 allow for the same draws", [_allowed_by_retries(run) for run in range(runs)])]
    for name, budget, concurrency in cases:
        rows.append((name, asyncio.run(_retry_runs(budget, concurrency, runs if concurrency > 1 else 1))))
    for name, rates in rows:
        mean = statistics.mean(rates)
        allowed = statistics.mean(rows[0][1][: len(rates)])  # the same runs' draws
        print(
            f"{name:<44}{min(rates):>8.1%}{mean:>8.1%}{max(rates):>8.1%}{mean / allowed:>11.3f}  {len(rates)}"
        )


def _fail() -> NoReturn:
    raise AssertionError("no record")


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--duration", type=int, default=8, help="seconds per wrk run")
    parser.add_argument(
        "--concurrency", type=int, nargs="+", help="wrk connections (default 1 16 64; --peers: 1 16)"
    )
    parser.add_argument("--upstream", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--parse", action="store_true", help="only the parse micro-benchmark")
    parser.add_argument("--feedback", action="store_true", help="only the feedback micro-benchmark")
    parser.add_argument("--memory-only", action="store_true", help="only the large-body memory section")
    parser.add_argument("--limits", action="store_true", help="only the limit-check micro-benchmark")
    parser.add_argument(
        "--stream", action="store_true", help="only the streamed-module TTFD section (no wrk)"
    )
    parser.add_argument(
        "--busy", type=int, default=0, help="with --stream: this many busy loops beside (a loaded machine)"
    )
    parser.add_argument("--context", action="store_true", help="only the context-protocol section")
    parser.add_argument(
        "--shadow", action="store_true", help="only client latency with shadow judging off and on"
    )
    parser.add_argument(
        "--redis-paths",
        action="store_true",
        help="only Redis on the request path: p50 per kind of request, Redis off / +0 ms / +5 ms (no wrk)",
    )
    parser.add_argument(
        "--retries", action="store_true", help="only the success rate at 30%% 503s (repeated runs)"
    )
    parser.add_argument(
        "--stream-copy",
        action="store_true",
        help="only the stream-recovery copy: 16 streams, share in Redis within 1 s / 2 s, lag (no wrk)",
    )
    parser.add_argument("--compose", action="store_true", help="only the composition-overhead section")
    parser.add_argument(
        "--relay", action="store_true", help="only the floor-relay vs proxy section and its goals"
    )
    parser.add_argument(
        "--peers",
        action="store_true",
        help="only the relay section with Portkey's and LiteLLM's gateways beside the floor and the proxy"
        " (make peers installs them)",
    )
    parser.add_argument("--workers-bench", action="store_true", help="only serve --workers 1 against 2 (wrk)")
    parser.add_argument(
        "--ablation",
        action="store_true",
        help="only what each part of the proxy's per-request work costs in instructions (callgrind; ~5 min)",
    )
    parser.add_argument(
        "--instructions",
        action="store_true",
        help="only instructions per request of the floor and the proxy (callgrind; about 3 minutes)",
    )
    parser.add_argument(
        "--module-instructions",
        action="store_true",
        help="only instructions per streamed module call, floor relay and proxy (callgrind; about 1 minute)",
    )
    parser.add_argument(
        "--soak", action="store_true", help="only the soak: bounds filled, CPU per request over time"
    )
    args = parser.parse_args()
    args.peers_only = args.peers
    if args.concurrency is None:
        args.concurrency = list(PEER_CONCURRENCY) if args.peers else [1, 16, 64]
    if args.soak:
        return run_soak()
    if args.compose:
        composition_bench()
        return 0
    if args.workers_bench:
        workers_bench(args.duration)
        return 0
    if args.upstream:
        upstream_main(args.upstream)
        return 0
    if args.parse:
        parse_bench()
        return 0
    if args.limits:
        limits_bench()
        return 0
    if args.redis_paths:
        redis_paths_bench()
        return 0
    if args.stream_copy:
        stream_copy_bench()
        return 0
    if args.feedback:
        feedback_bench()
        return 0
    if args.retries:
        retries_bench()
        return 0
    if (
        not (args.memory_only or args.stream or args.context or args.shadow or args.module_instructions)
        and shutil.which("wrk") is None
    ):
        print("wrk is not installed: apt-get install -y wrk", file=sys.stderr)
        return 2

    up_port, proxy_port = free_port(), free_port()
    with tempfile.TemporaryDirectory() as tmp:
        tmpdir = Path(tmp)
        policy = tmpdir / "policy.yaml"
        policy.write_text(bench_policy(up_port))
        upstream = subprocess.Popen([sys.executable, __file__, "--upstream", str(up_port)])
        proxy_log = (tmpdir / "proxy.log").open("wb")
        proxy = subprocess.Popen(
            serve_command(policy, proxy_port),
            cwd=ROOT,
            stderr=proxy_log,  # the per-request log line stays on, written where a pod's would go
        )
        try:
            wait_port(up_port)
            wait_port(proxy_port)
            through = f"http://127.0.0.1:{proxy_port}/v1/chat/completions"
            if args.stream:
                stream_section(up_port, proxy_port, tmpdir, args.busy)
                return 0
            if args.context:
                context_bench(tmpdir, up_port)
                return 0
            if args.shadow:
                shadow_bench(tmpdir, up_port, upstream.pid)
                return 0
            if args.memory_only:
                memory_section(through, proxy.pid)
                return 0
            if args.instructions:
                instructions_section(up_port, tmpdir)
                return 0
            if args.module_instructions:
                module_instructions_section(up_port, tmpdir)
                return 0
            if args.ablation:
                ablation_section(up_port, tmpdir)
                return 0
            floor_port = free_port()
            floor = subprocess.Popen(
                [
                    sys.executable,
                    str(Path(__file__).with_name("floor_relay.py")),
                    "--port",
                    str(floor_port),
                    "--upstream",
                    f"http://127.0.0.1:{up_port}/v1",
                ]
            )
            try:
                wait_port(floor_port)
                ends = Endpoints(up_port, floor_port, proxy_port)
                if args.relay:
                    relay_section(ends, floor.pid, proxy.pid, args, tmpdir)
                    return 0
                sys.path.insert(0, str(ROOT))
                from tests.perf.peers import running_peers

                ports = iter(free_port, None)
                with running_peers(up_port, ports, tmpdir, CHAT_BODY) as peers:
                    relay_section(ends, floor.pid, proxy.pid, args, tmpdir, peers)
            finally:
                floor.terminate()
                floor.wait(timeout=30)
            if args.peers:
                return 0
            instructions_section(up_port, tmpdir)
            memory_section(through, proxy.pid)  # after the relay section: its RSS is "after load"
            stream_section(up_port, proxy_port, tmpdir)
            context_bench(tmpdir, up_port)
            shadow_bench(tmpdir, up_port, upstream.pid)
            redis_paths_bench()
            stream_copy_bench()
            composition_bench()
            parse_bench()
            limits_bench()
            feedback_bench()
            retries_bench()
            workers_bench(args.duration)
        finally:
            for proc in (proxy, upstream):
                proc.terminate()
                proc.wait(timeout=30)
            proxy_log.close()
            lines = (tmpdir / "proxy.log").read_bytes().count(b'"proxy.request"')
            print(f"proxy log: {lines} request lines written")
    return run_soak()  # last, on its own proxy: the sections above do not share its stores


def run_soak() -> int:
    """``tests/perf/soak.py`` (imported as part of the repository's tests package)."""
    sys.path.insert(0, str(ROOT))
    from tests.perf import soak

    return soak.main()


if __name__ == "__main__":
    raise SystemExit(main())
