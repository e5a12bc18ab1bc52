"""``cogproxy policy tune`` and ``policy simulate`` on answers stored in the suite's own Redis."""

from __future__ import annotations

import dataclasses
import json
import random
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from proxy.policy.loader import parse_policy
from proxy.state.feedback import KEY_PREFIX, AnswerRecord, RedisFeedbackStore, pack_path
from proxy.state.outbox import RedisOutbox
from proxy.state.redis_client import RedisOptions
from tests.calibration.test_tune import overconfident
from tests.paths import MODULES, ROOT
from tests.policy.test_loader import MINIMAL
from tests.support.cli import cogproxy as run_cogproxy
from tests.support.redis_db import fresh_db
from tests.support.redis_server import redis_url

REDIS_URL = redis_url(15)
PRICED: dict[str, Any] = {**MINIMAL, "prices": {"p/big": {"input_per_mtok": 10, "output_per_mtok": 30}}}


def cogproxy(*args: str) -> subprocess.CompletedProcess[str]:
    return run_cogproxy("policy", *args)


def answer(module: str, i: int, target: str, confidence: float, decision: str, correct: bool) -> AnswerRecord:
    provider, _, model = target.partition("/")
    return AnswerRecord(
        f"{module}-{i}", module, "exec", "", provider, model, confidence, confidence, "", decision, 0.9, 0.0,
        4e9, verdict="correct" if correct else "incorrect", score=float(correct), verdicts=1,
    )  # fmt: skip


async def store(records: list[AnswerRecord]) -> None:
    outbox = RedisOutbox(RedisOptions(REDIS_URL))
    outbox.start()
    feedback = RedisFeedbackStore(RedisOptions(REDIS_URL), outbox)
    for r in records:
        feedback.remember(r, len(records) + 1)
    await feedback.aclose()
    await outbox.aclose(timeout=30.0)  # delivers them all first


@pytest.fixture
async def module() -> AsyncIterator[str]:
    """A unique module name; its stored answers are deleted afterwards."""
    name = f"tune-{uuid.uuid4().hex[:8]}"
    async with fresh_db(15, match=f"{KEY_PREFIX}{name}-*"):
        yield name


def write_policy(tmp_path: Path, doc: dict[str, Any]) -> str:
    path = tmp_path / "policy.yaml"
    path.write_text(yaml.safe_dump(doc))
    return str(path)


async def test_tune_proposes_the_threshold_the_verdicts_vouch_for(module: str, tmp_path: Path) -> None:
    rng = random.Random(34)
    records = []
    for i in range(2000):
        c = round(rng.uniform(0.5, 1.0), 4)
        records.append(answer(module, i, "p/small", c, "accept", rng.random() < overconfident(c)))
    await store(records)
    policy = write_policy(tmp_path, PRICED)
    args = ["tune", "--policy", policy, "--from", REDIS_URL, "--module", module]
    done = cogproxy(*args, "--target-accuracy", "0.8", "--delta", "0.1")
    assert done.returncode == 0, done.stderr
    proposal = yaml.safe_load(done.stdout)
    threshold = proposal["modules"][module]["min_confidence"]
    assert 0.7 <= threshold <= 0.85  # the population's accepted accuracy is 0.2 + 0.8 t: 0.8 at 0.75
    tuned = parse_policy({**PRICED, **proposal}).thresholds_for(module, "exec")
    assert tuned.min_confidence == threshold and "tiers" not in proposal  # --module: that module only
    lines = done.stdout.splitlines()
    assert f"# module {module} (exec): 2000 verdicts; min_confidence {threshold:g} (now 0.9)" in lines
    accepted = sum(r.confidence >= threshold for r in records)
    wrong = sum(r.confidence >= threshold and r.verdict == "incorrect" for r in records)
    assert f"(Clopper-Pearson, {wrong} wrong of {accepted} accepted)" in done.stdout
    assert f"#   accepted {accepted / 2000:.1%}, escalated or exhausted {1 - accepted / 2000:.1%}" in lines
    # Looser than 0.9 on the bottom rung: escalations to p/big saved (1000 in, 250 out: 0.0175 USD each).
    saved = sum(threshold <= r.confidence < 0.9 for r in records) * 0.0175 * 1000 / 2000
    assert f"#   cost change {-saved:+.4f} USD per 1000 answers at today's prices" in done.stdout

    few = f"{module}-thin"  # 30 answers, all right: 0.95 at delta 0.05 needs 181 accepted to start
    await store([answer(few, i, "p/small", 0.9, "accept", True) for i in range(30)])
    thin = cogproxy(
        "tune", "--policy", policy, "--from", REDIS_URL, "--module", few, "--target-accuracy", "0.95"
    )
    assert thin.returncode == 1 and "too few for accuracy 0.95 with probability 0.95" in thin.stdout
    assert "about 151 more verdicts needed" in thin.stdout and "error: no threshold" in thin.stderr


