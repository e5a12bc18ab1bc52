"""Which answers the shadow judge takes, and what it compares (``proxy.service.shadow``'s pure
rules); the background judging itself runs in ``tests/test_shadow.py``."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from typing import Any

import pytest

from proxy.contract.errors import Origin
from proxy.module.loader import load_module
from proxy.pipeline import ModuleAnswer
from proxy.policy.loader import parse_policy
from proxy.policy.model import Policy
from proxy.service.shadow import QUIET_S, ClientActivity, disagreements, judge_rung, shadow_limits
from proxy.state.feedback import AnswerRecord
from tests.conftest import MODULES
from tests.policy.test_loader import MINIMAL
from tests.support.polling import until

REVIEWER = load_module(MODULES / "code-reviewer")


def policy(**shadow: Any) -> Policy:
    doc = {
        **MINIMAL,
        "ladder": [
            {"name": "fast", "targets": ["p/a"]},
            {"name": "mid", "targets": ["p/b"]},
            {"name": "top", "targets": ["p/c"]},
        ],
        "feedback": {"shadow": {"rate": 1.0, **shadow}},
        "limits": {"global": {"usd_per_day": 50, "rpm": 10}},
    }
    return parse_policy(doc)


def record(rung: str) -> AnswerRecord:
    return AnswerRecord(
        "t", "code-reviewer", "decision", rung, "p", "a", 0.9, 0.9, "low", "accept", 0.7, 0.0, 1e12
    )


def answer(decision: str = "accept") -> ModuleAnswer:
    return ModuleAnswer(REVIEWER, {"ok": True}, decision, Origin.MODEL)


def test_an_accepted_answer_below_the_judge_rung_is_judged_there() -> None:
    assert judge_rung(policy(), REVIEWER, answer(), record("fast")) == 2  # the top rung by default
    assert judge_rung(policy(judge_rung="mid"), REVIEWER, answer(), record("fast")) == 1


@pytest.mark.parametrize(
    ("shadow", "decision", "rung"),
    [
        ({"judge_rung": "mid"}, "accept", "mid"),  # answered on the judge rung itself
        ({}, "accept", "top"),
        ({}, "escalated", "fast"),  # not accepted where it was first asked
        ({}, "review", "fast"),
        ({"rate": 0}, "accept", "fast"),
        ({"modules": ["code-simplifier"]}, "accept", "fast"),
    ],
)
def test_other_answers_are_not_judged(shadow: dict[str, Any], decision: str, rung: str) -> None:
    assert judge_rung(policy(**shadow), REVIEWER, answer(decision), record(rung)) is None


def test_composites_media_modules_and_unrecorded_answers_are_not_judged() -> None:
    composite = load_module(MODULES / "code-review-pipeline")
    media = load_module(MODULES / "image-describer")
    assert composite.is_composite and media.takes_media
    for module in (composite, media):
        assert judge_rung(policy(), module, replace(answer(), module=module), record("fast")) is None
    assert judge_rung(policy(), REVIEWER, answer(), None) is None


def test_answers_are_compared_on_the_declared_fields_else_the_required_ones() -> None:
    assert REVIEWER.judged_fields == ("verdict",)  # meta.decision_fields
    simplifier = load_module(MODULES / "code-simplifier")
    assert simplifier.judged_fields == tuple(simplifier.data_schema["required"])
    mine = {"verdict": "approve", "summary": "a"}
    assert disagreements(REVIEWER.judged_fields, mine, {**mine, "summary": "b"}) == []
    assert disagreements(REVIEWER.judged_fields, mine, {**mine, "verdict": "comment"}) == ["verdict"]
    assert disagreements(("verdict",), mine, None) == ["verdict"]


def test_the_judge_spends_against_its_own_cap_and_the_global_budgets_only() -> None:
    limits = shadow_limits(policy(budget_usd_per_day=3))
    assert limits.clients["cogproxy-shadow"].usd_per_day == 3
    assert limits.global_ is not None and limits.global_.usd_per_day == 50 and limits.global_.rpm is None


async def test_the_judge_waits_until_no_request_has_been_in_flight_for_the_quiet_period() -> None:
    now = [100.0]
    activity = ClientActivity(clock=lambda: now[0])
    assert activity.until_quiet() == 0.0  # no request ever: quiet
    release = asyncio.Event()

    async def request() -> None:  # a request's task, as the edge counts it
        activity.enter()
        await release.wait()

    task = asyncio.create_task(request())
    await until(lambda: activity.in_flight == 1, "the request counted")
    now[0] += 10 * QUIET_S
    assert activity.until_quiet() == QUIET_S  # in flight: however long it has been
    release.set()
    await task
    await until(lambda: activity.in_flight == 0, "the request's end counted")
    assert activity.until_quiet() == pytest.approx(QUIET_S)
    now[0] += QUIET_S / 2
    assert activity.until_quiet() == pytest.approx(QUIET_S / 2)
    now[0] += QUIET_S / 2
    assert activity.until_quiet() == 0.0
    await activity.idle()  # returns at once: quiet
