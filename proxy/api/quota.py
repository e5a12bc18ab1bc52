"""The edge of the limits: who the caller is, 429s, ``x-ratelimit-*`` headers, ``/v1/usage``."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from functools import partial
from typing import Any

import orjson
from aiohttp import web

from proxy.api.errors import ApiError, json_response, retry_after_value
from proxy.api.middleware import CALLER
from proxy.api.state import METRICS, SETTINGS, runtime_of
from proxy.clients import Caller
from proxy.contract.inputs import estimate_tokens
from proxy.policy.model import Policy
from proxy.quota.service import Admission, Quota, ratelimit_headers

__all__ = ["QUOTA", "Quota"]

QUOTA = web.AppKey("quota", Quota)
ADMISSION = web.RequestKey[Admission | None]("admission")
"""Set by ``admit`` on every request it sees (None without active limits), so ``settle`` reads it
without ``request.get``'s exception for a missing key."""
BYTES_PER_TOKEN = 4
"""The passthrough's token estimate: JSON bytes / 4 (OpenAI's rule of thumb for English)."""


def caller(request: web.Request) -> Caller:
    return request[CALLER]


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
    limits = policy.limits
    if not limits.active:
        request[ADMISSION] = None
        return None
    who = caller(request)
    admission = await request.app[QUOTA].admit(limits, who, estimate())
    request[ADMISSION] = admission
    metrics = request.app[METRICS]
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


@dataclass(frozen=True, slots=True)
class Cap:
    rung: int | None
    """The rung a downgraded module call is capped at; None: the whole ladder."""


CAP = web.RequestKey("ladder_cap", Cap)


async def admit_module(request: web.Request, policy: Policy, value: Any) -> int | None:
    """``admit`` for a module call, once per request: a streamed call is admitted before its
    stream starts (a 429 is still an HTTP answer), and its producer reuses the verdict."""
    cap = request.get(CAP)
    if cap is None:
        rung = await admit(request, policy, partial(estimate_input_tokens, value), downgradable=True)
        cap = request[CAP] = Cap(rung)
    return cap.rung


async def count_request(request: web.Request) -> None:
    """A passthrough route whose usage the proxy does not read (embeddings, files, Responses):
    it counts against the request windows and the budgets, not the token windows."""
    await admit(request, runtime_of(request).policy, lambda: 0, downgradable=False)


async def settle(request: web.Request, tokens: int, cost_usd: float) -> None:
    """Settle what the request spent against the limits ``admit`` counted it in."""
    admission = request[ADMISSION]
    if admission is not None:
        await request.app[QUOTA].settle(admission, tokens, cost_usd)


def add_ratelimit_headers(request: web.Request, response: web.StreamResponse) -> None:
    """Called on ``on_response_prepare``: every answer to an admitted request tells its windows (in
    place of a provider's: the client is held to the proxy's limits, the provider's are the
    proxy's own account's)."""
    admission = request.get(ADMISSION)
    if admission is not None:
        response.headers.update(ratelimit_headers(admission))


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
    admission = await request.app[QUOTA].admit(policy.limits, Caller(name, identity), 0, count=False)
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
            "degraded": request.app[QUOTA].degraded,
        }
    )
