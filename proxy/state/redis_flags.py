"""The Redis access flags, one definition for every command that reaches Redis (``serve``,
``calibration report|fit``): TLS files, ACL user and password file, each also read from its
``COGPROXY_*`` variable, checked once (``check_access``) into a ``RedisAccess`` and then into the
one ``RedisOptions`` (``options_of``).

``--redis-url`` itself stays with each command (``serve`` shares state through it; calibration
reads it or Prometheus); ``check_access`` checks it with the flags that go with it.
"""

from __future__ import annotations

import argparse
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, TypedDict

from proxy.state.redis_access import (
    TLS_SCHEMES,
    check_tls_files,
    check_url,
    first_line,
    read_password_file,
    url_credentials,
)

if TYPE_CHECKING:  # the client is imported when options are built: the flags' parsers stay light
    from proxy.state.redis_client import RedisOptions

ENV_PREFIX = "COGPROXY_"
URL_ENV = "REDIS_URL"
PASSWORD_ENV = "REDIS_PASSWORD"
"""``COGPROXY_REDIS_PASSWORD``: the Redis password from the environment (e.g. a Secret's key)."""
REFUSED_PASSWORD_FLAG = "--redis-password"


@dataclass(frozen=True, slots=True)
class AccessFlag:
    """A Redis access flag and its variable (``COGPROXY_<env>``); the flag wins over the variable."""

    flag: str
    env: str
    help: str

    @property
    def dest(self) -> str:
        return self.flag.removeprefix("--").replace("-", "_")


ACCESS_FLAGS = (
    AccessFlag(
        "--redis-ca-file",
        "REDIS_CA_FILE",
        "PEM CA certificates the Redis server's certificate must chain to (needs a rediss:// or "
        "rediss+cluster:// URL); unset: the system's",
    ),
    AccessFlag(
        "--redis-cert-file",
        "REDIS_CERT_FILE",
        "PEM client certificate, for a Redis that checks clients' certificates (rediss://)",
    ),
    AccessFlag("--redis-key-file", "REDIS_KEY_FILE", "PEM private key of --redis-cert-file"),
    AccessFlag("--redis-username", "REDIS_USERNAME", "Redis ACL user; unset: default"),
    AccessFlag(
        "--redis-password-file",
        "REDIS_PASSWORD_FILE",
        f"file whose first line is the Redis ACL user's password (or set {ENV_PREFIX}{PASSWORD_ENV}; "
        "there is no password flag: a command line shows in ps)",
    ),
)
_TLS_FLAGS = ACCESS_FLAGS[:3]
"""The CA, certificate and key files."""


class RedisAccess(TypedDict):
    """TLS files and ACL credentials, checked (the ``Settings`` fields of the same names)."""

    redis_ca_file: Path | None
    redis_cert_file: Path | None
    redis_key_file: Path | None
    redis_username: str | None
    redis_password: str | None


def env(name: str) -> str | None:
    """``COGPROXY_<name>``; unset or empty: None."""
    return os.environ.get(ENV_PREFIX + name) or None


def add_refused_password_flag(parser: argparse.ArgumentParser) -> None:
    """``--redis-password``: accepted by the parser only to be refused with the ways that work."""
    parser.add_argument(
        REFUSED_PASSWORD_FLAG,
        default=None,
        metavar="REFUSED",
        help=f"refused (a command line shows in ps): use --redis-password-file or {ENV_PREFIX}{PASSWORD_ENV}",
    )


def add_access_flags(parser: argparse.ArgumentParser) -> None:
    """Every access flag (unset: its variable, read by ``resolve_access_flags``), and the refused one."""
    for option in ACCESS_FLAGS:
        parser.add_argument(option.flag, default=None, help=f"{option.help} ({ENV_PREFIX}{option.env})")
    add_refused_password_flag(parser)


def resolve_access_flags(args: argparse.Namespace) -> None:
    """Fill each access flag left unset from its variable."""
    for option in ACCESS_FLAGS:
        if getattr(args, option.dest) is None:
            setattr(args, option.dest, env(option.env))


