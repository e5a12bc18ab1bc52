"""The inputs next to each finding of the issue #32 attack (``test_attack32_*.py``), which would
break the same way: other spellings of a TLS or cluster URL, other ways a password reaches a
message, other files that are not a password, other damaged records, and the same checks from
``cogproxy calibration``, against the suite's own redis-server and real ``cogproxy`` processes."""

from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest
import yaml

from proxy.cli import build_parser
from proxy.state.feedback import KEY_PREFIX, AnswerRecord, RedisFeedbackStore, from_redis, with_verdict
from proxy.state.outbox import RedisOutbox
from proxy.state.redis_access import PASSWORD_FILE_MAX_BYTES, redacted
from proxy.state.redis_client import RedisOptions
from proxy.state.redis_flags import ACCESS_FLAGS
from tests.security.test_attack32_feedback import EXPIRES, calibration, judged_row
from tests.security.test_attack32_redis_access import SECRET, clean_env, serve_output, settings_of
from tests.support.redis_db import fresh_db
from tests.support.redis_server import redis_url
from tests.support.tls_certs import Certificates, make_certificates

REDIS_URL = redis_url(15)
SHARED = RedisOptions(REDIS_URL)
DELIVERY_S = 10.0
HANG_GUARD_S = 30.0
REDIS_ENV = ("URL", "CA_FILE", "CERT_FILE", "KEY_FILE", "USERNAME", "PASSWORD", "PASSWORD_FILE")


@pytest.fixture(autouse=True)
def no_redis_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in REDIS_ENV:
        monkeypatch.delenv(f"COGPROXY_REDIS_{name}", raising=False)


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Certificates:
    return make_certificates(tmp_path_factory.mktemp("certs"))


@pytest.fixture
async def module_keys() -> AsyncIterator[tuple[str, Any]]:
    module = f"attack32n-{uuid.uuid4().hex[:8]}"
    async with fresh_db(15, match=f"{KEY_PREFIX}{module}-*") as client:
        yield module, client


# -- Finding 1: a TLS URL in any spelling takes the TLS files ------------------------------------


@pytest.mark.parametrize("url", ["REDISS+CLUSTER://127.0.0.1:7000", "Rediss://127.0.0.1:6380/0"])
def test_a_tls_url_in_capitals_takes_the_tls_files(certs: Certificates, url: str) -> None:
    """URL schemes are case-insensitive (redis-py lowercases them): the TLS check must be too."""
    redis = settings_of("--redis-url", url, "--redis-ca-file", str(certs.ca.cert)).redis
    assert redis is not None and redis.ssl_ca_certs == str(certs.ca.cert)


def test_a_plain_cluster_url_still_refuses_the_tls_files(certs: Certificates) -> None:
    with pytest.raises(ValueError, match=r"need a TLS --redis-url .* not redis\+cluster://"):
        settings_of("--redis-url", "redis+cluster://127.0.0.1:7000", "--redis-ca-file", str(certs.ca.cert))


# -- Finding 2: one definition of the access flags ------------------------------------------------


def _access_flags(*command: str) -> dict[str, str]:
    """The ``--redis-*`` access flags of ``cogproxy <command>`` and their help."""
    parser = build_parser()
    for name in command:
        sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
        parser = sub.choices[name]
    own = ("--redis-url", "--redis-limits-timeout", "--redis-durable-replicas")  # serve's own
    return {
        flag: action.help or ""
        for action in parser._actions
        for flag in action.option_strings
        if flag.startswith("--redis-") and flag not in own
    }


@pytest.mark.parametrize(
    "command",
    [("calibration", "report"), ("calibration", "fit"), ("policy", "tune"), ("policy", "simulate")],
)
def test_calibration_takes_every_access_flag_serve_takes_from_one_definition(
    command: tuple[str, ...],
) -> None:
    serve, calibration = _access_flags("serve"), _access_flags(*command)
    assert set(calibration) == set(serve) == {*(option.flag for option in ACCESS_FLAGS), "--redis-password"}
    for option in ACCESS_FLAGS:
        assert serve[option.flag].startswith(option.help) and calibration[option.flag].startswith(option.help)
        assert (
            f"COGPROXY_{option.env}" in serve[option.flag]
            and f"COGPROXY_{option.env}" in calibration[option.flag]
        )


