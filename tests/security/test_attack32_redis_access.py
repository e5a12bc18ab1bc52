"""Issue #32 adversarial pass (outside attacker): Redis TLS and ACL access (``--redis-ca-file``,
``--redis-cert-file``, ``--redis-key-file``, ``--redis-username``, ``--redis-password-file``,
``COGPROXY_REDIS_PASSWORD``) and the Redis URL forms, against real redis-servers the tests start
(a TLS one with certificates made by openssl) and real ``cogproxy`` processes.

Each test fails on a0c573a (the end of #32) and states the answer the fix should give.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest
import yaml

from proxy.calibration.sources import SourceError, from_redis
from proxy.cli import build_parser, resolve_serve_options, serve_settings
from proxy.settings import Settings
from proxy.state.feedback import KEY_PREFIX
from tests.api.test_managed_redis import PASSWORD, documented_rule
from tests.conftest import ROOT
from tests.policy.test_loader import MINIMAL
from tests.proxy_server import free_port
from tests.security.test_attack32_feedback import judged_row
from tests.support.redis_server import redis_port
from tests.support.redis_tls import TlsRedis, tls_redis
from tests.support.tls_certs import Certificates, make_certificates

SECRET = "S3cr/etPW-attack32"
"""A password with a '/' (base64 alphabets have one): in a URL it must be percent-encoded, and an
operator who forgets gets an error message; that message must not carry a piece of it."""
HANG_GUARD_S = 30.0
"""Well past any sane connect timeout, under pytest-timeout's 60 s."""
REDIS_ENV = ("URL", "CA_FILE", "CERT_FILE", "KEY_FILE", "USERNAME", "PASSWORD", "PASSWORD_FILE")

DEFAULT_POLICY = ROOT / "policies" / "default.yaml"


@pytest.fixture(autouse=True)
def no_redis_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in REDIS_ENV:
        monkeypatch.delenv(f"COGPROXY_REDIS_{name}", raising=False)


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Certificates:
    return make_certificates(tmp_path_factory.mktemp("certs"))


def settings_of(*flags: str) -> Settings:
    args = build_parser().parse_args(["serve", "--policy", "p.yaml", *flags])
    args.modules = []
    resolve_serve_options(args)
    return serve_settings(args)


def clean_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("COGPROXY_REDIS_")}


def serve_output(tmp_path: Path, *flags: str) -> tuple[int | None, str]:
    """``cogproxy serve`` with ``flags`` and a minimal policy: (exit code, or None when it was
    still serving after 20 s and was stopped; stdout and stderr)."""
    policy = tmp_path / "policy.yaml"
    policy.write_text(yaml.safe_dump(MINIMAL), encoding="utf-8")
    command = [sys.executable, "-m", "proxy", "serve", "--port", str(free_port()), "--policy", str(policy)]
    proc = subprocess.Popen(
        [*command, "--modules", str(tmp_path), *flags],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=clean_env(),
    )
    try:
        out, err = proc.communicate(timeout=20)
        return proc.returncode, out + err
    except subprocess.TimeoutExpired:
        proc.terminate()
        out, err = proc.communicate(timeout=20)
        return None, out + err


def test_a_tls_cluster_url_takes_the_tls_files(certs: Certificates) -> None:
    """Finding (medium): docs/configuration.md and docs/deployment.md offer ``rediss+cluster://``
    "with TLS", and ``RedisOptions`` accepts TLS files with it, but ``serve``'s check
    (``proxy/cli.py`` ``_redis_access``: ``url.startswith("rediss://")``) refuses
    ``--redis-ca-file``/``--redis-cert-file``/``--redis-key-file`` with it: "need a rediss://
    --redis-url (TLS), not rediss+cluster://". A TLS Redis Cluster with a private CA or client
    certificates (Memorystore, Redis Enterprise, an in-house cluster) cannot be configured; the
    only way left is redis-py's undocumented ``?ssl_ca_certs=`` URL query. Expected: the files
    are taken, as with ``rediss://``."""
    redis = settings_of(
        "--redis-url", "rediss+cluster://127.0.0.1:7000",
        "--redis-ca-file", str(certs.ca.cert),
        "--redis-cert-file", str(certs.client.cert),
        "--redis-key-file", str(certs.client.key),
    ).redis  # fmt: skip
    assert redis is not None and redis.cluster
    assert (redis.ssl_ca_certs, redis.ssl_certfile, redis.ssl_keyfile) == (
        str(certs.ca.cert),
        str(certs.client.cert),
        str(certs.client.key),
    )