async def test_simulate_matches_a_hand_computation(module: str, tmp_path: Path) -> None:
    await store(
        [
            answer(module, 1, "p/small", 0.97, "accept", True),  # still accepted
            answer(module, 2, "p/small", 0.92, "accept", True),  # escalates to p/big now
            answer(module, 3, "p/small", 0.91, "accept", False),  # escalates to p/big now
            answer(module, 4, "p/big", 0.93, "escalated", True),  # top rung: rejected now
            answer(module, 5, "p/big", 0.5, "reject", False),  # still rejected
            answer(module, 6, "q/elsewhere", 0.99, "accept", True),  # on no rung of the candidate
        ]
    )
    candidate = write_policy(tmp_path, {**PRICED, "modules": {module: {"min_confidence": 0.95}}})
    done = cogproxy("simulate", "--policy", candidate, "--from", REDIS_URL, "--module", module, "--json")
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert result["answers"] == 5 and result["unplaced"] == 1 and result["changed"] == 3
    assert result["changes"] == [
        {"from": "accept", "to": "escalate", "answers": 2},
        {"from": "accept", "to": "reject", "answers": 1},
    ]
    assert result["cost_delta_usd"] == pytest.approx(2 * (1000 * 10 + 250 * 30) / 1e6)
    stored, new = result["accepted_accuracy"]["stored"], result["accepted_accuracy"]["candidate"]
    assert (stored["accepted"], stored["correct"], new["accepted"], new["correct"]) == (4, 3, 1, 1)
    assert stored["ci95"] == pytest.approx([0.1941204, 0.9936905], abs=1e-6)  # binom.test(3, 4)
    assert new["ci95"] == pytest.approx([0.025, 1.0])

    table = cogproxy("simulate", "--policy", candidate, "--from", REDIS_URL, "--module", module)
    assert table.returncode == 0, table.stderr
    assert "accept -> escalate" in table.stdout and "cost change: +0.0350 USD" in table.stdout
    assert "candidate                 1        1     1.000     0.025..1.000" in table.stdout


def stepped(record: AnswerRecord, risk: str, *earlier: tuple[str, float, str]) -> AnswerRecord:
    """``record`` with its risk and the rungs its call went through before it."""
    return dataclasses.replace(record, risk=risk, path=pack_path(earlier))