def test_calibration_reads_the_redis_url_from_the_environment(module_keys: tuple[str, Any]) -> None:
    module, _ = module_keys
    env = {**clean_env(), "COGPROXY_REDIS_URL": REDIS_URL}
    done = _calibration_with(env, "report", "--module", module)
    assert done.returncode == 0, done.stderr[-400:]


def test_calibration_without_a_source_says_which_to_give() -> None:
    done = _calibration_with(clean_env(), "report")
    assert done.returncode == 2
    assert done.stderr.startswith(
        "error: give --prometheus URL or --redis-url URL (or set COGPROXY_REDIS_URL)"
    )


def test_calibration_refuses_a_password_flag_without_echoing_it() -> None:
    for source in (["--redis-url", REDIS_URL], ["--prometheus", "http://127.0.0.1:1"]):
        done = _calibration_with(clean_env(), "report", *source, "--redis-password", SECRET)
        assert done.returncode == 2 and "--redis-password is refused" in done.stderr
        assert SECRET not in done.stderr + done.stdout


def test_calibration_with_prometheus_names_an_access_flag_given_for_nothing(certs: Certificates) -> None:
    done = _calibration_with(
        clean_env(), "report", "--prometheus", "http://127.0.0.1:1", "--redis-ca-file", str(certs.ca.cert)
    )
    assert done.returncode == 2
    assert done.stderr.startswith("error: --redis-ca-file: only with --redis-url, not with --prometheus")


def test_calibration_with_prometheus_ignores_the_deployments_redis_variables(certs: Certificates) -> None:
    """In a pod ``COGPROXY_REDIS_*`` are serve's: they must not stop a ``--prometheus`` read (it
    fails here on the dead Prometheus, not on the variables)."""
    env = {**clean_env(), "COGPROXY_REDIS_PASSWORD": SECRET, "COGPROXY_REDIS_CA_FILE": str(certs.ca.cert)}
    done = _calibration_with(env, "report", "--prometheus", "http://127.0.0.1:1")
    assert done.returncode == 2 and done.stderr.startswith("error: Prometheus at http://127.0.0.1:1")


def test_calibration_names_a_binary_password_file(tmp_path: Path) -> None:
    binary = tmp_path / "pw"
    binary.write_bytes(b"\xff\xfep\x00w\x00")
    done = _calibration_with(
        clean_env(), "report", "--redis-url", REDIS_URL, "--redis-password-file", str(binary)
    )
    assert done.returncode == 2
    assert done.stderr.startswith(f"error: --redis-password-file {binary}: not UTF-8 text")


def _calibration_with(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "proxy", "calibration", *args],
        capture_output=True,
        text=True,
        timeout=HANG_GUARD_S,
        check=False,
        env=env,
    )


# -- Finding 3: a password in any part of the URL ------------------------------------------------


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        (f"redis://h:1/0?password={SECRET}", "redis://h:1/0?password=***"),
        (f"redis://h:1/0?db=0&PassWord={SECRET}&x=1", "redis://h:1/0?db=0&PassWord=***&x=1"),
        (f"rediss://h:1/0?ssl_password={SECRET}", "rediss://h:1/0?ssl_password=***"),
        (f"redis://h:1/0?pass%77ord={SECRET}", "redis://h:1/0?pass%77ord=***"),
        (f"redis://u:{SECRET}@h:1/0", "redis://***@h:1/0"),  # unencoded '/': the user goes too
        ("redis://u:12/34@h:1/0", "redis://***@h:1/0"),  # digits before the '/': a "port"
        ("redis://u:p@ss@h:1/0", "redis://u:***@h:1/0"),  # an unencoded '@'
        ("redis://:pa#ss@h/0", "redis://***@h/0"),
        ("redis://[::1", "redis://***"),  # not a URL at all
    ],
)
def test_redacted_masks_every_password_spelling(url: str, shown: str) -> None:
    assert redacted(url) == shown


@pytest.mark.parametrize(
    "password",
    [
        "1234/zqxw",  # digits before the '/': redis-py would connect to host "u", port 1234
        "pa7q?zqxw",
        "pa7q#zqxw",
        "1234?zqxw",
        "1234#zqxw",
    ],
)
def test_an_unencoded_password_is_refused_at_start_without_a_piece_of_it(password: str) -> None:
    with pytest.raises(ValueError, match=r"--redis-url: .*must be percent-encoded") as refused:
        settings_of("--redis-url", f"redis://u:{password}@127.0.0.1:1/0")
    for piece in password.replace("?", "/").replace("#", "/").split("/"):
        assert piece not in str(refused.value)


