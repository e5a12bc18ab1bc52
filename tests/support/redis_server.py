"""A private ``redis-server`` for the suite: started on a free loopback port on first use, stopped at exit.

The suite never talks to a Redis it did not start (a developer's own, another project's tests, the one a
machine ships on 6379): every test reads its URL from :func:`redis_url`. One server per test process; two
runs in two clones on one machine each get their own.
"""

from __future__ import annotations

import atexit
import shutil
import socket
import subprocess
import tempfile
from dataclasses import dataclass

from tests.support.polling import wait_sync

START_TIMEOUT_S = 10.0
INSTALL_HINT = "redis-server is not installed: apt-get install -y redis-server (make test installs it)"


@dataclass(slots=True)
class _Server:
    port: int
    process: subprocess.Popen[bytes]
    workdir: tempfile.TemporaryDirectory[str]

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.workdir.cleanup()


_server: _Server | None = None


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def answers(port: int) -> bool:
    """Whether a Redis on ``port`` answers PING."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5) as conn:
            conn.sendall(b"PING\r\n")
            return conn.recv(16).startswith(b"+PONG")
    except OSError:
        return False


def _started(port: int, process: subprocess.Popen[bytes]) -> bool:
    """True once the server answers PING; False when it exited or did not within the timeout."""

    def exited() -> str | None:
        return None if process.poll() is None else f"it exited {process.returncode}"

    try:
        wait_sync(
            lambda: answers(port),
            "redis-server answering PING",
            timeout=START_TIMEOUT_S,
            step=0.02,
            give_up=exited,
        )
    except AssertionError:
        return False
    return True


def _start() -> _Server:
    binary = shutil.which("redis-server")
    if binary is None:
        raise RuntimeError(INSTALL_HINT)
    workdir = tempfile.TemporaryDirectory(prefix="cogproxy-test-redis-")
    for _ in range(5):  # the port may be taken between the probe and the bind: try another
        port = free_port()
        process = subprocess.Popen(
            [
                binary,
                "--bind",
                "127.0.0.1",
                "--port",
                str(port),
                "--save",
                "",
                "--appendonly",
                "no",
                "--dir",
                workdir.name,
                "--databases",
                "16",
                "--protected-mode",
                "yes",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        if _started(port, process):
            return _Server(port, process, workdir)
        if process.poll() is None:  # the port was taken meanwhile: another one
            process.kill()
        process.wait()
    workdir.cleanup()
    raise RuntimeError("the suite's private redis-server did not start")


def redis_port() -> int:
    """The port of this test process's own Redis (started on first call)."""
    global _server
    if _server is None or _server.process.poll() is not None:
        _server = _start()
        atexit.register(_server.stop)
    return _server.port


def redis_url(db: int = 15) -> str:
    """A URL for database ``db`` of the suite's own Redis."""
    return f"redis://127.0.0.1:{redis_port()}/{db}"


def stop() -> None:
    """Stop the private server now (pytest_unconfigure); a later :func:`redis_url` starts a new one."""
    global _server
    if _server is not None:
        _server.stop()
        _server = None


def server_pid() -> int:
    """The pid of the private server (the process this test run started)."""
    redis_port()
    assert _server is not None
    return _server.process.pid
