"""``cogproxy calibration report|fit`` on the Redis store (the Prometheus source is driven in
tests/test_grafana_calibration.py), and its errors."""

from __future__ import annotations

import random
import subprocess
import uuid
from collections.abc import AsyncIterator

import pytest
import yaml

from proxy.policy.loader import parse_policy
from proxy.state.feedback import KEY_PREFIX, AnswerRecord, RedisFeedbackStore
from proxy.state.outbox import RedisOutbox
from proxy.state.redis_client import RedisOptions
from tests.policy.test_loader import MINIMAL
from tests.prometheus_e2e import free_port
from tests.support.cli import cogproxy as run_cogproxy
from tests.support.redis_db import fresh_db
from tests.support.redis_server import redis_url

REDIS_URL = redis_url(15)


def cogproxy(*args: str) -> subprocess.CompletedProcess[str]:
    return run_cogproxy("calibration", *args)


Judged = tuple[float, bool]
"""(reported confidence, judged correct)."""


async def store_judged(module: str, answers: list[Judged], target: str = "p/m") -> None:
    """Remember ``answers`` of ``target`` for ``module`` (exec tier) in Redis, each with its verdict."""
    outbox = RedisOutbox(RedisOptions(REDIS_URL))
    outbox.start()
    store = RedisFeedbackStore(RedisOptions(REDIS_URL), outbox)
    provider, _, model = target.partition("/")
    for i, (c, correct) in enumerate(answers):
        store.remember(
            AnswerRecord(
                f"{module}-{i}",
                module,
                "exec",
                "fast",
                provider,
                model,
                c,
                c,
                "low",
                "accept",
                0.9,
                0.0,
                4e9,
                verdict="correct" if correct else "incorrect",
                score=float(correct),
                verdicts=1,
            ),
            len(answers) + 1,
        )
    await store.aclose()
    await outbox.aclose(timeout=30.0)  # delivers them all first


@pytest.fixture
async def judged_module() -> AsyncIterator[str]:
    """400 judged answers of p/m (right with probability confidence - 0.3) under a unique module
    name in Redis; its keys are deleted afterwards."""
    module = f"calib-{uuid.uuid4().hex[:8]}"
    async with fresh_db(15, match=f"{KEY_PREFIX}{module}-*"):  # its answers go afterwards
        rng = random.Random(3)
        answers = []
        for _ in range(400):
            c = round(rng.uniform(0.5, 1.0), 4)
            answers.append((c, rng.random() < c - 0.3))
        await store_judged(module, answers)
        yield module


async def test_fit_proposes_a_flat_map_for_a_model_whose_confidence_tells_nothing() -> None:
    """Issue #34 finding 1: 40 answers at 0.95 half right, 20 at 0.75 three quarters right (ECE
    0.30): PAV pools both, and the map proposed is flat at 35/60."""
    module = f"calib-{uuid.uuid4().hex[:8]}"
    async with fresh_db(15, match=f"{KEY_PREFIX}{module}-*"):
        await store_judged(module, [(0.95, i < 20) for i in range(40)] + [(0.75, i < 15) for i in range(20)])
        done = cogproxy("fit", "--redis-url", REDIS_URL, "--module", module, "--min-verdicts", "60")
    assert done.returncode == 0, done.stderr
    policy = parse_policy({**MINIMAL, **yaml.safe_load(done.stdout)})
    assert {round(policy.calibrate("p/m", x), 2) for x in (0.5, 0.75, 0.9, 0.95, 1.0)} == {0.58}


def test_report_from_redis(judged_module: str) -> None:
    done = cogproxy("report", "--redis-url", REDIS_URL, "--module", judged_module)
    assert done.returncode == 0, done.stderr
    line = next(line for line in done.stdout.splitlines() if line.startswith("p/m") and " reported " in line)
    _, _, verdicts, ece, brier = line.split()
    assert int(verdicts) == 400 and float(ece) == pytest.approx(0.3, abs=0.06) and 0 < float(brier) < 1
    assert "exec         accept" in done.stdout  # accuracy per tier and decision


def test_fit_from_redis_prints_a_policy_the_loader_accepts(judged_module: str) -> None:
    done = cogproxy("fit", "--redis-url", REDIS_URL, "--module", judged_module)
    assert done.returncode == 0, done.stderr
    assert "fitted on 400 verdicts" in done.stderr
    rows = {line.split()[1]: line.split()[2:] for line in done.stderr.splitlines() if line.startswith("#   ")}
    assert set(rows) == {"kind", "isotonic", "platt", "temperature"}
    [proposed] = [kind for kind, row in rows.items() if row[-1] == "proposed"]
    loss, ece_before, ece_after, brier_before, brier_after = map(float, rows[proposed][:5])
    assert loss == min(float(row[0]) for kind, row in rows.items() if kind != "kind")
    assert ece_before == pytest.approx(0.3, abs=0.06) and ece_after < 0.1 and brier_after < brier_before
    proposal = yaml.safe_load(done.stdout)
    policy = parse_policy({**MINIMAL, **proposal})
    assert policy.calibrate("p/m", 0.95) < 0.8  # right ~65% of the time at 0.95
    assert policy.calibrate("p/m", 0.6) < policy.calibrate("p/m", 0.95)
    too_few = cogproxy("fit", "--redis-url", REDIS_URL, "--module", judged_module, "--min-verdicts", "401")
    assert too_few.returncode == 1 and "p/m: 400 verdicts, no map proposed" in too_few.stderr


def test_unreachable_sources_and_bad_windows_are_reported_not_raised() -> None:
    port = free_port()
    for args in (
        ("report", "--prometheus", f"http://127.0.0.1:{port}"),
        ("fit", "--redis-url", f"redis://127.0.0.1:{port}/0"),
        ("report", "--prometheus", "http://127.0.0.1:9", "--window", "7 days"),
    ):
        done = cogproxy(*args)
        assert done.returncode == 2 and done.stderr.startswith("error: "), (args, done.stderr)
        assert "Traceback" not in done.stderr
