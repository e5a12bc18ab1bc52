"""``serve``'s Redis TLS and ACL flags (``--redis-ca-file``, ``--redis-cert-file``,
``--redis-key-file``, ``--redis-username``, ``--redis-password-file``, ``COGPROXY_REDIS_PASSWORD``)
reach the one ``RedisOptions``; every mistake stops ``serve`` with a line naming the flag, and no
message ever shows a password (certificates made by the test with openssl)."""

from __future__ import annotations

import os
import shutil
import ssl
from pathlib import Path

import pytest

from proxy.calibration.sources import SourceError, from_redis
from proxy.cli import build_parser, main, resolve_serve_options, serve_settings
from proxy.settings import Settings
from proxy.state.redis_access import redacted
from proxy.state.redis_client import Purpose, RedisOptions, redis_client
from tests.support.redis_server import free_port
from tests.support.tls_certs import Certificates, make_certificates

URL = "rediss://127.0.0.1:1/0"
PLAIN = "redis://127.0.0.1:1/0"
PASSWORD = "pw-7f3a-never-shown"


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Certificates:
    return make_certificates(tmp_path_factory.mktemp("certs"))


@pytest.fixture(autouse=True)
def no_redis_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("URL", "CA_FILE", "CERT_FILE", "KEY_FILE", "USERNAME", "PASSWORD", "PASSWORD_FILE"):
        monkeypatch.delenv(f"COGPROXY_REDIS_{name}", raising=False)


def settings_of(*flags: str) -> Settings:
    args = build_parser().parse_args(["serve", "--policy", "p.yaml", *flags])
    args.modules = []
    resolve_serve_options(args)
    return serve_settings(args)


def password_file(tmp_path: Path, text: str = PASSWORD + "\n") -> Path:
    path = tmp_path / "redis-password"
    path.write_text(text, encoding="utf-8")
    return path


def test_tls_files_and_acl_credentials_reach_the_redis_options(certs: Certificates, tmp_path: Path) -> None:
    redis = settings_of(
        "--redis-url", URL,
        "--redis-ca-file", str(certs.ca.cert),
        "--redis-cert-file", str(certs.client.cert),
        "--redis-key-file", str(certs.client.key),
        "--redis-username", "cogproxy",
        "--redis-password-file", str(password_file(tmp_path)),
    ).redis  # fmt: skip
    assert redis is not None
    assert (redis.ssl_ca_certs, redis.ssl_certfile, redis.ssl_keyfile) == (
        str(certs.ca.cert),
        str(certs.client.cert),
        str(certs.client.key),
    )
    assert (redis.username, redis.password) == ("cogproxy", PASSWORD)  # the newline dropped


