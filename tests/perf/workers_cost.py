"""``make bench`` workers section, the load-independent part: why a worker's CPU per request rises
when a second worker runs (issue #35).

CPU time per request = instructions per request x time per instruction, plus the kernel's part.
What splits them:

* ``instructions``: user-space instructions per passthrough request under callgrind
  (``--trace-children=yes``, counted only while wrk runs at c=8; every process of the proxy), for
  ``serve --workers 1``, the same with its metrics in prometheus-client's multiprocess files, one
  worker of ``--workers 2`` started alone (worker mode: the files, SO_REUSEPORT, the parent
  watch; no second worker) and ``--workers 2``. More instructions is more work; machine load
  does not move the count.
* ``control``: a fixed CPU-bound piece of Python with no proxy (orjson and dict work on a chat
  body and an answer), its CPU seconds per unit alone against beside an identical process
  spinning on the other core at the same time, in alternating rounds: the machine's own slowdown
  of the same work when both cores are busy (shared caches and memory bandwidth, the host
  scheduling the two vCPUs).
* ``syscalls``: during the wrk rounds, each worker's system calls, event-loop waits and
  ``getpid`` calls (``perf stat`` on kernel tracepoints).

``Split`` does the arithmetic: the user-space CPU per request the wrk rounds measured, divided by
the instruction ratio, is the time-per-instruction ratio, set against the control's; the
kernel's part (system time), which callgrind does not see, is kept apart.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import partial
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
INSTRUCTIONS_SECONDS = 15
"""wrk's counted run under callgrind (about 1,000 requests: the proxy runs ~50x slower)."""
INSTRUCTIONS_CONCURRENCY = 8
READY_TIMEOUT_S = 300.0
"""Two workers start under callgrind in a minute or two on the loaded 2-core machine."""
CALLGRIND = ("valgrind", "--tool=callgrind", "--instr-atstart=no", "--trace-children=yes")
CONTROL_UNITS = 60_000
CONTROL_ROUNDS = 5
FILES = "1 worker, metric files"
"""``--workers 1`` with its metric values in prometheus-client's multiprocess files."""
LONE = "1 worker of 2, started alone"
"""Worker mode (the metric files, SO_REUSEPORT, the parent watch) without a second worker."""

CONTROL_CODE = r"""
import sys, time
import orjson

CHAT = orjson.dumps({"model": "bench", "messages": [{"role": "user", "content": "hello " * 40}] * 4})
ANSWER = orjson.dumps({
    "id": "chatcmpl-bench", "object": "chat.completion", "created": 0, "model": "m",
    "choices": [
        {"index": 0, "message": {"role": "assistant", "content": "x" * 400}, "finish_reason": "stop"}
    ],
    "usage": {"prompt_tokens": 10, "completion_tokens": 10, "total_tokens": 20},
})


def unit(i):
    body = orjson.loads(CHAT)
    body["model"] = "m"
    out = orjson.dumps(body)
    answer = orjson.loads(ANSWER)
    usage = answer["usage"]
    headers = {f"x-{k}": str(v) for k, v in usage.items()}
    headers["content-length"] = str(len(out))
    return sum(len(k) + len(v) for k, v in headers.items()) + len(answer["choices"][0]["message"]["content"])


mode, units = sys.argv[1], int(sys.argv[2])
for i in range(units // 10):  # warm-up
    unit(i)
if mode == "spin":
    print("spinning", flush=True)
    while True:
        for i in range(1000):
            unit(i)
started = time.process_time()
for i in range(units):
    unit(i)
print((time.process_time() - started) / units * 1e6)
"""