def test_a_port_out_of_range_is_a_one_line_error(tmp_path: Path) -> None:
    code, output = serve_output(tmp_path, "--redis-url", "redis://127.0.0.1:99999/0")
    assert code == 2 and "serve: --redis-url: the port is not a number" in output


def test_a_query_password_given_with_the_password_variable_is_refused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("COGPROXY_REDIS_PASSWORD", "x")
    with pytest.raises(ValueError, match="the --redis-url carries a user or password already") as refused:
        settings_of("--redis-url", f"redis://127.0.0.1:1/0?PASSWORD={SECRET}")
    assert SECRET not in str(refused.value)


def test_a_query_password_given_with_a_password_file_is_refused(tmp_path: Path) -> None:
    password = tmp_path / "pw"
    password.write_text("x\n", encoding="utf-8")
    with pytest.raises(ValueError, match="the --redis-url carries a user or password already") as refused:
        settings_of(
            "--redis-url", f"redis://127.0.0.1:1/0?password={SECRET}", "--redis-password-file", str(password)
        )
    assert SECRET not in str(refused.value)


def test_a_query_user_given_with_the_user_flag_is_refused() -> None:
    with pytest.raises(ValueError, match="the --redis-url carries a user or password already"):
        settings_of("--redis-url", "redis://127.0.0.1:1/0?username=someone", "--redis-username", "cogproxy")


# -- Finding 6: other URLs and files that fail late ----------------------------------------------


@pytest.mark.parametrize(
    "url",
    ["redis+cluster://127.0.0.1:1/0", "redis+cluster://127.0.0.1:1", "rediss+cluster://127.0.0.1:1/"],
)
def test_a_cluster_url_with_database_0_or_none_is_taken(url: str) -> None:
    assert settings_of("--redis-url", url).redis is not None


@pytest.mark.parametrize(
    "url", ["redis+cluster://127.0.0.1:1?db=2", "REDIS+CLUSTER://127.0.0.1:1/%33", "rediss+cluster://h:1/1"]
)
def test_a_cluster_url_with_another_database_in_any_spelling_is_refused(url: str) -> None:
    with pytest.raises(ValueError, match="--redis-url: a Redis Cluster has database 0 only"):
        settings_of("--redis-url", url)


def test_an_unknown_scheme_is_refused_at_start() -> None:
    with pytest.raises(ValueError, match=r"--redis-url: not a Redis URL \(schemes: redis://"):
        settings_of("--redis-url", "http://127.0.0.1:1/0")


@pytest.fixture
def fifo(tmp_path: Path) -> Iterator[Path]:
    path = tmp_path / "fifo"
    os.mkfifo(path)
    yield path


@pytest.mark.parametrize("flag", ["--redis-password-file", "--redis-ca-file"])
def test_a_fifo_is_refused_not_waited_on(fifo: Path, flag: str) -> None:
    """Opening a FIFO for reading blocks until a writer comes: ``serve`` would hang at start."""
    with pytest.raises(ValueError, match=f"{flag} {fifo}: not a regular file"):
        settings_of("--redis-url", "rediss://127.0.0.1:1/0", flag, str(fifo))


def test_a_device_is_not_a_password_file() -> None:
    with pytest.raises(ValueError, match="--redis-password-file /dev/zero: not a regular file"):
        settings_of("--redis-url", "redis://127.0.0.1:1/0", "--redis-password-file", "/dev/zero")


def test_a_large_password_file_is_refused(tmp_path: Path) -> None:
    large = tmp_path / "pw"
    large.write_text("p" * (PASSWORD_FILE_MAX_BYTES + 1), encoding="utf-8")
    with pytest.raises(
        ValueError, match=f"--redis-password-file {large}: larger than {PASSWORD_FILE_MAX_BYTES}"
    ):
        settings_of("--redis-url", "redis://127.0.0.1:1/0", "--redis-password-file", str(large))
    exact = tmp_path / "pw-exact"
    exact.write_text("p" * PASSWORD_FILE_MAX_BYTES, encoding="utf-8")
    redis = settings_of("--redis-url", "redis://127.0.0.1:1/0", "--redis-password-file", str(exact)).redis
    assert redis is not None and redis.password == "p" * PASSWORD_FILE_MAX_BYTES


