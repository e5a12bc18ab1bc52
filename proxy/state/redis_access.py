"""How the proxy proves itself to a managed Redis (TLS, ACL), checked once at start.

* TLS files (CA, client certificate and key) are loaded into an ``ssl`` context at start, so a
  missing, unreadable or malformed file stops ``serve`` with its name instead of failing every
  Redis command later.
* The ACL password comes from a file or the environment, never from a flag value (a command line
  shows in ``ps`` and in manifests); it is read once, its first line kept (a trailing newline
  dropped, from either).
* ``check_url(url)`` refuses, at start and in one line that shows no piece of it, a URL redis-py
  would misread or refuse late: another scheme, a port that is not a number (an unencoded
  password), a cluster URL naming a database.
* ``redacted(url)`` is a Redis URL fit for a message: its password masked (userinfo and query).
"""

from __future__ import annotations

import os
import ssl
import stat
from collections.abc import Mapping
from pathlib import Path
from types import MappingProxyType
from urllib.parse import parse_qsl, unquote, urlsplit, urlunsplit

MASK = "***"
PASSWORD_FILE_MAX_BYTES = 4096
"""A password file is read this far at most: a password is a line, not a log or a device."""
CLUSTER_SCHEMES: Mapping[str, str] = MappingProxyType({"redis+cluster": "redis", "rediss+cluster": "rediss"})
"""A cluster URL's scheme -> the plain scheme ``redis-py`` parses (the node it names is a seed)."""
SCHEMES = ("redis", "rediss", "unix", *CLUSTER_SCHEMES)
TLS_SCHEMES = ("rediss", "rediss+cluster")
ENCODE_HINT = "a password in the URL must be percent-encoded: / ? # @ as %2F %3F %23 %40"


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
    """The password in ``path`` (its first line, without the newline); ``ValueError`` naming the
    flag and the file if it is unreadable, not a regular file, larger than
    ``PASSWORD_FILE_MAX_BYTES``, not UTF-8 text, or empty."""
    flag = "--redis-password-file"
    raw = _read_regular(flag, path, PASSWORD_FILE_MAX_BYTES + 1)
    if len(raw) > PASSWORD_FILE_MAX_BYTES:
        raise ValueError(f"{flag} {path}: larger than {PASSWORD_FILE_MAX_BYTES} bytes, not a password")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise ValueError(f"{flag} {path}: not UTF-8 text (a binary or UTF-16 file?)") from None
    return first_line(text, f"{flag} {path}")


def first_line(text: str, where: str) -> str:
    """The password in ``text`` (a file's or a variable's): its first line; ``ValueError`` naming
    ``where`` when that is empty, or when a NUL is in it (no server's password holds one)."""
    lines = text.splitlines()
    if not lines or not lines[0]:
        raise ValueError(f"{where}: the password is empty")
    if "\0" in lines[0]:
        raise ValueError(f"{where}: the password holds a NUL character (a binary file?)")
    return lines[0]


def _readable(flag: str, path: Path) -> None:
    _read_regular(flag, path, 1)


def _read_regular(flag: str, path: Path, size: int) -> bytes:
    """At most ``size`` bytes of ``path``, a regular file (a FIFO or a device would block start-up
    or never end); opened without blocking so a FIFO is refused, not waited on."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError as exc:
        raise ValueError(f"{flag} {path}: cannot read it ({exc.strerror or exc})") from None
    with os.fdopen(fd, "rb") as handle:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise ValueError(f"{flag} {path}: not a regular file")
        try:
            return handle.read(size)
        except OSError as exc:
            raise ValueError(f"{flag} {path}: cannot read it ({exc.strerror or exc})") from None


def check_url(url: str) -> None:
    """``ValueError`` (naming ``--redis-url``, quoting none of it) for a URL that is not a Redis URL
    the proxy's clients read as written."""
    scheme, sep, _ = url.partition("://")
    if not sep or scheme.lower() not in SCHEMES:
        raise ValueError(f"--redis-url: not a Redis URL (schemes: {', '.join(s + '://' for s in SCHEMES)})")
    try:
        parts = urlsplit(url)
    except ValueError:  # "Invalid IPv6 URL": a '[' left open
        raise ValueError("--redis-url: not a URL (an unclosed '[' in the host?)") from None
    names = [piece.partition("=")[0] if "=" in piece else piece for piece in parts.query.split("&")]
    if "@" not in parts.netloc and "@" in parts.path + parts.fragment + "".join(names):
        raise ValueError(f"--redis-url: an '@' after the host ({ENCODE_HINT})")
    try:
        parts.port  # noqa: B018 -- urllib parses the port on access; ValueError quotes the text
    except ValueError:
        raise ValueError(f"--redis-url: the port is not a number from 0 to 65535 ({ENCODE_HINT})") from None
    if scheme.lower() in CLUSTER_SCHEMES:
        db = dict(parse_qsl(parts.query)).get("db") or unquote(parts.path).strip("/")
        if db not in ("", "0"):
            raise ValueError(
                "--redis-url: a Redis Cluster has database 0 only: drop the /db (or ?db=) of a "
                "redis+cluster:// URL"
            )


def url_credentials(url: str) -> tuple[bool, bool]:
    """(the URL carries a user name, it carries a password): in its userinfo
    (``redis://user:pw@host``) or its query (``?username=``, ``?password=``: redis-py takes both)."""
    parts = urlsplit(url)
    query = {name.lower() for name, _ in parse_qsl(parts.query)}
    return bool(parts.username or "username" in query), bool(parts.password or "password" in query)


def redacted(url: str) -> str:
    """``url`` with its password (if any) replaced by ``***``: the userinfo's, and every query
    option named like a password (``?password=``, ``?ssl_password=``). A URL whose userinfo ran
    past the host (an unencoded '/', '?' or '#' in a password) loses all of it up to the last '@';
    one that is not a URL at all, everything after its scheme."""
    try:
        return _redacted(url)
    except ValueError:
        return f"{url.partition('://')[0]}://{MASK}"


def _redacted(url: str) -> str:
    parts = urlsplit(url)
    if "@" in parts.netloc:
        user, _, host = parts.netloc.rpartition("@")
        if ":" in user:
            parts = parts._replace(netloc=f"{user.partition(':')[0]}:{MASK}@{host}")
    elif "@" in url.partition("://")[2]:
        scheme, sep, rest = url.partition("://")
        parts = urlsplit(f"{scheme}{sep}{MASK}@{rest.rpartition('@')[2]}")
    if parts.query:
        pieces = (piece.partition("=") for piece in parts.query.split("&"))
        query = "&".join(
            f"{name}={MASK}" if "password" in unquote(name).lower() else f"{name}{eq}{value}"
            for name, eq, value in pieces
        )
        parts = parts._replace(query=query)
    return urlunsplit(parts)
