"""A private Redis Cluster for the tests that need one: 3 masters and 3 replicas on free loopback
ports (``redis-server --cluster-enabled yes`` x6 in one temp directory, then ``redis-cli --cluster
create ... --cluster-replicas 1``), ready once every node says ``cluster_state:ok``; stopped after.

Like :mod:`tests.support.redis_server`, nothing here reaches a Redis the suite did not start. The
node timeout is short (``NODE_TIMEOUT_MS``) so a killed master's replica takes over within a few
seconds; :meth:`Cluster.kill_master_of` does that for the test of a failover.
"""

from __future__ import annotations

import shutil
import signal
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import pytest
from redis.asyncio.cluster import RedisCluster
from redis.crc import key_slot

from tests.support.polling import wait_sync
from tests.support.redis_server import INSTALL_HINT, answers, free_port
from tests.support.redis_tls import tls_answers
from tests.support.tls_certs import Certificates, make_certificates

MASTERS = 3
NODES = 2 * MASTERS
NODE_TIMEOUT_MS = 1000
"""A master that does not answer for this long is failed over (Redis's default is 15 s)."""
READY_TIMEOUT_S = 30.0
WRITE_PAUSE_MS = 10_000
"""The longest :meth:`Cluster.hold_writes_until_replicated` holds a master's writes."""


def _cli_tls(certs: Certificates | None) -> tuple[str, ...]:
    """redis-cli's TLS options for a cluster of ``certs`` (none without)."""
    if certs is None:
        return ()
    return (
        "--tls",
        "--cacert",
        str(certs.ca.cert),
        "--cert",
        str(certs.client.cert),
        "--key",
        str(certs.client.key),
    )


def _repl_offset(node: Node) -> int:
    """The replication offset ``node`` reached (a master's: what it sent; a replica's: what it
    applied); -1 when it does not answer."""
    for line in node.cli("info", "replication").splitlines():
        if line.startswith("master_repl_offset:"):
            return int(line.partition(":")[2])
    return -1


@dataclass(slots=True)
class Node:
    port: int
    process: subprocess.Popen[bytes]
    certs: Certificates | None = None

    def cli(self, *args: str) -> str:
        """``redis-cli -p <port> args...``'s output ('' when the node does not answer)."""
        done = subprocess.run(
            ["redis-cli", "-h", "127.0.0.1", "-p", str(self.port), *_cli_tls(self.certs), *args],
            capture_output=True,
            text=True,
            timeout=5,
            check=False,
        )
        return done.stdout if done.returncode == 0 else ""

    def pause(self) -> None:
        """SIGSTOP: the node neither answers nor drops its connections (a hung host)."""
        self.process.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        self.process.send_signal(signal.SIGCONT)

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGCONT)  # a paused node dies on SIGKILL alike; be explicit
            self.process.kill()
        self.process.wait()


