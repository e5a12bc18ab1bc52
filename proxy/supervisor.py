"""``serve --workers N``: N worker processes accept on one port; this process supervises them.

``serve`` validates everything it can (flags, policy, free ports), then replaces itself
(``exec``, same pid) with ``python -m proxy.supervisor``, which imports none of the proxy
(~35 MB instead of ~80 MB of RSS). Each worker is ``python -m proxy <serve's arguments>
--worker-slot I``: a fresh interpreter with its own event loop (nothing forked after imports,
threads or a loop exist), binding the API and admin ports with SO_REUSEPORT so the kernel
spreads connections over the workers. The supervisor binds nothing, and

* restarts a worker that exits, after a backoff doubling from ``RESTART_MIN_S`` to
  ``RESTART_MAX_S`` while restarts keep failing (reset once a worker served ``STABLE_S``);
* stops everything and exits with the worker's code when a worker fails before any worker has
  served (a start-up refusal ``serve`` could not check itself: it would fail again);
* passes SIGHUP (reload) to every serving worker; on SIGTERM or SIGINT sends each worker
  SIGTERM (drain, then exit) and exits 0 once all have exited (SIGKILL for a worker still
  there ``KILL_MARGIN_S`` after its drain timeout);
* owns the metrics directory the workers share (``proxy.observability.metrics``) and marks an
  exited worker dead in it: its live gauges stop counting, its counters keep counting.

A worker is serving once it writes its "serving" line to stdout (a pipe to the supervisor).
Its stdin is a pipe from the supervisor that is never written: end of file means the
supervisor died, and the worker drains and exits (``watch_parent``) instead of serving on.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import shutil
import signal
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import NoReturn

import structlog
from prometheus_client.multiprocess import mark_process_dead

from proxy.observability.logging import configure_logging
from proxy.settings import WORKER_FLAG

log = structlog.get_logger("proxy.supervisor")

RESTART_MIN_S = 0.1
RESTART_MAX_S = 10.0
STABLE_S = 30.0
"""A worker that served this long before exiting starts the backoff over."""
KILL_MARGIN_S = 5.0
METRICS_DIR_PREFIX = "cogproxy-metrics-"
METRICS_DIR_BASES = ("/dev/shm",)
"""Tried before the temporary directory: memory-backed (no writeback of the files workers
update on every request) and writable under a read-only root filesystem."""
PER_WORKER_WITHOUT_REDIS = (
    "circuit breakers",
    "rate limits and budgets",
    "module context and result cache",
    "feedback (answers to judge)",
    "stream recovery sessions",
)


@dataclass(frozen=True, slots=True)
class Plan:
    """What the supervisor needs of ``serve``'s settings."""

    workers: int
    host: str
    port: int
    drain_timeout_s: float
    shared_state: bool
    """``--redis-url`` is set: breakers, limits, context and feedback are shared by the workers."""


async def check_ports(addresses: Iterable[tuple[str, int]]) -> None:
    """Bind each address once without SO_REUSEPORT and let go: one that is taken (even by
    another group of workers) raises the OSError a single process would meet."""
    loop = asyncio.get_running_loop()
    for host, port in addresses:
        server = await loop.create_server(asyncio.Protocol, host, port)
        server.close()
        await server.wait_closed()


def exec_supervisor(plan: Plan, log_format: str, log_level: str, arguments: Sequence[str]) -> NoReturn:
    """Become ``python -m proxy.supervisor`` for ``cogproxy ARGUMENTS`` (same pid)."""
    flags = [
        f"--workers={plan.workers}",
        f"--host={plan.host}",
        f"--port={plan.port}",
        f"--drain-timeout={plan.drain_timeout_s}",
        f"--log-format={log_format}",
        f"--log-level={log_level}",
        *(["--shared-state"] if plan.shared_state else []),
    ]
    sys.stdout.flush()
    sys.stderr.flush()
    os.execv(sys.executable, [sys.executable, "-m", "proxy.supervisor", *flags, "--", *arguments])


