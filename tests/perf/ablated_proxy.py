"""``cogproxy serve`` with some of its per-request work switched off, for ``bench.py --ablation``.

Usage: ``python tests/perf/ablated_proxy.py PARTS serve ...`` with PARTS a comma-separated subset
of ``ABLATIONS`` (or ``none``). Each part replaces the functions doing that work by no-ops, so
the difference in instructions per request against the whole proxy is what the part costs. A
measuring tool only: an ablated proxy is not a correct proxy (no log line, no breaker...).
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

from proxy.api import chat, middleware
from proxy.observability.metrics import Metrics
from proxy.policy.model import Failover, Target
from proxy.service.instrument import MetricsObserver
from proxy.upstream.breaker import Breakers, Ticket
from proxy.upstream.router import Operation, Routed, Router

ABLATIONS: dict[str, str] = {
    "log": "the request's log line",
    "metrics": "request and upstream-attempt metrics",
    "breaker": "breaker admission and outcome recording",
    "edge": "request-target check, trace id and its binding, browser guard",
    "account": "usage and cost metrics, limit settlement",
    "router": "the retry loop (breakers, tries, attempt metrics): the first target called directly",
}


def _nothing(*args: Any, **kwargs: Any) -> None:
    return None


async def _admit_closed(self: Breakers, target: str, policy: Any, trial_ttl: float) -> Ticket:
    return Ticket("closed", 0)


async def _record_nothing(self: Breakers, *args: Any, **kwargs: Any) -> None:
    return None


def _closed_ticket(self: Breakers, target: str) -> Ticket:
    return Ticket("closed", 0)


def _recorded(self: Breakers, *args: Any) -> bool:
    return True


async def _account_nothing(self: Any, target: Target, usage: Any, output_s: float) -> None:
    return None


async def _first_target(
    self: Router,
    targets: tuple[Target, ...],
    providers: dict[str, Any],
    operation: Operation[Any],
    failover: Failover,
    deadline: float,
    on_try: Callable[..., None],
    **kwargs: Any,
) -> Routed[Any]:
    target = targets[0]
    return Routed(await operation(providers[target.provider], target, failover.timeouts.per_try_s), target)


def _bind_constant(request: Any, record: middleware.RequestRecord, route: str) -> None:
    record.trace_id = "0" * 32


def _replacements() -> dict[str, list[tuple[object, str, object]]]:
    """For each part: (owner, attribute, no-op) to set."""
    return {
        "log": [(middleware, "request_line", _nothing)],
        "metrics": [
            (Metrics, "observe_request", _nothing),
            (Metrics, "observe_upstream", _nothing),
            (MetricsObserver, "attempt", _nothing),  # a named target's attempt skips observe_upstream
        ],
        "breaker": [
            (Breakers, "admit", _admit_closed),
            (Breakers, "record", _record_nothing),
            (Breakers, "admit_closed", _closed_ticket),
            (Breakers, "record_success", _recorded),
        ],
        "edge": [
            (middleware, "check_target_form", _nothing),
            (middleware, "bind_trace", _bind_constant),
            (middleware, "check_headers", _nothing),
        ],
        "account": [(chat._Route, "account", _account_nothing)],
        "router": [(Router, "call", _first_target)],
    }


def ablate(parts: set[str]) -> None:
    unknown = parts - set(ABLATIONS)
    if unknown:
        raise SystemExit(f"unknown ablations {sorted(unknown)}; known: {sorted(ABLATIONS)}")
    replacements = _replacements()
    for part in parts:
        for owner, name, value in replacements[part]:
            setattr(owner, name, value)


def main() -> None:
    parts = {p for p in sys.argv[1].split(",") if p and p != "none"}
    ablate(parts)
    from proxy.cli import main as cli_main

    raise SystemExit(cli_main(sys.argv[2:]))


if __name__ == "__main__":
    main()