def _control_us(units: int) -> float:
    """CPU microseconds per unit of ``CONTROL_CODE`` in a fresh interpreter."""
    out = subprocess.run(
        [sys.executable, "-c", CONTROL_CODE, "measure", str(units)],
        cwd=ROOT,
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    return float(out)


@contextlib.contextmanager
def _twin(units: int) -> Iterator[None]:
    """An identical process spinning on the work until the block ends (started and warm before
    the block's body runs: it says so on stdout)."""
    twin = subprocess.Popen(
        [sys.executable, "-c", CONTROL_CODE, "spin", str(units)], cwd=ROOT, stdout=subprocess.PIPE, text=True
    )
    try:
        assert twin.stdout is not None
        if twin.stdout.readline().strip() != "spinning":
            raise RuntimeError("the control's twin did not start")
        yield
    finally:
        twin.terminate()
        twin.wait(timeout=30)


@dataclass(frozen=True)
class Control:
    alone_us: float
    beside_us: float
    """Medians over the rounds: CPU microseconds per unit alone, and beside a spinning twin."""

    @property
    def ratio(self) -> float:
        return self.beside_us / self.alone_us


def control(units: int = CONTROL_UNITS, rounds: int = CONTROL_ROUNDS) -> Control:
    """The control, alone and beside its twin in alternating rounds (order reversed every other
    round, so drift in the machine's other load falls on both)."""
    alone: list[float] = []
    beside: list[float] = []
    for round_ in range(rounds):
        for twinned in (False, True) if round_ % 2 == 0 else (True, False):
            if twinned:
                with _twin(units):
                    beside.append(_control_us(units))
            else:
                alone.append(_control_us(units))
    return Control(statistics.median(alone), statistics.median(beside))


SYSCALL_EVENTS = {
    "raw_syscalls:sys_enter": "syscalls",
    "syscalls:sys_enter_epoll_wait": "loop waits",
    "syscalls:sys_enter_epoll_pwait": "loop waits",
    "syscalls:sys_enter_getpid": "getpid",
}
"""Kernel tracepoints ``perf stat`` counts per process: every system call; the event loop's
waits for readiness (one per pass of the loop; uvloop's libuv calls one of the two); and
``getpid``, which prometheus-client's multiprocess values call on every update (a fork check)."""


@contextlib.contextmanager
def syscalls(pids: list[int]) -> Iterator[dict[int, dict[str, float]]]:
    """System calls and loop waits of each of ``pids`` while the block runs (``perf stat`` on the
    kernel's tracepoints: counted in the kernel, what the process does is not slowed); filled in
    when the block ends, empty without ``perf`` or the permission to trace."""
    counts: dict[int, dict[str, float]] = {}
    if shutil.which("perf") is None:
        yield counts
        return
    command = ["perf", "stat", "-x,", "-e", ",".join(SYSCALL_EVENTS), "-p"]
    procs = {
        pid: subprocess.Popen(
            [*command, str(pid)], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
        )
        for pid in pids
    }
    try:
        yield counts
    finally:
        for pid, proc in procs.items():
            proc.send_signal(signal.SIGINT)
            _, err = proc.communicate(timeout=30)
            counted = perf_counts(err)
            if counted:
                counts[pid] = counted


def perf_counts(output: str) -> dict[str, float]:
    """``perf stat -x,`` output, summed by ``SYSCALL_EVENTS``' names ({} if nothing was counted)."""
    counts: dict[str, float] = {}
    for line in output.splitlines():
        fields = line.split(",")
        if len(fields) > 2 and fields[2] in SYSCALL_EVENTS and fields[0].isdigit():
            name = SYSCALL_EVENTS[fields[2]]
            counts[name] = counts.get(name, 0.0) + float(fields[0])
    return counts


def _children(pid: int) -> list[int]:
    return [int(p) for p in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]


def _ready(port: int, workers: int) -> None:
    """Until ``workers`` distinct worker pids answered /readyz (a new connection each), polled."""
    seen: set[int] = set()
    deadline = time.monotonic() + READY_TIMEOUT_S
    while len(seen) < workers:
        if time.monotonic() > deadline:
            raise RuntimeError(f"only {len(seen)} of {workers} workers answered on {port}")
        with (
            contextlib.suppress(OSError, ValueError),
            urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=5) as resp,
        ):
            seen.add(json.loads(resp.read()).get("worker", {}).get("pid", 0))  # 0: a lone process
        time.sleep(0.2)  # the poll's step: the condition is re-checked, not waited for