def refuse_password_flag(args: argparse.Namespace) -> None:
    """``ValueError`` when ``--redis-password`` was given (without showing its value)."""
    if getattr(args, "redis_password", None) is not None:
        raise ValueError(
            f"{REFUSED_PASSWORD_FLAG} is refused: a password on the command line shows in ps and in "
            f"manifests; use --redis-password-file FILE or {ENV_PREFIX}{PASSWORD_ENV}"
        )


def refuse_unused(args: argparse.Namespace, source: str) -> None:
    """For a command reading ``source`` instead of Redis: ``ValueError`` for an access flag given on
    its command line (its variables are left alone: they are the deployment's, for ``serve``)."""
    refuse_password_flag(args)
    given = [option.flag for option in ACCESS_FLAGS if getattr(args, option.dest)]
    if given:
        raise ValueError(f"{', '.join(given)}: only with --redis-url, not with {source}")


def check_access(url: str | None, args: argparse.Namespace) -> RedisAccess:
    """The URL and its TLS files and ACL credentials, checked: the URL one a client reads as written,
    files readable and valid PEM, TLS only with a TLS URL, each credential given once (a URL's would
    silently win over a flag's). ``ValueError`` naming the flag, never showing a password."""
    refuse_password_flag(args)
    files = {option.flag: getattr(args, option.dest) or None for option in _TLS_FLAGS}
    tls = [flag for flag, value in files.items() if value]
    from_env = env(PASSWORD_ENV)
    if args.redis_password_file and from_env:
        raise ValueError(
            f"the Redis password is given twice: --redis-password-file and {ENV_PREFIX}{PASSWORD_ENV}"
        )
    password_given = bool(args.redis_password_file or from_env)
    given = tls + ["--redis-username"] * bool(args.redis_username)
    given += ["a Redis password"] * password_given
    if not url:
        if given:
            raise ValueError(f"{', '.join(given)}: there is no --redis-url to use them with")
        return RedisAccess(
            redis_ca_file=None,
            redis_cert_file=None,
            redis_key_file=None,
            redis_username=None,
            redis_password=None,
        )
    check_url(url)
    scheme = url.partition("://")[0].lower()
    if tls and scheme not in TLS_SCHEMES:
        raise ValueError(
            f"{', '.join(tls)} need a TLS --redis-url (rediss:// or rediss+cluster://), not {scheme}://"
        )
    user_in_url, password_in_url = url_credentials(url)
    if (password_in_url and password_given) or (user_in_url and args.redis_username):
        raise ValueError(
            "the --redis-url carries a user or password already (in its userinfo or its query): "
            "give each once (the URL's would win)"
        )
    paths = {flag: Path(value) if value else None for flag, value in files.items()}
    check_tls_files(*paths.values())
    password = None
    if args.redis_password_file:
        password = read_password_file(Path(args.redis_password_file))
    elif from_env:
        password = first_line(from_env, f"{ENV_PREFIX}{PASSWORD_ENV}")
    return RedisAccess(
        redis_ca_file=paths["--redis-ca-file"],
        redis_cert_file=paths["--redis-cert-file"],
        redis_key_file=paths["--redis-key-file"],
        redis_username=args.redis_username or None,
        redis_password=password,
    )


def options_of(url: str, access: RedisAccess) -> RedisOptions:
    """The ``RedisOptions`` of ``url`` with its checked access (default timeouts)."""
    from proxy.state.redis_client import RedisOptions

    return RedisOptions(
        url,
        ssl_ca_certs=_text(access["redis_ca_file"]),
        ssl_certfile=_text(access["redis_cert_file"]),
        ssl_keyfile=_text(access["redis_key_file"]),
        username=access["redis_username"],
        password=access["redis_password"],
    )


def _text(path: Path | None) -> str | None:
    return None if path is None else str(path)


def access_options(url: str, args: argparse.Namespace) -> RedisOptions:
    """For a command other than ``serve``: the ``RedisOptions`` of ``url`` with the access flags
    (each unset one from its variable), checked (``ValueError``)."""
    resolve_access_flags(args)
    return options_of(url, check_access(url, args))
