"""The edge of the limits: who the caller is, 429s, ``x-ratelimit-*`` headers, ``/v1/usage``."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime, timedelta
from functools import partial
from typing import Any

import orjson
from aiohttp import web

from proxy.api.app_keys import METRICS, SETTINGS, runtime_of
from proxy.api.errors import ApiError, json_response, retry_after_value
from proxy.api.middleware import RECORD_KEY, RequestRecord
from proxy.clients import Caller
from proxy.context.prefetch import Prefetched
from proxy.context.store import Mark
from proxy.contract.inputs import estimate_tokens
from proxy.limits.limiter import Admission, Limiter, ratelimit_headers
from proxy.observability.metrics import Metrics
from proxy.policy.model import Policy

__all__ = ["LIMITER", "Limiter"]

LIMITER = web.AppKey("quota", Limiter)
"""Set by ``admit`` on every request it sees (None without active limits), so ``settle`` reads it
without ``request.get``'s exception for a missing key."""
BYTES_PER_TOKEN = 4
"""The passthrough's token estimate: JSON bytes / 4 (OpenAI's rule of thumb for English)."""


def caller(request: web.Request) -> Caller:
    return request[RECORD_KEY].caller


def estimate_body_tokens(body: dict[str, Any]) -> int:
    """Input tokens of a chat body (its messages) plus the output it asks for at most."""
    try:
        size = len(orjson.dumps(body.get("messages"))) // BYTES_PER_TOKEN
    except TypeError:  # orjson.JSONEncodeError: nesting beyond its recursion limit
        size = 0  # the provider refuses such a body; the request window still counts it
    out = body.get("max_completion_tokens") or body.get("max_tokens")
    return size + (out if isinstance(out, int) and not isinstance(out, bool) and out > 0 else 0)


def estimate_input_tokens(value: Any) -> int:
    """A module input's token estimate; 0 for one too deep to serialise (the input check refuses
    it, E1001, before any model call)."""
    try:
        return estimate_tokens(value)
    except (TypeError, ValueError):  # orjson.JSONEncodeError: nesting beyond its recursion limit
        return 0


async def admit(
    request: web.Request, policy: Policy, estimate: Callable[[], int], *, downgradable: bool
) -> int | None:
    """Count the request against its limits (``estimate``: its tokens, asked only when limits are
    configured); raise the 429 when it does not fit. Returns the rung a downgraded module call is
    capped at (over budget with ``on_budget: downgrade``)."""

    if not policy.limits.active:  # the default: no admission to keep, nothing to read
        return None
    record = request[RECORD_KEY]

    def keep(admission: Admission | None) -> None:
        record.admission = admission

    app = request.app  # a property: read once
    return await _admit(app[LIMITER], app[METRICS], policy, caller(request), estimate, keep, downgradable)


async def _admit(
    quota: Limiter,
    metrics: Metrics,
    policy: Policy,
    who: Caller,
    estimate: Callable[[], int],
    keep: Callable[[Admission | None], None],
    downgradable: bool,
    reads: Sequence[str] = (),
    mark: Mark | None = None,
) -> int | None:
    """``admit`` without the request: ``keep`` receives the admission before any 429 is raised."""
    limits = policy.limits
    if not limits.active:
        keep(None)
        return None
    admission = await quota.admit(limits, who, estimate(), reads=reads, mark=mark)
    keep(admission)
    refused = admission.refused
    if refused is not None:
        metrics.limited.labels(refused.scope, refused.kind, who.label).inc()
        raise ApiError(
            429,
            f"Rate limit reached for {refused.kind} ({refused.scope} limit {refused.window.limit} per "
            f"{limits.window_s}s); retry after the reset",
            "rate_limit_error" if refused.kind == "requests" else "tokens",
            "rate_limit_exceeded",
            headers={
                **ratelimit_headers(admission),
                "Retry-After": retry_after_value(admission.retry_after_s()),
            },
        )
    budget = admission.over_budget
    if budget is None:
        return None
    if limits.on_budget == "downgrade" and downgradable:
        return policy.rung_index(limits.downgrade_to) if limits.downgrade_to else 0
    metrics.limited.labels(budget.scope, f"budget_{budget.period}", who.label).inc()
    raise ApiError(
        429,
        f"Spend budget reached ({budget.scope} {budget.period}: ${budget.spent_usd:.4f} of "
        f"${budget.limit_usd:.4f})",
        "insufficient_quota",
        "budget_exceeded",
        headers={
            **ratelimit_headers(admission),
            "Retry-After": retry_after_value(_to_period_end(budget.period)),
        },
    )


def _to_period_end(period: str) -> float:
    now = datetime.now(UTC)
    if period == "day":
        end = (now + timedelta(days=1)).replace(hour=0, minute=0, second=0, microsecond=0)
    else:
        first = now.replace(day=1, hour=0, minute=0, second=0, microsecond=0)
        end = (first + timedelta(days=32)).replace(day=1)
    return (end - now).total_seconds()