@pytest.mark.parametrize(("value", "password"), [("pw\n", "pw"), ("pw\r\n", "pw"), ("pw", "pw")])
def test_the_password_variable_drops_its_newline_like_the_file(
    value: str, password: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A Secret made with ``--from-file`` keeps the file's newline in the variable."""
    monkeypatch.setenv("COGPROXY_REDIS_PASSWORD", value)
    redis = settings_of("--redis-url", "redis://127.0.0.1:1/0").redis
    assert redis is not None and redis.password == password


def test_a_password_variable_of_a_newline_only_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COGPROXY_REDIS_PASSWORD", "\n")
    with pytest.raises(ValueError, match="COGPROXY_REDIS_PASSWORD: the password is empty"):
        settings_of("--redis-url", "redis://127.0.0.1:1/0")


# -- Finding 4: other damaged records ------------------------------------------------------------


HOSTILE_ROWS: dict[str, dict[str, Any]] = {
    "a verdict no proxy gives": {"verdict": "banana"},
    "a negative score": {"score": -0.5},
    "a boolean confidence": {"confidence": True},
    "a calibrated confidence above 1": {"calibrated": 1.5},
    "a string threshold": {"min_confidence": "0.7"},
    "a string expiry": {"expires": str(EXPIRES)},
    "a number for the tier": {"tier": 7},
    "a number for the target": {"target": 7},
    "a fractional verdict count": {"verdicts": 1.5},
    "a number for the note": {"note": 7},
}


@pytest.mark.parametrize("hostile", list(HOSTILE_ROWS), ids=list(HOSTILE_ROWS))
def test_from_redis_refuses_a_row_that_is_not_a_sane_record(hostile: str) -> None:
    """The same check guards the verdict path (``get``/``find``): a verdict on a damaged record
    would put its NaN or its 7 into the ``cognitive_feedback_*`` counters for good."""
    raw = orjson.dumps(judged_row("m", **HOSTILE_ROWS[hostile]))
    with pytest.raises((ValueError, TypeError)):
        from_redis(raw, "key-aaaaaaaaaaaaaaaa", "t")


async def test_a_damaged_record_cannot_be_judged(module_keys: tuple[str, Any]) -> None:
    module, client = module_keys
    await client.hset(
        f"{KEY_PREFIX}{module}-bad", "anonymous", orjson.dumps(judged_row(module, confidence="inf"))
    )
    outbox = RedisOutbox(SHARED)
    store = RedisFeedbackStore(SHARED, outbox)
    try:
        assert await store.get("anonymous", f"{module}-bad") is None
        assert await store.find(f"{module}-bad") == []
    finally:
        await store.aclose()
        await outbox.aclose()


async def test_fit_keeps_its_yaml_clean_and_counts_the_records_it_skipped(
    module_keys: tuple[str, Any],
) -> None:
    """``fit``'s stdout is the YAML an operator pipes into the policy: a skipped record is counted on
    stderr, never logged into it."""
    module, client = module_keys
    for n, (confidence, score) in enumerate([(0.2, 0.0), (0.9, 1.0)] * 10):  # enough for fit's 5 folds
        row = judged_row(module, confidence=confidence, calibrated=confidence, score=score)
        await client.hset(f"{KEY_PREFIX}{module}-{n}", "key-aaaaaaaaaaaaaaaa", orjson.dumps(row))
    await client.hset(f"{KEY_PREFIX}{module}-bad1", "key-aaaaaaaaaaaaaaaa", b"[1, 2, 3]")  # not a row
    await client.hset(
        f"{KEY_PREFIX}{module}-bad2", "key-aaaaaaaaaaaaaaaa", orjson.dumps(judged_row(module, score=None))
    )
    done = calibration("fit", "--redis-url", REDIS_URL, "--module", module, "--min-verdicts", "1")
    assert done.returncode == 0, done.stderr[-400:]
    assert "p/x" in yaml.safe_load(done.stdout)["calibration"]
    assert "# 2 records skipped as malformed" in done.stderr


async def test_report_names_the_count_of_skipped_records(module_keys: tuple[str, Any]) -> None:
    module, client = module_keys
    await client.hset(f"{KEY_PREFIX}{module}-good", "key-aaaaaaaaaaaaaaaa", orjson.dumps(judged_row(module)))
    await client.hset(
        f"{KEY_PREFIX}{module}-bad", "key-aaaaaaaaaaaaaaaa", orjson.dumps(judged_row(module, score=7))
    )
    done = calibration("report", "--redis-url", REDIS_URL, "--module", module)
    assert done.returncode == 0 and "# 1 records skipped as malformed" in done.stderr


# -- Finding 5: other ways past the daily cap ----------------------------------------------------


def _answer(module: str, n: int, now: float) -> AnswerRecord:
    return AnswerRecord(
        f"{module}-{n}", module, "decision", "fast", "p", "x", 0.8, 0.8, "low", "accept", 0.7, now, now + 600
    )


async def test_a_capped_answer_judged_again_the_next_day_stays_in_memory(
    module_keys: tuple[str, Any],
) -> None:
    """The cap is counted per day; an answer kept in memory yesterday is still not in Redis, so its
    verdict today must not put it there either (a new day's count is for new answers)."""
    module, client = module_keys
    day = 86_400.0 * (int(time.time() // 86_400) + 1)
    now = day - 10.0
    outbox = RedisOutbox(SHARED)
    outbox.start()
    store = RedisFeedbackStore(SHARED, outbox, lambda: now)
    try:
        store.remember(_answer(module, 0, now), 100, max_per_day=1)
        store.remember(_answer(module, 1, now), 100, max_per_day=1)  # capped
        now = day + 1.0
        await store.judged(with_verdict(_answer(module, 1, day - 10.0), "correct", 1.0, None, None))
        judged = await store.get("anonymous", f"{module}-1")
        await outbox.flush(DELIVERY_S)
        shared = sorted([key.decode() async for key in client.scan_iter(match=f"{KEY_PREFIX}{module}-*")])
    finally:
        await store.aclose()
        await outbox.aclose()
    assert shared == [f"{KEY_PREFIX}{module}-0"]
    assert judged is not None and judged.verdict == "correct"  # the verdict is kept here


async def test_a_capped_answer_remembered_again_under_the_cap_is_shared(module_keys: tuple[str, Any]) -> None:
    """Being capped once is not a mark for good: the same key remembered while under the cap (a
    new day) is shared, and so is its verdict."""
    module, client = module_keys
    day = 86_400.0 * (int(time.time() // 86_400) + 1)
    now = day - 10.0
    outbox = RedisOutbox(SHARED)
    outbox.start()
    store = RedisFeedbackStore(SHARED, outbox, lambda: now)
    try:
        store.remember(_answer(module, 0, now), 100, max_per_day=1)
        store.remember(_answer(module, 1, now), 100, max_per_day=1)  # capped
        now = day + 1.0
        store.remember(_answer(module, 1, now), 100, max_per_day=1)  # shared today
        await store.judged(with_verdict(_answer(module, 1, now), "incorrect", 0.0, None, None))
        await outbox.flush(DELIVERY_S)
        stored = await client.hget(f"{KEY_PREFIX}{module}-1", "anonymous")
    finally:
        await store.aclose()
        await outbox.aclose()
    assert stored is not None and from_redis(stored, "anonymous", f"{module}-1").verdict == "incorrect"


# -- Finding 7: any silent endpoint --------------------------------------------------------------


@pytest.fixture
def silent_port() -> Iterator[int]:
    """A listener that accepts connections and never answers (a wrong port, a half-open balancer)."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(16)
        yield listener.getsockname()[1]


@pytest.mark.parametrize("scheme", ["rediss", "redis"])
def test_calibration_against_a_silent_endpoint_fails_instead_of_hanging(
    silent_port: int, scheme: str
) -> None:
    """The backlog completes the TCP handshake; nothing ever answers: TLS hello or PING alike."""
    url = f"{scheme}://127.0.0.1:{silent_port}/0"
    try:
        done = _calibration_with(clean_env(), "report", "--redis-url", url)
    except subprocess.TimeoutExpired as hung:  # pragma: no cover - the finding
        raise AssertionError("calibration waited for a silent endpoint") from hung
    assert done.returncode == 2
    assert done.stderr.startswith(f"error: Redis at {url}: Timeout"), done.stderr[-300:]