def test_the_same_from_the_environment_with_the_password_itself(
    certs: Certificates, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COGPROXY_REDIS_URL", URL)
    monkeypatch.setenv("COGPROXY_REDIS_CA_FILE", str(certs.ca.cert))
    monkeypatch.setenv("COGPROXY_REDIS_USERNAME", "cogproxy")
    monkeypatch.setenv("COGPROXY_REDIS_PASSWORD", PASSWORD)
    redis = settings_of().redis
    assert redis is not None
    assert (redis.ssl_ca_certs, redis.ssl_certfile, redis.username, redis.password) == (
        str(certs.ca.cert),
        None,
        "cogproxy",
        PASSWORD,
    )
    assert PASSWORD not in repr(settings_of()) + repr(redis)


def test_the_password_flag_is_refused_without_echoing_it() -> None:
    with pytest.raises(ValueError, match="--redis-password is refused") as refused:
        settings_of("--redis-url", URL, "--redis-password", PASSWORD)
    assert PASSWORD not in str(refused.value)
    assert "--redis-password-file" in str(refused.value) and "COGPROXY_REDIS_PASSWORD" in str(refused.value)


def test_tls_files_need_a_rediss_url_and_any_access_flag_needs_a_url(certs: Certificates) -> None:
    with pytest.raises(
        ValueError,
        match=r"--redis-ca-file need a TLS --redis-url \(rediss:// or rediss\+cluster://\), not redis://",
    ):
        settings_of("--redis-url", PLAIN, "--redis-ca-file", str(certs.ca.cert))
    with pytest.raises(ValueError, match="--redis-username: there is no --redis-url"):
        settings_of("--redis-username", "cogproxy")


@pytest.mark.parametrize("flag", ["--redis-ca-file", "--redis-cert-file", "--redis-password-file"])
def test_a_missing_file_is_named_with_its_flag(flag: str, tmp_path: Path) -> None:
    missing = tmp_path / "absent.pem"
    with pytest.raises(ValueError, match=rf"{flag} {missing}: cannot read it \(No such file or directory\)"):
        settings_of("--redis-url", URL, flag, str(missing))


def test_files_that_are_not_pem_are_named(certs: Certificates, tmp_path: Path) -> None:
    junk = tmp_path / "junk.pem"
    junk.write_text("not a certificate\n", encoding="utf-8")
    with pytest.raises(ValueError, match=f"--redis-ca-file {junk}: not a PEM CA certificate"):
        settings_of("--redis-url", URL, "--redis-ca-file", str(junk))
    with pytest.raises(ValueError, match="not a PEM certificate and its private key"):
        settings_of(
            "--redis-url", URL, "--redis-cert-file", str(certs.client.cert), "--redis-key-file", str(junk)
        )
    with pytest.raises(ValueError, match="--redis-key-file needs --redis-cert-file"):
        settings_of("--redis-url", URL, "--redis-key-file", str(certs.client.key))
    with pytest.raises(ValueError, match="the password is empty"):
        settings_of("--redis-url", URL, "--redis-password-file", str(password_file(tmp_path, "\n")))


def test_a_password_given_twice_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ValueError, match="the URL's would win"):
        in_url = f"redis://:{PASSWORD}@127.0.0.1:1/0"
        settings_of("--redis-url", in_url, "--redis-password-file", str(password_file(tmp_path)))
    with pytest.raises(ValueError, match="the URL's would win"):
        settings_of("--redis-url", "redis://someone@127.0.0.1:1/0", "--redis-username", "cogproxy")
    monkeypatch.setenv("COGPROXY_REDIS_PASSWORD", PASSWORD)
    with pytest.raises(ValueError, match="given twice: --redis-password-file and COGPROXY_REDIS_PASSWORD"):
        settings_of("--redis-url", URL, "--redis-password-file", str(password_file(tmp_path)))


def test_serve_stops_with_one_line_naming_the_flag(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    missing = tmp_path / "ca.pem"
    code = main(
        [
            "serve",
            "--policy",
            "p.yaml",
            "--modules",
            str(tmp_path),
            "--redis-url",
            URL,
            "--redis-ca-file",
            str(missing),
        ]
    )
    assert code == 2
    assert (
        capsys.readouterr().err.strip()
        == f"serve: --redis-ca-file {missing}: cannot read it (No such file or directory)"
    )


def test_redacted_masks_only_the_password() -> None:
    assert (
        redacted(f"rediss://cogproxy:{PASSWORD}@redis.example:6380/0")
        == "rediss://cogproxy:***@redis.example:6380/0"
    )
    assert redacted(f"redis://:{PASSWORD}@10.0.0.1/2") == "redis://:***@10.0.0.1/2"
    assert redacted(PLAIN) == PLAIN


async def test_the_calibration_error_shows_the_url_without_its_password() -> None:
    dead = f"redis://:{PASSWORD}@127.0.0.1:{free_port()}/0"
    with pytest.raises(SourceError) as failed:
        await from_redis(dead)
    assert PASSWORD not in str(failed.value) and "redis://:***@127.0.0.1:" in str(failed.value)


def test_tls_connections_share_one_context_until_a_file_changes(certs: Certificates, tmp_path: Path) -> None:
    """redis-py would build an SSL context (loading the system CA store) for every connection."""
    ca = tmp_path / "ca.crt"
    shutil.copy(certs.ca.cert, ca)
    options = RedisOptions(URL, ssl_ca_certs=str(ca))

    def context_of_a_new_connection(purpose: Purpose) -> ssl.SSLContext:
        found: ssl.SSLContext = (
            redis_client(options, purpose).connection_pool.make_connection().ssl_context.get()
        )
        return found

    shared = context_of_a_new_connection("limits")
    assert context_of_a_new_connection("context") is shared
    assert (shared.verify_mode, shared.check_hostname) == (ssl.CERT_REQUIRED, True)
    assert [c["subject"] for c in shared.get_ca_certs()] == [((("commonName", "test-ca"),),)]  # only it
    later = ca.stat().st_mtime_ns + 1_000_000_000
    os.utime(ca, ns=(later, later))  # a rotated Secret
    assert context_of_a_new_connection("limits") is not shared