def _program_total(dump: Path) -> int:
    totals = subprocess.run(["callgrind_annotate", str(dump)], check=True, capture_output=True, text=True)
    found = re.search(r"^([\d,]+) .*PROGRAM TOTALS", totals.stdout, re.M)
    if found is None:
        raise RuntimeError(f"no totals in {dump}")
    return int(found[1].replace(",", ""))


def _control_pids(pids: list[int], *flags: str) -> None:
    for pid in pids:
        subprocess.run(["callgrind_control", *flags, str(pid)], check=True, capture_output=True)


def counted_instructions(
    command: list[str],
    port: int,
    workers: int,
    load: Callable[[int], int],
    tmp: Path,
    name: str,
    env: dict[str, str] | None = None,
) -> tuple[float, float]:
    """``command`` and every process it starts under callgrind: instructions per request of the
    process started and of its children (0 for none), counted only while ``load(seconds)`` runs
    (it returns the requests served), after a warm-up load that is not counted."""
    out = tmp / f"callgrind.{name}.%p"
    server = subprocess.Popen(
        [*CALLGRIND, f"--callgrind-out-file={out}", *command],
        cwd=ROOT,
        env=env,
        stdin=subprocess.PIPE,  # a worker started alone drains and exits at its end of file
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        _ready(port, workers)
        pids = [server.pid, *_children(server.pid)]
        load(3)  # warm-up, not counted
        _control_pids(pids, "-i", "on")
        requests = load(INSTRUCTIONS_SECONDS)
        _control_pids(pids, "-i", "off")
        _control_pids(pids, "-d")  # the counts so far, to callgrind.<name>.<pid>.1
        counts = [_program_total(tmp / f"callgrind.{name}.{pid}.1") / max(requests, 1) for pid in pids]
        return counts[0], sum(counts[1:])
    finally:
        if server.stdin is not None:
            server.stdin.close()
        server.terminate()
        server.wait(timeout=120)


@dataclass(frozen=True)
class Split:
    """A worker's CPU per request with 2 workers against 1, split into its parts."""

    cpu_ms: dict[int, float]
    """CPU ms per request per worker, by worker count (the wrk rounds)."""
    kernel_ms: dict[int, float]
    """The kernel's part of ``cpu_ms``; the rest is user space, what callgrind counts."""
    instructions: dict[str, float]
    """Instructions per request (callgrind): "1 worker", ``FILES``, ``LONE``, "2 workers"."""
    control: Control

    def user_ms(self, workers: int) -> float:
        return self.cpu_ms[workers] - self.kernel_ms[workers]

    @property
    def cpu_ratio(self) -> float:
        return self.cpu_ms[2] / self.cpu_ms[1]

    @property
    def instruction_ratio(self) -> float:
        return self.instructions["2 workers"] / self.instructions["1 worker"]

    @property
    def per_instruction(self) -> float:
        """User time per instruction, 2 workers / 1: user CPU per request with the work divided out."""
        return self.user_ms(2) / self.user_ms(1) / self.instruction_ratio

    def rise_ms(self) -> dict[str, float]:
        """What each part added to a worker's CPU per request, in ms (they sum to the rise)."""
        base = self.instructions["1 worker"]
        user = self.user_ms(1)
        files = user * (self.instructions[FILES] / base - 1)
        mode = user * (self.instructions[LONE] / base - 1)
        return {
            "the metric files": files,
            "the rest of worker mode": mode - files,
            "a second worker's extra instructions": user * (self.instruction_ratio - 1) - mode,
            "the same instructions run slower": self.user_ms(2) - user * self.instruction_ratio,
            "the kernel (sockets, epoll)": self.kernel_ms[2] - self.kernel_ms[1],
        }

    def efficiency(self) -> tuple[float, float]:
        """Estimated throughput of N workers on N free cores, in units of N single workers: a
        worker's CPU per request grown by its extra instructions only (cores that do not slow
        each other, as the control shows; the kernel's part as with one worker), and grown by the
        kernel's measured rise too (the metric files' system calls, fewer requests per pass of
        the loop)."""
        work = self.user_ms(1) * self.instruction_ratio
        return self.cpu_ms[1] / (work + self.kernel_ms[1]), self.cpu_ms[1] / (work + self.kernel_ms[2])


def report(split: Split) -> list[str]:
    """The printed lines: instructions per request per configuration, the control, and the split."""
    rows = split.instructions
    base = rows["1 worker"]
    lines = [f"{'instructions per request (callgrind, c=8)':<44}{'Ir':>12}  ratio to 1 worker"]
    lines += [f"{name:<44}{count:>12,.0f}  {count / base:.3f}" for name, count in rows.items()]
    ctl = split.control
    lines.append(
        f"control, no proxy (orjson + dict work): {ctl.alone_us:.2f} us CPU per unit alone, "
        f"{ctl.beside_us:.2f} beside an identical process on the other core ({ctl.ratio:.2f}x)"
    )
    lines.append(
        f"workers: CPU per request per worker 2/1 = {split.cpu_ratio:.2f}x; user space: instructions "
        f"{split.instruction_ratio:.3f}x, time per instruction {split.per_instruction:.2f}x "
        f"(the control: {ctl.ratio:.2f}x)"
    )
    parts = ", ".join(f"{name} {ms * 1000:+.0f} us" for name, ms in split.rise_ms().items())
    lines.append(
        f"workers: the rise, {(split.cpu_ms[2] - split.cpu_ms[1]) * 1000:+.0f} us per request: {parts}"
    )
    user_only, with_kernel = split.efficiency()
    lines.append(
        f"workers: estimate, N workers on N free cores: {user_only:.2f} x N one worker's throughput with "
        f"the extra instructions, {with_kernel:.2f} x N with the kernel's rise too"
    )
    return lines


def instructions(
    serve_command: Callable[..., list[str]],
    free_port: Callable[[], int],
    load: Callable[[int, int], int],
    policy: Path,
    tmp: Path,
) -> dict[str, float]:
    """Instructions per request of the worker processes, summed, for ``--workers 1``, the same
    with its metrics in multiprocess files, one worker of two started alone, and ``--workers 2``
    (and of its supervisor); ``load(port, seconds)`` runs wrk and returns the requests served.
    Idle timers are off (``--reload-interval 0``): they cost per second, not per request, and the
    slowed runs serve few requests a second."""
    flags = ("--reload-interval", "0")
    rows: dict[str, float] = {}
    metrics_dir = tmp / "worker-metrics"
    metrics_dir.mkdir(exist_ok=True)
    files = {**os.environ, "PROMETHEUS_MULTIPROC_DIR": str(metrics_dir)}
    for name, (row, extra, env) in {
        "1w": ("1 worker", ("--workers", "1"), None),
        "files": (FILES, ("--workers", "1"), files),  # prometheus-client reads the variable at import
        "lone": (LONE, ("--workers", "2", "--worker-slot", "0"), files),
    }.items():
        port = free_port()
        command = serve_command(policy, port, *flags, *extra)
        rows[row], _ = counted_instructions(command, port, 1, partial(load, port), tmp, name, env)
    port = free_port()
    command = serve_command(policy, port, *flags, "--workers", "2")
    supervisor, rows["2 workers"] = counted_instructions(command, port, 2, partial(load, port), tmp, "2w")
    rows["2 workers: their supervisor"] = supervisor
    return rows
