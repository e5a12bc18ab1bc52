"""Session 41 adversarial pass (outside attacker): hostile rows in the Redis feedback store, read
back by ``cogproxy calibration`` and ``cogproxy policy simulate``, against the suite's own
redis-server (never a Redis the test did not start)."""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

import orjson
import pytest

from proxy.state.feedback import KEY_PREFIX
from tests.support.cli import cogproxy
from tests.support.redis_db import fresh_db
from tests.support.redis_server import redis_url

REDIS_URL = redis_url(15)
EXPIRES = int(time.time()) + 86_400


cli = cogproxy


def judged_row(module: str, tier: str = "decision", target: str = "p/x") -> bytes:
    """A packed judged record as ``AnswerRecord.packed`` writes it."""
    row = [
        module,
        tier,
        target,
        0.8,
        0.8,
        "accept",
        0.7,
        EXPIRES,
        "l",
        [],
        "correct",
        1.0,
        1,
        None,
        None,
    ]
    return orjson.dumps(row)


@pytest.fixture
async def module_keys() -> AsyncIterator[tuple[str, Any]]:
    module = f"attacks41-{uuid.uuid4().hex[:8]}"
    async with fresh_db(15, match=f"{KEY_PREFIX}{module}-*") as client:
        yield module, client


NOT_UTF8 = b"\xff\xfe"


@pytest.mark.parametrize("where", ["field", "key"])
async def test_a_row_whose_client_field_or_key_is_not_utf8_is_skipped_not_a_traceback(
    module_keys: tuple[str, Any], where: str
) -> None:
    """Finding (low): ``scan_records`` decoded the hash's key and field names (the client and
    the trace id) outside the guard that skips a bad row, so one hand-written or damaged field
    name that is not UTF-8 stopped ``calibration report`` with a traceback and ``policy
    simulate`` with an error: every module's figures lost to one row. Expected: the row is
    skipped (counted like any other bad row), the good one is reported, exit 0."""
    module, client = module_keys
    await client.hset(f"{KEY_PREFIX}{module}-good", "key-aaaaaaaaaaaaaaaa", judged_row(module))
    if where == "field":
        await client.hset(f"{KEY_PREFIX}{module}-bad", NOT_UTF8, judged_row(module))
    else:
        await client.hset(f"{KEY_PREFIX}{module}-".encode() + NOT_UTF8, "key-b", judged_row(module))
    report = cli("calibration", "report", "--redis-url", REDIS_URL, "--module", module)
    assert "Traceback" not in report.stderr, report.stderr[-600:]
    assert report.returncode == 0, report.stderr[-600:]
    line = next(
        line for line in report.stdout.splitlines() if line.startswith("p/x") and " reported " in line
    )
    assert line.split()[2] == "1"  # the good record only
    simulated = cli(
        "policy",
        "simulate",
        "--policy",
        "policies/demo.yaml",
        "--from",
        REDIS_URL,
        "--module",
        module,
        "--json",
    )
    assert simulated.returncode == 0, simulated.stderr[-600:]


def row_of_tier(module: str, tier: str) -> bytes:
    """A judged answer of the demo policy's cheap rung, stored under ``tier``."""
    return judged_row(module, tier, "offline/small")


@pytest.mark.parametrize("command", ["simulate", "tune"])
async def test_an_answer_of_a_tier_the_candidate_lacks_is_left_out_not_a_traceback(
    module_keys: tuple[str, Any], command: str
) -> None:
    """Finding (medium): ``policy simulate|tune --from redis://`` looked a stored answer's tier up
    in the candidate policy (``Policy.thresholds_for``: ``tiers[tier]``) and died with a KeyError
    traceback when the candidate had no such tier: not only a hand-written row, also the plain
    case of a running policy with a tier of its own (``legal``) and a candidate that renames or
    drops it, the very change ``simulate`` is for. Expected: such answers are left out and
    counted with those whose target is on no rung; the rest are replayed."""
    module, client = module_keys
    await client.hset(f"{KEY_PREFIX}{module}-good", "key-aaaaaaaaaaaaaaaa", row_of_tier(module, "decision"))
    await client.hset(f"{KEY_PREFIX}{module}-gone", "key-aaaaaaaaaaaaaaaa", row_of_tier(module, "legal"))
    extra = ["--target-accuracy", "0.9"] if command == "tune" else []
    done = cli(
        "policy", command, "--policy", "policies/demo.yaml", "--from", REDIS_URL, "--module", module, *extra
    )
    assert "Traceback" not in done.stderr, done.stderr[-600:]
    if command == "simulate":
        assert done.returncode == 0, done.stderr[-600:]
        assert done.stdout.startswith("1 judged answers replayed (1 left out"), done.stdout
    else:  # one verdict vouches for no threshold (exit 1, documented): the tier's is counted
        assert "# 1 verdicts left out" in done.stdout, done.stdout