@dataclass(slots=True)
class Cluster:
    nodes: list[Node]
    workdir: tempfile.TemporaryDirectory[str]
    certs: Certificates | None = None
    """With certificates, every node speaks TLS only (clients, replication and the cluster bus)."""
    killed: list[Node] = field(default_factory=list)
    paused: list[Node] = field(default_factory=list)

    @property
    def seed(self) -> Node:
        return next(node for node in self.nodes if node not in self.killed + self.paused)

    @property
    def url(self) -> str:
        """The proxy's ``--redis-url`` for this cluster (any node is a seed)."""
        scheme = "rediss" if self.certs else "redis"
        return f"{scheme}+cluster://127.0.0.1:{self.seed.port}"

    def admin(self) -> Any:
        """A cluster client of the ``default`` user (answers ``str``), to look at what the proxy
        wrote; made after a failover, it sees the promoted replicas."""
        tls: dict[str, Any] = {}
        if self.certs is not None:
            tls = {
                "ssl": True,
                "ssl_ca_certs": str(self.certs.ca.cert),
                "ssl_certfile": str(self.certs.client.cert),
                "ssl_keyfile": str(self.certs.client.key),
            }
        return RedisCluster(host="127.0.0.1", port=self.seed.port, decode_responses=True, **tls)

    def healthy(self) -> bool:
        """Every live node says the cluster is ok and sees every slot served by a live master (right
        after a kill the nodes still say ok: they have not yet noticed)."""
        live = self.live()
        if not all("cluster_state:ok" in node.cli("cluster", "info") for node in live):
            return False
        ports = {node.port for node in live}
        return all(port in ports for node in live for port in _slot_masters(node.cli("cluster", "nodes")))

    def replicating(self) -> bool:
        """Every replica has a link up to its master (its first sync done): before that a killed
        master's replica has no data to take over with, and is never promoted."""
        roles = [node.cli("info", "replication") for node in self.live()]
        replicas = [role for role in roles if "role:slave" in role]
        return len(replicas) == len(self.live()) - MASTERS and all(
            "master_link_status:up" in role for role in replicas
        )

    def master_of(self, key: str) -> Node:
        """The node serving ``key``'s slot now."""
        slot = key_slot(key.encode())
        for line in self.seed.cli("cluster", "nodes").splitlines():
            parts = line.split()
            if "master" not in parts[2]:  # a failed-over master has no slots left
                continue
            for span in parts[8:]:
                low, _, high = span.partition("-")
                if low.isdigit() and int(low) <= slot <= int(high or low):
                    port = int(parts[1].split(":")[1].split("@")[0])
                    return next(node for node in self.nodes if node.port == port)
        raise AssertionError(f"no master serves slot {slot}")

    def replica_of(self, master: Node) -> Node:
        """The node replicating ``master``."""
        master_id = master.cli("cluster", "myid").strip()
        for line in self.seed.cli("cluster", "nodes").splitlines():
            parts = line.split()
            if "slave" in parts[2] and parts[3] == master_id:
                port = int(parts[1].split(":")[1].split("@")[0])
                return next(node for node in self.nodes if node.port == port)
        raise AssertionError(f"no replica of the master on {master.port}")

    def down(self) -> bool:
        """Every node neither paused nor killed says the cluster is down (``CLUSTERDOWN`` to all)."""
        return all("cluster_state:fail" in node.cli("cluster", "info") for node in self.live())

    def kill_master_of(self, key: str) -> Node:
        """Kill (SIGKILL) the master serving ``key``; its replica is promoted after ``NODE_TIMEOUT_MS``."""
        return self.kill(self.master_of(key))

    def hold_writes_until_replicated(self, master: Node) -> None:
        """Hold ``master``'s client writes (``CLIENT PAUSE WRITE``; it still answers reads and
        replicates) until its replica has applied everything ``master`` acknowledged. A kill
        right after then loses nothing Redis had acknowledged: Redis replicates asynchronously,
        and a write a killed master acknowledged but had not yet sent is Redis's loss, which only
        ``--redis-durable-replicas`` prevents (tests/api/test_redis_durable_failover.py)."""
        replica = self.replica_of(master)
        master.cli("client", "pause", str(WRITE_PAUSE_MS), "write")
        wait_sync(
            lambda: _repl_offset(replica) >= _repl_offset(master),
            "the replica applying every write its master acknowledged",
            timeout=WRITE_PAUSE_MS / 1000,
        )

    def kill(self, node: Node) -> Node:
        """Kill (SIGKILL) ``node``; a master's replica is promoted after ``NODE_TIMEOUT_MS``."""
        node.stop()
        self.killed.append(node)
        return node

    def live(self) -> list[Node]:
        """The nodes neither killed nor paused."""
        return [node for node in self.nodes if node not in self.killed + self.paused]

    def pause_shard_of(self, key: str) -> list[Node]:
        """SIGSTOP the master serving ``key`` and its replica: once the others notice, no node can
        take the slots over, and with ``cluster-require-full-coverage`` (the default) every other
        node answers ``CLUSTERDOWN`` to every command until :meth:`resume`."""
        master = self.master_of(key)
        shard = [master, self.replica_of(master)]
        for node in shard:
            node.pause()
        self.paused += shard
        return shard

    def pause(self, node: Node) -> None:
        """SIGSTOP ``node`` (a replica, say) until :meth:`resume`; the others stay up."""
        node.pause()
        self.paused.append(node)

    def pause_all(self) -> None:
        """SIGSTOP every live node: no node answers (connections open, then time out)."""
        shard = self.live()
        for node in shard:
            node.pause()
        self.paused += shard

    def resume(self) -> None:
        for node in self.paused:
            node.resume()
        self.paused.clear()

    def stop(self) -> None:
        for node in self.nodes:
            node.stop()
        self.workdir.cleanup()