class CallLimits:
    """The limits of one module call, for the module-call service (``proxy.service.module_call.
    Limits``): admitted once (a streamed call before its stream starts, a 429 still being an HTTP
    answer; its producer reuses the verdict), settled with what it spent. Holds the quota and the
    caller, not the request: the edge copies ``admission`` into the request (``keep_admission``)."""

    def __init__(self, quota: Limiter, metrics: Metrics, who: Caller) -> None:
        self._quota, self._metrics, self._who = quota, metrics, who
        self.admitted = False
        self.admission: Admission | None = None
        self.prefetched: Prefetched | None = None
        self._rung: int | None = None

    @classmethod
    def of(cls, request: web.Request) -> CallLimits:
        return cls(request.app[LIMITER], request.app[METRICS], caller(request))

    def _keep(self, admission: Admission | None) -> None:
        self.admitted, self.admission = True, admission

    async def admit(
        self,
        policy: Policy,
        value: Any,
        reads: Sequence[str] = (),
        pending: Mapping[str, bytes] | None = None,
        mark: Mark | None = None,
    ) -> int | None:
        """Admit the call once; ``reads``: keys the limiter reads in the check's round trip (with
        ``mark``, the session call's pending-write mark), kept with ``pending`` (the writes they
        may not see) as ``prefetched``, for this call's run (a streamed call is admitted at the
        edge and run by its producer)."""
        if not self.admitted:
            estimate = partial(estimate_input_tokens, value)
            self._rung = await _admit(
                self._quota, self._metrics, policy, self._who, estimate, self._keep, True, reads, mark
            )
            read = None if self.admission is None else self.admission.read
            if reads and read is not None:
                self.prefetched = Prefetched(tuple(reads), read, dict(pending or {}), mark)
        return self._rung

    def settle(self, tokens: int, cost_usd: float) -> None:
        """Settle in the background: the answer does not wait on Redis for it."""
        if self.admission is not None:
            self._quota.settle_later(self.admission, tokens, cost_usd)

    def keep_admission(self, request: web.Request) -> None:
        """The request's admission, for its ``x-ratelimit-*`` headers (``add_ratelimit_headers``)."""
        if self.admitted:
            request[RECORD_KEY].admission = self.admission


async def count_request(request: web.Request) -> None:
    """A passthrough route whose usage the proxy does not read (embeddings, files, Responses):
    it counts against the request windows and the budgets, not the token windows."""
    await admit(request, runtime_of(request).policy, lambda: 0, downgradable=False)


def settle(request: web.Request, tokens: int, cost_usd: float) -> None:
    """Settle what the request spent against the limits ``admit`` counted it in, in the background
    (the answer does not wait on Redis for it; the limiter awaits it at shutdown)."""
    admission = request[RECORD_KEY].admission
    if admission is not None:
        request.app[LIMITER].settle_later(admission, tokens, cost_usd)


def add_ratelimit_headers(record: RequestRecord, response: web.StreamResponse) -> None:
    """Called as an answer is prepared (``proxy.api.edge_request``) with the request's record:
    every answer to an admitted request tells its windows (in place of a provider's: the client
    is held to the proxy's limits, the provider's are the proxy's own account's)."""
    if record.admission is not None:
        response.headers.update(ratelimit_headers(record.admission))


async def usage(request: web.Request) -> web.Response:
    """``GET /v1/usage?client=NAME`` (an admin route: ``proxy.api.routes``): the client's windows
    and spend, read without counting."""
    name = request.query.get("client", "").strip()
    if not name:
        raise ApiError(400, "Name the client: /v1/usage?client=NAME", param="client", code="missing_client")
    identities = request.app[SETTINGS].client_identities
    identity = next((i for i in identities.values() if i.name == name), None)
    if identity is None:
        raise ApiError(
            404, f"No client named {name!r} in the keys file", param="client", code="client_not_found"
        )
    policy = runtime_of(request).policy
    admission = await request.app[LIMITER].admit(policy.limits, Caller(name, identity), 0, count=False)
    return json_response(
        {
            "object": "usage",
            "client": name,
            "team": identity.team,
            "window_s": policy.limits.window_s,
            "windows": [
                {
                    "scope": w.scope,
                    "kind": w.kind,
                    "limit": w.window.limit,
                    "remaining": w.state.remaining,
                    "reset_s": round(w.state.reset_s, 3),
                }
                for w in admission.windows
            ],
            "budgets": [
                {
                    "scope": b.scope,
                    "period": b.period,
                    "limit_usd": b.limit_usd,
                    "spent_usd": b.spent_usd,
                    "exceeded": b.exceeded,
                }
                for b in admission.budgets
            ],
            "degraded": request.app[LIMITER].degraded,
        }
    )
