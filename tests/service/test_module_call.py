"""The module-call service called without HTTP: its inputs are values, its report is data."""

from __future__ import annotations

from typing import Any

from proxy.api.app_keys import CONTEXT_STORE, FEEDBACK, METRICS, REDACT_NAMES, ROUTER, RUNTIME
from proxy.api.limits import LIMITER, CallLimits
from proxy.clients import ANONYMOUS, Caller, ClientIdentity
from proxy.observability.metrics import OUTCOME_DECIDED, OUTCOME_INVALID_INPUT
from proxy.service.module_call import ModuleCall, Requester, Services, answer_module
from proxy.service.runtime import Runtime
from tests.api.test_modules import REVIEW_INPUT, envelope
from tests.fake_upstream import FakeUpstream
from tests.proxy_server import RunningProxy

CALLER = Caller(ANONYMOUS, ClientIdentity())


def _services(proxy: RunningProxy) -> Services:
    app = proxy.app
    return Services(app[METRICS], app[ROUTER], app[CONTEXT_STORE], app[REDACT_NAMES], app[FEEDBACK])


def _call(proxy: RunningProxy, limits: CallLimits, **requester: Any) -> ModuleCall:
    runtime = proxy.app[RUNTIME].current
    assert isinstance(runtime, Runtime)
    module = runtime.registry.modules["code-reviewer"]
    asker = Requester(CALLER, None, "trace-svc-1", **requester)
    return ModuleCall(runtime, module, REVIEW_INPUT, asker, limits)


def _limits(proxy: RunningProxy) -> CallLimits:
    return CallLimits(proxy.app[LIMITER], proxy.app[METRICS], CALLER)


async def test_a_call_answers_and_reports_what_the_log_line_says(
    proxy: RunningProxy, fake_upstream: FakeUpstream
) -> None:
    fake_upstream.script("cheap", envelope(0.95))
    limits = _limits(proxy)
    answered = await answer_module(_call(proxy, limits), _services(proxy))
    answer, report = answered.answer, answered.report
    assert answer.decision == "accept" and answer.envelope["meta"]["trace_id"] == "trace-svc-1"
    assert report.module == "code-reviewer" and report.outcome == OUTCOME_DECIDED
    assert report.fields["decision"] == "accept" and report.fields["confidence"] == 0.95
    assert report.fields["tier"] == answer.module.tier and report.fields["attempts"] == 1
    assert report.fields["target"] == answer.answered_by != ""
    assert report.upstream_s == answer.upstream_s > 0
    assert limits.admitted  # counted against the caller's limits
    remembered = await proxy.app[FEEDBACK].get(CALLER.id, "trace-svc-1")
    assert remembered is not None and remembered.decision == "accept"  # for POST /v1/feedback


async def test_a_bad_session_id_is_the_callers_mistake_before_any_limit_or_model(
    proxy: RunningProxy, fake_upstream: FakeUpstream
) -> None:
    limits = _limits(proxy)
    asked = len(fake_upstream.requests)
    answered = await answer_module(_call(proxy, limits, session="not an id!"), _services(proxy))
    assert answered.answer.envelope["error"]["code"] == "E1001"
    assert answered.answer.envelope["meta"]["trace_id"] == "trace-svc-1"
    assert answered.report.outcome == OUTCOME_INVALID_INPUT and not answered.report.fields
    assert not limits.admitted and len(fake_upstream.requests) == asked
