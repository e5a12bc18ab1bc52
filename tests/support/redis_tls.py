"""A private TLS-only ``redis-server`` (``--port 0 --tls-port P``) on a free loopback port, with
certificates the test made (:mod:`tests.support.tls_certs`); clients must show a certificate
signed by the same CA (``--tls-auth-clients yes``) unless ``client_certs=False``.

An admin client (``default`` user, TLS) sets up ACL users and looks at what the proxy wrote."""

from __future__ import annotations

import shutil
import socket
import ssl
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import redis.asyncio as aioredis

from tests.support.polling import wait_sync
from tests.support.redis_server import INSTALL_HINT, START_TIMEOUT_S, free_port
from tests.support.tls_certs import Certificates, make_certificates


@dataclass(frozen=True, slots=True)
class TlsRedis:
    port: int
    certs: Certificates

    def url(self, db: int = 0, *, credentials: str = "") -> str:
        return f"rediss://{credentials}127.0.0.1:{self.port}/{db}"

    def admin(self, db: int = 0) -> Any:
        """A client of the ``default`` user over TLS (answers ``str``)."""
        return aioredis.Redis.from_url(
            self.url(db),
            ssl_ca_certs=str(self.certs.ca.cert),
            ssl_certfile=str(self.certs.client.cert),
            ssl_keyfile=str(self.certs.client.key),
            decode_responses=True,
        )


def tls_answers(port: int, certs: Certificates) -> bool:
    """Whether a TLS Redis on ``port`` answers PING (to a client showing ``certs.client``)."""
    context = ssl.create_default_context(cafile=str(certs.ca.cert))
    context.load_cert_chain(str(certs.client.cert), str(certs.client.key))
    try:
        with (
            socket.create_connection(("127.0.0.1", port), timeout=0.5) as raw,
            context.wrap_socket(raw, server_hostname="127.0.0.1") as conn,
        ):
            conn.sendall(b"PING\r\n")
            return conn.recv(16).startswith(b"+PONG")
    except OSError:
        return False


@contextmanager
def tls_redis(directory: Path, *, client_certs: bool = True) -> Iterator[TlsRedis]:
    """A TLS-only redis-server for the ``with`` block, its certificates in ``directory``."""
    binary = shutil.which("redis-server")
    if binary is None:
        raise RuntimeError(INSTALL_HINT)
    certs = make_certificates(directory / "certs")
    port = free_port()
    process = subprocess.Popen(
        [
            binary, "--bind", "127.0.0.1", "--port", "0", "--tls-port", str(port),
            "--tls-cert-file", str(certs.server.cert), "--tls-key-file", str(certs.server.key),
            "--tls-ca-cert-file", str(certs.ca.cert), "--tls-auth-clients", "yes" if client_certs else "no",
            "--save", "", "--appendonly", "no", "--dir", str(directory),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        wait_sync(
            lambda: tls_answers(port, certs),
            "the TLS redis-server answering PING",
            timeout=START_TIMEOUT_S,
            step=0.05,
            give_up=lambda: None if process.poll() is None else f"it exited {process.returncode}",
        )
        yield TlsRedis(port, certs)
    finally:
        process.terminate()
        try:
            process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