def watch_parent(loop: asyncio.AbstractEventLoop) -> None:
    """In a worker: SIGTERM itself (the usual drain) once the supervisor's pipe on stdin closes."""

    def readable() -> None:
        if not os.read(0, 4096):
            loop.remove_reader(0)
            log.warning("proxy.supervisor_gone", pid=os.getpid())
            os.kill(os.getpid(), signal.SIGTERM)

    loop.add_reader(0, readable)


def make_metrics_dir() -> Path:
    """A new, empty directory for the workers' metric files, named after this process; those
    left by a supervisor that was killed (its pid gone, or this pid after a container restart)
    are removed first."""
    prefix = f"{METRICS_DIR_PREFIX}{os.getpid()}-"
    for base in (*METRICS_DIR_BASES, tempfile.gettempdir()):
        with contextlib.suppress(OSError):
            if os.access(base, os.W_OK):
                _remove_stale(Path(base))
                return Path(tempfile.mkdtemp(prefix=prefix, dir=base))
    raise OSError(
        f"--workers needs a writable directory for the workers' metrics: none of "
        f"{', '.join(METRICS_DIR_BASES)} or {tempfile.gettempdir()} (set TMPDIR)"
    )


def _remove_stale(base: Path) -> None:
    for directory in base.glob(f"{METRICS_DIR_PREFIX}*-*"):
        owner = directory.name.removeprefix(METRICS_DIR_PREFIX).partition("-")[0]
        if owner.isdigit() and (int(owner) == os.getpid() or not _exists(int(owner))):
            shutil.rmtree(directory, ignore_errors=True)