@pytest.fixture
def tls_acl_redis(tmp_path: Path) -> Iterator[TlsRedis]:
    with tls_redis(tmp_path / "tls-redis", client_certs=False) as server:
        yield server


async def test_calibration_reads_a_managed_redis_without_its_password_on_the_command_line(
    tls_acl_redis: TlsRedis, tmp_path: Path
) -> None:
    """Finding (medium): docs/deployment.md's ACL rule grants ``+scan`` "for ``cogproxy
    calibration``", and issue #32 asks for the password "never on the command line". But
    ``cogproxy calibration report|fit --redis-url`` takes a URL only (``RedisOptions(url)`` in
    ``calibration/sources.py``): no CA, client certificate, user or password-file flag, and it
    ignores ``COGPROXY_REDIS_CA_FILE`` / ``_USERNAME`` / ``_PASSWORD`` / ``_PASSWORD_FILE``. Against
    the managed Redis ``serve`` is documented for (TLS with the provider's CA, an ACL user) it
    fails certificate verification; the only way in is ``rediss://cogproxy:PASSWORD@...`` on its
    command line, visible in ``ps`` and shell history. Expected: calibration reads the same
    settings ``serve`` does (at least the environment variables), exit 0 with the record."""
    admin = tls_acl_redis.admin()
    try:
        await admin.execute_command("ACL", "SETUSER", "cogproxy", *documented_rule())
        row = orjson.dumps(judged_row("m"))  # a judged answer as serve packs it
        await admin.hset(f"{KEY_PREFIX}t-1", "key-aaaaaaaaaaaaaaaa", row)
        await admin.execute_command("ACL", "SETUSER", "default", "off")  # only the ACL user gets in
    finally:
        await admin.aclose()
    env = {
        **clean_env(),
        "COGPROXY_REDIS_CA_FILE": str(tls_acl_redis.certs.ca.cert),
        "COGPROXY_REDIS_USERNAME": "cogproxy",
        "COGPROXY_REDIS_PASSWORD": PASSWORD,
    }
    done = subprocess.run(
        [sys.executable, "-m", "proxy", "calibration", "report", "--redis-url", tls_acl_redis.url(0)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env=env,
    )
    assert done.returncode == 0, done.stderr[-400:]
    assert any(line.startswith("p/x") and " reported " in line for line in done.stdout.splitlines())
    url = tls_acl_redis.url(0)
    simulate = ("policy", "simulate", "--json", "--policy", str(DEFAULT_POLICY), "--from", url)
    simulated = subprocess.run(
        [sys.executable, "-m", "proxy", *simulate],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env=env,
    )
    assert simulated.returncode == 0, simulated.stderr[-400:]  # `policy simulate` reads it the same way


async def test_a_password_in_the_url_query_is_masked_in_the_calibration_error() -> None:
    """Finding (low): redis-py takes ``?password=`` (any unknown query option becomes a client
    argument) and authenticates with it, but ``redacted()`` (``proxy/state/redis_access.py``)
    masks the userinfo password only: ``cogproxy calibration``'s "Redis at <url>: ..." error
    prints the password in clear. (``serve``'s "given twice" check misses it the same way: a
    ``?password=`` silently wins over ``--redis-password-file``.) Expected: masked."""
    dead = f"redis://127.0.0.1:{free_port()}/0?password={PASSWORD}"
    with pytest.raises(SourceError) as failed:
        await from_redis(dead)
    assert PASSWORD not in str(failed.value)


def test_a_url_password_not_percent_encoded_is_not_echoed_by_serve(tmp_path: Path) -> None:
    """Finding (low): a password holding '/' (base64 has one) written into ``--redis-url``
    unencoded makes urllib read the part before '/' as the port, and ``serve`` prints
    "serve: Port could not be cast to integer value as 'S3cr'": a piece of the password on
    stderr (a container log). Expected: a line that names the problem without any of it
    ("--redis-url: ... (a password in the URL must be percent-encoded)")."""
    code, output = serve_output(tmp_path, "--redis-url", f"redis://cogproxy:{SECRET}@127.0.0.1:1/0")
    assert code == 2
    assert SECRET.partition("/")[0] not in output, output[-300:]


def test_a_cluster_url_with_a_database_is_a_one_line_error_at_start(tmp_path: Path) -> None:
    """Finding (low): the docs say a cluster URL has no ``/db``; ``serve --redis-url
    redis+cluster://host:port/3`` passes the start-up checks, then dies in the app's start-up
    with a 30-line traceback ending ``RedisClusterException: Argument 'db' must be 0 or None in
    cluster mode`` and exit 1, where every other bad Redis flag is one ``serve: ...`` line and
    exit 2. Expected: exit 2, one line naming ``--redis-url``."""
    code, output = serve_output(tmp_path, "--redis-url", f"redis+cluster://127.0.0.1:{free_port()}/3")
    assert "Traceback" not in output, output[-300:]
    assert code == 2


def test_a_password_file_that_is_not_text_is_named_with_its_flag(tmp_path: Path) -> None:
    """Finding (low): ``read_password_file`` decodes the file as UTF-8 without catching the
    error: a binary (or UTF-16, or wrong Secret key) password file stops ``serve`` with
    "serve: 'utf-8' codec can't decode byte 0xff in position 0: invalid start byte", naming
    neither the flag nor the file, unlike every other bad access file. Expected: the line names
    ``--redis-password-file`` and the path."""
    binary = tmp_path / "redis-password"
    binary.write_bytes(b"\xff\xfep\x00w\x00\n\x00")  # UTF-16 with its byte-order mark
    with pytest.raises(ValueError, match=f"--redis-password-file {binary}"):
        settings_of("--redis-url", "redis://127.0.0.1:1/0", "--redis-password-file", str(binary))


def test_calibration_against_a_redis_that_does_not_speak_tls_fails_instead_of_hanging() -> None:
    """Finding (low): ``rediss://`` is never downgraded (good), but the ``scan`` purpose has no
    timeout at all, connect included (``TIMEOUTS_S["scan"] = None``): ``cogproxy calibration
    report --redis-url rediss://...`` pointed at a Redis without TLS (or at any endpoint that
    accepts and stays silent: a wrong port, a half-open load balancer) waits in the TLS
    handshake forever, with no output. Expected: a connect timeout, then the usual one line
    "error: Redis at ...: ..." and exit 2. (The suite's own plain redis-server is the endpoint.)"""
    plain_as_tls = f"rediss://127.0.0.1:{redis_port()}/15"
    try:
        done = subprocess.run(
            [sys.executable, "-m", "proxy", "calibration", "report", "--redis-url", plain_as_tls],
            capture_output=True,
            text=True,
            timeout=HANG_GUARD_S,
            check=False,
            env=clean_env(),
        )
    except subprocess.TimeoutExpired as hung:
        raise AssertionError(
            f"calibration still waiting for the TLS handshake after {HANG_GUARD_S:g} s"
        ) from hung
    assert done.returncode == 2 and done.stderr.startswith("error: Redis at rediss://127.0.0.1:")
