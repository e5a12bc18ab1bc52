"""How the proxy proves itself to a managed Redis (TLS, ACL), checked once at start.

* TLS files (CA, client certificate and key) are loaded into an ``ssl`` context at start, so a
  missing, unreadable or malformed file stops ``serve`` with its name instead of failing every
  Redis command later.
* The ACL password comes from a file or the environment, never from a flag value (a command line
  shows in ``ps`` and in manifests); it is read once, its trailing newline dropped.
* ``redacted(url)`` is a Redis URL fit for a message: its password masked.
"""

from __future__ import annotations

import ssl
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

MASK = "***"


def check_tls_files(ca_file: Path | None, cert_file: Path | None, key_file: Path | None) -> None:
    """Raise ``ValueError`` naming the file (and the flag) that a TLS client could not load."""
    if key_file is not None and cert_file is None:
        raise ValueError("--redis-key-file needs --redis-cert-file (the client certificate it belongs to)")
    context = ssl.create_default_context()
    if ca_file is not None:
        _readable("--redis-ca-file", ca_file)
        try:
            context.load_verify_locations(cafile=str(ca_file))
        except ssl.SSLError as exc:
            raise ValueError(f"--redis-ca-file {ca_file}: not a PEM CA certificate ({exc.reason})") from None
    if cert_file is not None:
        _readable("--redis-cert-file", cert_file)
        if key_file is not None:
            _readable("--redis-key-file", key_file)
        try:
            context.load_cert_chain(str(cert_file), str(key_file) if key_file else None)
        except ssl.SSLError as exc:
            key = key_file or "(in the certificate file)"
            raise ValueError(
                f"--redis-cert-file {cert_file} / --redis-key-file {key}: "
                f"not a PEM certificate and its private key ({exc.reason})"
            ) from None


def read_password_file(path: Path) -> str:
    """The password in ``path`` (its first line, without the newline); ``ValueError`` if unreadable
    or empty."""
    _readable("--redis-password-file", path)
    lines = path.read_text(encoding="utf-8").splitlines()
    if not lines or not lines[0]:
        raise ValueError(f"--redis-password-file {path}: the file is empty")
    return lines[0]


def _readable(flag: str, path: Path) -> None:
    try:
        with path.open("rb") as handle:
            handle.read(1)
    except OSError as exc:
        raise ValueError(f"{flag} {path}: cannot read it ({exc.strerror or exc})") from None


def url_has_credentials(url: str) -> bool:
    """True when the URL carries a user name or a password (``redis://user:pw@host``)."""
    parts = urlsplit(url)
    return bool(parts.username or parts.password)


def redacted(url: str) -> str:
    """``url`` with its password (if any) replaced by ``***``."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    user = parts.username or ""
    host = parts.netloc.rpartition("@")[2]
    return urlunsplit(parts._replace(netloc=f"{user}:{MASK}@{host}"))