async def test_simulate_replays_risk_and_earlier_rungs_as_computed_by_hand(
    module: str, tmp_path: Path
) -> None:
    """exec tier: max_risk low, exhausted reject; the candidate's min_confidence 0.8; p/big's call
    0.0175 USD (1000 in, 250 out at 10/30), p/small's unpriced."""
    await store(
        [
            # p/small 0.85 low now passes: accepted there, the p/big call saved (-0.0175)
            stepped(answer(module, 1, "p/big", 0.9, "escalated", True), "low", ("p/small", 0.85, "low")),
            # p/small's medium risk still escalates; p/big accepts as before
            stepped(answer(module, 2, "p/big", 0.95, "escalated", False), "low", ("p/small", 0.85, "medium")),
            # accepted at medium risk then; escalates now (+0.0175)
            stepped(answer(module, 3, "p/small", 0.9, "accept", True), "medium"),
            # p/small escalates (0.5), p/big's high risk on the top rung: rejected now
            stepped(answer(module, 4, "p/big", 0.85, "escalated", True), "high", ("p/small", 0.5, "low")),
            # a record of 0.4: no risk, no path; 0.82 on p/small still accepted
            dataclasses.replace(answer(module, 5, "p/small", 0.82, "accept", True), path=None),
            # 0.7 < 0.8: escalates now (+0.0175)
            stepped(answer(module, 6, "p/small", 0.7, "accept", False), "low"),
        ]
    )
    candidate = write_policy(tmp_path, {**PRICED, "modules": {module: {"min_confidence": 0.8}}})
    done = cogproxy("simulate", "--policy", candidate, "--from", REDIS_URL, "--module", module, "--json")
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert (result["answers"], result["without_risk"], result["without_path"]) == (6, 1, 1)
    assert (result["with_earlier_rungs"], result["accepted_lower_rung"], result["changed"]) == (3, 1, 4)
    assert result["changes"] == [
        {"from": "accept", "to": "accept_lower", "answers": 1},
        {"from": "accept", "to": "escalate", "answers": 2},
        {"from": "accept", "to": "reject", "answers": 1},
    ]
    assert result["cost_delta_usd"] == pytest.approx((2 - 1) * (1000 * 10 + 250 * 30) / 1e6)
    stored, new = result["accepted_accuracy"]["stored"], result["accepted_accuracy"]["candidate"]
    assert (stored["accepted"], stored["correct"], new["accepted"], new["correct"]) == (6, 4, 2, 1)
    table = cogproxy("simulate", "--policy", candidate, "--from", REDIS_URL, "--module", module)
    assert table.returncode == 0, table.stderr
    lines = table.stdout.splitlines()
    assert "1 stored no risk (older records): decided on confidence alone" in lines
    assert "3 went through earlier rungs the candidate decides again" in lines
    assert any(line.startswith("accept -> accept (lower rung)") and line.endswith(" 1") for line in lines)
    assert any(line.startswith("1 accepted on a lower rung: that answer was never judged") for line in lines)


def test_unreadable_sources_and_bad_arguments_are_reported(tmp_path: Path) -> None:
    policy = write_policy(tmp_path, PRICED)
    down = cogproxy("simulate", "--policy", policy, "--from", "redis://127.0.0.1:9/0")
    assert down.returncode == 2 and down.stderr.startswith("error: Redis at"), down.stderr
    prometheus = cogproxy("simulate", "--policy", policy, "--from", "http://127.0.0.1:9")
    assert prometheus.returncode == 2 and prometheus.stderr.count("\n") == 1  # one line, saying why
    assert "only the Redis records keep; Prometheus keeps counts per confidence bin" in prometheus.stderr
    unreachable = cogproxy(
        "tune", "--policy", policy, "--from", "http://127.0.0.1:9", "--target-accuracy", "0.8"
    )
    assert unreachable.returncode == 2 and unreachable.stderr.startswith("error: Prometheus at"), (
        unreachable.stderr
    )
    bad = cogproxy("tune", "--policy", policy, "--from", REDIS_URL, "--target-accuracy", "1")
    assert bad.returncode == 2 and "outside (0, 1)" in bad.stderr


def test_a_bad_policy_exits_1_from_every_command_that_reads_one(tmp_path: Path) -> None:
    """One status for a refused policy (``PolicyError.EXIT_STATUS``), whichever command reads it."""
    broken = write_policy(tmp_path, {**PRICED, "ladder": []})
    reviewer = str(MODULES / "code-reviewer")
    commands = [
        ["policy", "simulate", "--policy", broken, "--from", REDIS_URL],
        ["policy", "tune", "--policy", broken, "--from", REDIS_URL, "--target-accuracy", "0.8"],
        ["policy", "check", broken],
        ["policy", "explain", "--policy", broken, "--tier", "exec", "--confidence", "0.9", "--risk", "low"],
        ["test", reviewer, "--policy", broken],
    ]
    for args in commands:
        done = subprocess.run(
            [sys.executable, "-m", "proxy", *args],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
            cwd=ROOT,
        )
        assert done.returncode == 1, (args, done.stdout, done.stderr)
        assert "policy.yaml: ladder" in done.stdout + done.stderr, (args, done.stdout, done.stderr)


def test_answer_fields_used_here_exist() -> None:
    names = {f.name for f in dataclasses.fields(AnswerRecord)}
    assert {"confidence", "calibrated", "decision", "verdict", "risk"} <= names