def _exists(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


def backoff(failures: int) -> float:
    """Seconds before restarting a worker after ``failures`` exits in a row."""
    return float(min(RESTART_MAX_S, RESTART_MIN_S * 2 ** max(0, failures - 1)))


def _exit_fields(code: int) -> dict[str, object]:
    if code < 0:
        return {"exit_code": code, "signal": signal.Signals(-code).name}
    return {"exit_code": code}


class Supervisor:
    """Runs ``plan.workers`` copies of ``command`` (each given ``--worker-slot I``)."""

    def __init__(
        self,
        plan: Plan,
        command: Sequence[str],
        metrics_dir: Path,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._plan = plan
        self._command = list(command)
        self._metrics_dir = metrics_dir
        self._env = {**os.environ, "PROMETHEUS_MULTIPROC_DIR": str(metrics_dir)}
        self._clock = clock
        self._procs: dict[int, asyncio.subprocess.Process] = {}
        self._serving: set[int] = set()
        """Slots whose worker wrote its "serving" line: only they get SIGHUP (a worker still
        starting reads the files anyway, and would die of a signal it has no handler for yet)."""
        self._stopping = asyncio.Event()
        self._served = False
        self._code = 0

    async def run(self) -> int:
        """Serve until stopped; the exit code (0, or a worker's start-up failure)."""
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self._stop, sig.name)
        loop.add_signal_handler(signal.SIGHUP, self._reload)
        await asyncio.gather(*(self._keep(slot) for slot in range(self._plan.workers)))
        return self._code

    async def _keep(self, slot: int) -> None:
        """Slot ``slot``: start its worker, and again each time it exits, until stopping."""
        failures = 0
        while not self._stopping.is_set():
            started = self._clock()
            try:
                proc = await self._spawn(slot)
            except OSError as exc:  # no process (fork refused: memory, pid limit)
                log.error("proxy.worker_not_started", worker=slot, error=str(exc))
                if not self._served:
                    self._fail(slot, 1)
                    return
                failures += 1
                await self._pause(backoff(failures))
                continue
            self._procs[slot] = proc
            log.info("proxy.worker_started", worker=slot, pid=proc.pid)
            if self._stopping.is_set():
                proc.send_signal(signal.SIGTERM)
            served = await self._relay(slot, proc)
            code = await proc.wait()
            del self._procs[slot]
            self._serving.discard(slot)
            mark_process_dead(proc.pid, str(self._metrics_dir))  # type: ignore[no-untyped-call]
            (log.info if self._stopping.is_set() else log.error)(
                "proxy.worker_exited",
                worker=slot,
                pid=proc.pid,
                served=served,
                **_exit_fields(code),
            )
            if self._stopping.is_set():
                return
            if not served and not self._served:
                self._fail(slot, code)
                return
            failures = 0 if served and self._clock() - started >= STABLE_S else failures + 1
            delay = backoff(failures)
            log.info("proxy.worker_restarting", worker=slot, in_s=delay)
            await self._pause(delay)

    async def _spawn(self, slot: int) -> asyncio.subprocess.Process:
        return await asyncio.create_subprocess_exec(
            *self._command,
            WORKER_FLAG,
            str(slot),
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            env=self._env,
            start_new_session=True,  # a terminal's Ctrl-C reaches the supervisor only, once
        )

    async def _pause(self, seconds: float) -> None:
        """Sleep ``seconds``, or less when stopping starts."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._stopping.wait(), seconds)

    async def _relay(self, slot: int, proc: asyncio.subprocess.Process) -> bool:
        """Wait for the worker's "serving" line, then pass on whatever else it prints until it
        closes stdout; True if it served."""
        assert proc.stdout is not None
        if not await proc.stdout.readline():
            return False
        self._serving.add(slot)
        if not self._served:
            self._served = True
            p = self._plan
            print(f"cogproxy serving on http://{p.host}:{p.port} ({p.workers} workers)", flush=True)
        while chunk := await proc.stdout.read(65536):
            sys.stdout.write(chunk.decode(errors="replace"))
            sys.stdout.flush()
        return True

    def _fail(self, slot: int, code: int) -> None:
        log.error(
            "proxy.workers_failed",
            worker=slot,
            reason="a worker exited before any worker served; its error is above",
            **_exit_fields(code),
        )
        self._code = code if code > 0 else 1
        self._stop("worker_failed")

    def _stop(self, reason: str) -> None:
        """SIGTERM to every worker (each drains, then exits); a second signal is passed on too
        (a single process ends its drain early on one)."""
        if not self._stopping.is_set():
            self._stopping.set()
            log.info("proxy.workers_stopping", reason=reason, workers=sorted(self._procs))
            grace = self._plan.drain_timeout_s + KILL_MARGIN_S
            asyncio.get_running_loop().call_later(grace, self._kill_stragglers)
        self._signal(self._procs, signal.SIGTERM)

    def _reload(self) -> None:
        log.info("proxy.workers_reloading", workers=sorted(self._serving))
        self._signal(self._serving, signal.SIGHUP)

    def _signal(self, slots: Iterable[int], sig: signal.Signals) -> None:
        for slot in list(slots):
            with contextlib.suppress(ProcessLookupError, KeyError):
                self._procs[slot].send_signal(sig)

    def _kill_stragglers(self) -> None:
        for slot, proc in self._procs.items():
            log.error(
                "proxy.worker_killed", worker=slot, pid=proc.pid, reason="still running after the drain"
            )
            with contextlib.suppress(ProcessLookupError):
                proc.kill()


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m proxy.supervisor", description="started by serve --workers")
    p.add_argument("--workers", type=int, required=True)
    p.add_argument("--host", required=True)
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--drain-timeout", type=float, required=True)
    p.add_argument("--log-format", choices=("json", "console"), default="json")
    p.add_argument("--log-level", default="info")
    p.add_argument("--shared-state", action="store_true")
    p.add_argument("arguments", nargs="+", help="serve's own arguments, after --")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    configure_logging(args.log_format, args.log_level)
    plan = Plan(args.workers, args.host, args.port, args.drain_timeout, args.shared_state)
    if not plan.shared_state:
        log.warning(
            "proxy.workers_state_per_worker",
            per_worker=list(PER_WORKER_WITHOUT_REDIS),
            hint="set --redis-url to share them between the workers",
        )
    try:
        metrics_dir = make_metrics_dir()
    except OSError as exc:
        print(f"serve: {exc}", file=sys.stderr)
        return 2
    command = [sys.executable, "-m", "proxy", *args.arguments]
    try:
        return asyncio.run(Supervisor(plan, command, metrics_dir).run())
    finally:
        shutil.rmtree(metrics_dir, ignore_errors=True)


if __name__ == "__main__":
    raise SystemExit(main())
