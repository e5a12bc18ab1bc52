"""A private master and replica (two ``redis-server`` on free loopback ports), for the tests of
what the master acknowledged but its replica may not have (``--redis-durable-replicas``)."""

from __future__ import annotations

import shutil
import signal
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from tests.support.polling import wait_sync
from tests.support.redis_server import INSTALL_HINT, START_TIMEOUT_S, answers, free_port

NO_PERSISTENCE = ("--save", "", "--appendonly", "no")


@dataclass(slots=True)
class PairNode:
    port: int
    process: subprocess.Popen[bytes]

    def cli(self, *args: str) -> str:
        return subprocess.run(
            ["redis-cli", "-p", str(self.port), *args], capture_output=True, text=True, check=True, timeout=5
        ).stdout

    def pause(self) -> None:
        """SIGSTOP: the node neither answers nor acknowledges replication (a hung host)."""
        self.process.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        self.process.send_signal(signal.SIGCONT)


@dataclass(slots=True)
class RedisPair:
    master: PairNode
    replica: PairNode

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.master.port}/0"


def _start(binary: str, workdir: str, *extra: str) -> PairNode:
    port = free_port()
    process = subprocess.Popen(
        [binary, "--bind", "127.0.0.1", "--port", str(port), *NO_PERSISTENCE, "--dir", workdir, *extra],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    wait_sync(lambda: answers(port), "redis-server answering PING", timeout=START_TIMEOUT_S, step=0.02)
    return PairNode(port, process)


@contextmanager
def redis_pair() -> Iterator[RedisPair]:
    """A master and its replica, replicating (first sync done), for the ``with`` block."""
    binary = shutil.which("redis-server")
    if binary is None:
        raise RuntimeError(INSTALL_HINT)
    nodes: list[PairNode] = []
    with (
        tempfile.TemporaryDirectory(prefix="cogproxy-test-pair-") as master_dir,
        tempfile.TemporaryDirectory(prefix="cogproxy-test-pair-") as replica_dir,
    ):
        try:
            master = _start(binary, master_dir)
            nodes.append(master)
            replica = _start(binary, replica_dir, "--replicaof", "127.0.0.1", str(master.port))
            nodes.append(replica)
            wait_sync(
                lambda: "master_link_status:up" in replica.cli("info", "replication"),
                "the replica's first sync",
                timeout=START_TIMEOUT_S,
            )
            yield RedisPair(master, replica)
        finally:
            for node in nodes:
                node.process.send_signal(signal.SIGCONT)
                node.process.kill()
                node.process.wait()