def _slot_masters(nodes: str) -> set[int]:
    """The client ports of the masters serving slots in a ``CLUSTER NODES`` answer."""
    masters = set()
    for line in nodes.splitlines():
        parts = line.split()
        if len(parts) > 8 and "master" in parts[2]:
            masters.add(int(parts[1].split(":")[1].split("@")[0]))
    return masters


def _free_ports(count: int) -> list[int]:
    ports: set[int] = set()
    while len(ports) < count:
        ports.add(free_port())
    return sorted(ports)


def _tls_args(port: int, certs: Certificates | None) -> list[str]:
    """The client port (TLS only, with ``certs``: clients, replication and the bus)."""
    if certs is None:
        return ["--port", str(port)]
    return [
        "--port", "0", "--tls-port", str(port), "--tls-cluster", "yes", "--tls-replication", "yes",
        "--tls-cert-file", str(certs.server.cert), "--tls-key-file", str(certs.server.key),
        "--tls-client-cert-file", str(certs.client.cert), "--tls-client-key-file", str(certs.client.key),
        "--tls-ca-cert-file", str(certs.ca.cert), "--tls-auth-clients", "yes",
    ]  # fmt: skip


def _node(binary: str, port: int, bus_port: int, workdir: str, certs: Certificates | None) -> Node:
    process = subprocess.Popen(
        [
            binary,
            "--bind", "127.0.0.1",
            *_tls_args(port, certs),
            "--cluster-enabled", "yes",
            "--cluster-port", str(bus_port),
            "--cluster-config-file", f"nodes-{port}.conf",
            "--cluster-node-timeout", str(NODE_TIMEOUT_MS),
            "--repl-diskless-sync-delay", "0",
            "--save", "",
            "--appendonly", "no",
            "--dir", workdir,
            "--protected-mode", "yes",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )  # fmt: skip
    return Node(port, process, certs)


def start_cluster(tls_dir: Path | None = None) -> Cluster:
    """Six nodes, three of them masters, ready; the caller stops it. With ``tls_dir``, TLS only,
    with certificates made there (:mod:`tests.support.tls_certs`)."""
    binary = shutil.which("redis-server")
    if binary is None or shutil.which("redis-cli") is None:
        raise RuntimeError(INSTALL_HINT)
    certs = make_certificates(tls_dir / "certs") if tls_dir is not None else None
    workdir = tempfile.TemporaryDirectory(prefix="cogproxy-test-cluster-")
    ports = _free_ports(2 * NODES)
    pairs = zip(ports[:NODES], ports[NODES:], strict=True)  # (client port, cluster bus port)
    nodes = [_node(binary, port, bus, workdir.name, certs) for port, bus in pairs]
    cluster = Cluster(nodes, workdir, certs)
    try:
        for port in ports[:NODES]:
            probe = partial(answers, port) if certs is None else partial(tls_answers, port, certs)
            wait_sync(probe, f"node {port} answering PING", timeout=10)
        subprocess.run(
            ["redis-cli", *_cli_tls(certs), "--cluster", "create",
             *(f"127.0.0.1:{n.port}" for n in cluster.nodes), "--cluster-replicas", "1", "--cluster-yes"],
            capture_output=True,
            timeout=60,
            check=True,
        )  # fmt: skip
        wait_sync(cluster.healthy, "cluster_state:ok on every node", timeout=READY_TIMEOUT_S, step=0.1)
        wait_sync(
            cluster.replicating, "every replica in sync with its master", timeout=READY_TIMEOUT_S, step=0.1
        )
    except BaseException:
        cluster.stop()
        raise
    return cluster


@pytest.fixture
def redis_cluster() -> Iterator[Cluster]:
    """A fresh cluster for one test (a test may kill its nodes)."""
    cluster = start_cluster()
    try:
        yield cluster
    finally:
        cluster.stop()


async def cluster_keys(admin: Any, pattern: str) -> list[str]:
    """Every key matching ``pattern`` on every master (``SCAN`` of each)."""
    return [key async for key in admin.scan_iter(match=pattern, count=1000)]
