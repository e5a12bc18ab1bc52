"""Certificates made by the test with the ``openssl`` command line: a CA, a server certificate it
signs for 127.0.0.1/localhost, and a client certificate it signs (for ``tls-auth-clients``)."""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

DAYS = "2"
NEW_KEY = ("-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1")
"""P-256 keys: a TLS handshake costs a fraction of an RSA one on a busy test machine."""


@dataclass(frozen=True, slots=True)
class Pair:
    cert: Path
    key: Path


@dataclass(frozen=True, slots=True)
class Certificates:
    ca: Pair
    server: Pair
    client: Pair


def _openssl(*args: str, cwd: Path) -> None:
    binary = shutil.which("openssl")
    if binary is None:
        raise RuntimeError("openssl is not installed: apt-get install -y openssl")
    subprocess.run([binary, *args], cwd=cwd, check=True, capture_output=True, timeout=60)


def _ca(directory: Path, name: str) -> Pair:
    pair = Pair(directory / f"{name}.crt", directory / f"{name}.key")
    _openssl(
        "req", "-x509", *NEW_KEY, "-nodes", "-days", DAYS, "-subj", f"/CN={name}",
        "-keyout", str(pair.key), "-out", str(pair.cert), cwd=directory,
    )  # fmt: skip
    return pair


def _signed(directory: Path, ca: Pair, name: str, extensions: str) -> Pair:
    pair = Pair(directory / f"{name}.crt", directory / f"{name}.key")
    request, ext = directory / f"{name}.csr", directory / f"{name}.ext"
    ext.write_text(extensions, encoding="utf-8")
    _openssl(
        "req", *NEW_KEY, "-nodes", "-subj", f"/CN={name}",
        "-keyout", str(pair.key), "-out", str(request), cwd=directory,
    )  # fmt: skip
    _openssl(
        "x509", "-req", "-in", str(request), "-CA", str(ca.cert), "-CAkey", str(ca.key),
        "-CAcreateserial", "-days", DAYS, "-extfile", str(ext), "-out", str(pair.cert), cwd=directory,
    )  # fmt: skip
    return pair


def make_certificates(directory: Path, ca_name: str = "test-ca") -> Certificates:
    """A CA named ``ca_name`` and the server and client certificates it signs, in ``directory``."""
    directory.mkdir(parents=True, exist_ok=True)
    ca = _ca(directory, ca_name)
    server = _signed(
        directory,
        ca,
        "redis-server",
        "subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth\n",
    )
    client = _signed(directory, ca, "cogproxy-client", "extendedKeyUsage=clientAuth\n")
    return Certificates(ca, server, client)


def make_ca(directory: Path, name: str) -> Pair:
    """A CA of its own, that signed nothing the server shows (the wrong CA)."""
    directory.mkdir(parents=True, exist_ok=True)
    return _ca(directory, name)
