"""Issue #32 adversarial pass (outside attacker): the packed feedback records in Redis, the
per-day cap, and ``cogproxy calibration`` reading them, against the suite's own redis-server.

Each test fails on a0c573a (the end of #32) and states the answer the fix should give.
"""

from __future__ import annotations

import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

import orjson
import pytest

from proxy.state.feedback import KEY_PREFIX, AnswerRecord, RedisFeedbackStore, with_verdict
from proxy.state.outbox import RedisOutbox
from proxy.state.redis_client import RedisOptions
from tests.support.redis_db import fresh_db
from tests.support.redis_server import redis_url

REDIS_URL = redis_url(15)
SHARED = RedisOptions(REDIS_URL)
DELIVERY_S = 10.0
EXPIRES = int(time.time()) + 86_400


def calibration(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "proxy", "calibration", *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


@pytest.fixture
async def module_keys() -> AsyncIterator[tuple[str, Any]]:
    """A unique module name (also the trace-id prefix); its keys are deleted afterwards."""
    module = f"attack32-{uuid.uuid4().hex[:8]}"
    async with fresh_db(15, match=f"{KEY_PREFIX}{module}-*") as client:
        yield module, client


def judged_row(module: str, **changes: Any) -> list[Any]:
    """A packed judged record as the proxy writes it (``AnswerRecord.packed``), fields replaced."""
    row: dict[str, Any] = {
        "module": module,
        "tier": "decision",
        "target": "p/x",
        "confidence": 0.8,
        "calibrated": 0.8,
        "decision": "accept",
        "min_confidence": 0.7,
        "expires": EXPIRES,
        "verdict": "correct",
        "score": 1.0,
        "verdicts": 1,
        "source": None,
        "note": None,
    }
    row.update(changes)
    return list(row.values())


HOSTILE: dict[str, dict[str, Any]] = {
    "verdict without a score": {"score": None},
    "NaN confidence": {"confidence": "NaN"},
    "infinite confidence": {"confidence": "inf"},
    "a list for the tier": {"tier": ["decision"]},
    "NaN score": {"score": "NaN"},
    "score out of range": {"score": 7},
}


@pytest.mark.parametrize("hostile", list(HOSTILE), ids=list(HOSTILE))
async def test_a_corrupt_record_in_redis_is_skipped_by_calibration_not_a_traceback(
    module_keys: tuple[str, Any], hostile: str
) -> None:
    """Finding (low): ``proxy.state.feedback.from_redis`` checks a packed row's length only, and
    ``scan_records`` skips only rows that raise ValueError/TypeError while *loading*. A row that
    loads but is not a sane record then crashes ``cogproxy calibration report|fit`` with a
    Python traceback later: a verdict with a null score trips ``assert r.score is not None`` in
    ``calibration/sources.py`` (AssertionError), a NaN or infinite confidence raises in
    ``feedback_bucket`` (ValueError / OverflowError), a non-string tier is unhashable
    (TypeError). A NaN or out-of-range score does not crash but poisons the figures (ECE
    ``nan``) and the proposed map. One such record (another version, a hand edit, a partial
    restore) stops calibration for every module. Expected: the record is skipped
    (``proxy.feedback_record_skipped``), the good one is reported, exit 0."""
    module, client = module_keys
    await client.hset(f"{KEY_PREFIX}{module}-good", "key-aaaaaaaaaaaaaaaa", orjson.dumps(judged_row(module)))
    bad = judged_row(module, **HOSTILE[hostile])
    await client.hset(f"{KEY_PREFIX}{module}-bad", "key-aaaaaaaaaaaaaaaa", orjson.dumps(bad))
    done = calibration("report", "--redis-url", REDIS_URL, "--module", module)
    assert "Traceback" not in done.stderr, done.stderr[-600:]
    assert done.returncode == 0, done.stderr[-600:]
    line = next(line for line in done.stdout.splitlines() if line.startswith("p/x") and " reported " in line)
    _, _, verdicts, ece, brier = line.split()
    assert (verdicts, ece, brier) == ("1", "0.200", "0.040")  # the good record only


async def test_verdicts_on_answers_past_the_daily_cap_do_not_exceed_it(module_keys: tuple[str, Any]) -> None:
    """Finding (low): ``feedback.max_per_day`` is documented as the bound on what one replica adds
    to Redis in a UTC day ("the bound is max_per_day x replicas x window days records",
    docs/deployment.md, Redis sizing). Past the cap an answer is kept in memory only, but
    ``RedisFeedbackStore.judged`` writes every judged record to Redis unconditionally and
    uncounted, so a client that judges its capped answers (``POST /v1/feedback``, a note of up
    to 1,000 characters each) puts every one of them in Redis: the cap bounds nothing for a
    client that judges. Expected: a capped answer's verdict stays in this replica's memory (or
    counts against the cap)."""
    module, client = module_keys
    now = time.time()
    outbox = RedisOutbox(SHARED)
    outbox.start()
    store = RedisFeedbackStore(SHARED, outbox, lambda: now)

    def answer(n: int) -> AnswerRecord:
        return AnswerRecord(
            f"{module}-{n}",
            module,
            "decision",
            "fast",
            "p",
            "x",
            0.8,
            0.8,
            "low",
            "accept",
            0.7,
            now,
            now + 600,
        )

    try:
        for n in range(5):
            store.remember(answer(n), 100, max_per_day=2)
        for n in range(5):
            await store.judged(with_verdict(answer(n), "incorrect", 0.0, "qa", "n" * 1000))
        await outbox.flush(DELIVERY_S)
        shared = sorted([key.decode() async for key in client.scan_iter(match=f"{KEY_PREFIX}{module}-*")])
    finally:
        await store.aclose()
        await outbox.aclose()
    assert shared == [f"{KEY_PREFIX}{module}-0", f"{KEY_PREFIX}{module}-1"], (
        f"{len(shared)} records in Redis with max_per_day=2"
    )
