"""The policy's ``prices:`` and ``limits:`` as frozen values, and their parsing."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Literal

from proxy.jsonshape import as_dict

OnBudget = Literal["reject", "downgrade"]
MTOK = 1_000_000


@dataclass(frozen=True, slots=True)
class Price:
    """USD per million tokens of one target."""

    input_per_mtok: float = 0.0
    output_per_mtok: float = 0.0
    cached_input_per_mtok: float | None = None
    """None: cached input tokens cost as much as other input tokens."""

    def cost(self, usage: Mapping[str, Any]) -> float:
        """USD of one answer's usage (OpenAI ``prompt_tokens``/``completion_tokens`` with
        ``prompt_tokens_details.cached_tokens``, or the Responses/Anthropic input/output names)."""
        prompt = _count(usage, "prompt_tokens", "input_tokens")
        completion = _count(usage, "completion_tokens", "output_tokens")
        details = as_dict(usage.get("prompt_tokens_details") or usage.get("input_tokens_details"))
        cached = min(prompt, _count(details, "cached_tokens"))
        cached_price = (
            self.input_per_mtok if self.cached_input_per_mtok is None else self.cached_input_per_mtok
        )
        return (
            (prompt - cached) * self.input_per_mtok
            + cached * cached_price
            + completion * self.output_per_mtok
        ) / MTOK


def _count(usage: Mapping[str, Any], *names: str) -> int:
    for name in names:
        value = usage.get(name)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return 0


@dataclass(frozen=True, slots=True)
class LimitSpec:
    """One scope's limits; None: no limit of that kind."""

    rpm: int | None = None
    """Requests per window (``limits.window_s``, a minute by default)."""
    tpm: int | None = None
    """Tokens (input + output) per window: reserved by an estimate, corrected after the answer."""
    usd_per_day: float | None = None
    usd_per_month: float | None = None
    """Spend budgets per UTC calendar day and month, from ``prices`` x usage."""


@dataclass(frozen=True, slots=True)
class LimitsPolicy:
    clients: Mapping[str, LimitSpec] = field(default_factory=dict)
    """By client name (the keys file's ``name=``); ``default`` applies to every client not listed."""
    teams: Mapping[str, LimitSpec] = field(default_factory=dict)
    """By team (the keys file's ``team=``); ``default`` applies to every team not listed."""
    global_: LimitSpec | None = None
    """All clients of all replicas together."""
    window_s: int = 60
    """The sliding window of ``rpm`` and ``tpm``."""
    on_budget: OnBudget = "reject"
    """Over a spend budget: 429 ``budget_exceeded``, or ``downgrade`` module calls to ``downgrade_to``."""
    downgrade_to: str | None = None
    """The rung a downgraded module call starts on and is capped at (None: the first rung)."""

    @property
    def active(self) -> bool:
        return bool(self.clients or self.teams or self.global_)

    def for_client(self, name: str) -> LimitSpec | None:
        return self.clients.get(name) or self.clients.get("default")

    def for_team(self, team: str | None) -> LimitSpec | None:
        if team is None:
            return None
        return self.teams.get(team) or self.teams.get("default")


def _spec(raw: dict[str, Any]) -> LimitSpec:
    def number(name: str) -> float | None:
        value = raw.get(name)
        return None if value is None else float(value)

    rpm, tpm = raw.get("rpm"), raw.get("tpm")
    return LimitSpec(
        None if rpm is None else int(rpm),
        None if tpm is None else int(tpm),
        number("usd_per_day"),
        number("usd_per_month"),
    )


def parse_prices(raw: dict[str, Any]) -> Mapping[str, Price]:
    defaults = Price()
    return MappingProxyType(
        {
            target: Price(
                float(p.get("input_per_mtok", defaults.input_per_mtok)),
                float(p.get("output_per_mtok", defaults.output_per_mtok)),
                None if p.get("cached_input_per_mtok") is None else float(p["cached_input_per_mtok"]),
            )
            for target, p in raw.items()
        }
    )


def parse_limits(raw: dict[str, Any]) -> LimitsPolicy:
    defaults = LimitsPolicy()
    glob = raw.get("global")
    return LimitsPolicy(
        clients=MappingProxyType({k: _spec(as_dict(v)) for k, v in as_dict(raw.get("clients")).items()}),
        teams=MappingProxyType({k: _spec(as_dict(v)) for k, v in as_dict(raw.get("teams")).items()}),
        global_=None if glob is None else _spec(as_dict(glob)),
        window_s=int(raw.get("window_s", defaults.window_s)),
        on_budget=raw.get("on_budget", defaults.on_budget),
        downgrade_to=raw.get("downgrade_to"),
    )


def cross_check(doc: dict[str, Any], rung_names: list[str]) -> list[str]:
    """Problems the schema cannot see: prices of unknown providers, an unknown downgrade rung."""
    problems = []
    providers = as_dict(doc.get("providers"))
    for target in as_dict(doc.get("prices")):
        if target.split("/", 1)[0] not in providers:
            problems.append(f"prices.{target}: unknown provider {target.split('/', 1)[0]!r}")
    rung = as_dict(doc.get("limits")).get("downgrade_to")
    if rung is not None and rung not in rung_names:
        problems.append(f"limits.downgrade_to: no rung named {rung!r}")
    return problems
