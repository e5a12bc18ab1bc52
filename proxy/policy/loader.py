"""Policy YAML -> ``Policy``, validated against the shipped JSON Schema.

A bad file is refused with ``path.to.key: problem``; nothing half-loaded is ever returned.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable, Iterator, Mapping
from dataclasses import fields
from functools import cache
from pathlib import Path
from types import MappingProxyType
from typing import Any

import structlog
import yaml
from yarl import URL

from proxy import schemas
from proxy.json_schema import Validator, check, compile_schema
from proxy.jsonshape import as_dict
from proxy.policy.calibration import parse_map, points_problems
from proxy.policy.limits import cross_check as limits_checks
from proxy.policy.limits import parse_limits, parse_prices
from proxy.policy.model import (
    Backoff,
    BreakerPolicy,
    CachePolicy,
    CacheRule,
    Failover,
    FeedbackPolicy,
    MediaPolicy,
    PassthroughPolicy,
    PassthroughRoute,
    Policy,
    ProviderConfig,
    RetryBudget,
    ReviewPolicy,
    Rung,
    ShadowPolicy,
    Target,
    Thresholds,
    Timeouts,
)
from proxy.policy.provider_kinds import PROVIDER_KINDS, kinds_with
from proxy.textfile import UnreadableFile, read_small_text
from proxy.yamlerrors import describe

_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
log = structlog.get_logger("proxy.policy")

MAX_POLICY_BYTES = 1024 * 1024
"""A policy is parsed on the event loop (hot reload): 1 MiB parses in well under a second, and
the shipped policies are a few KB. Anything larger is refused unread."""

# Used when a policy has no `tiers:` block, and for tiers it leaves out.
DEFAULT_TIERS: dict[str, dict[str, Any]] = {
    "exec": {"min_confidence": 0.9, "max_risk": "low", "exhausted": "reject"},
    "decision": {"min_confidence": 0.7, "max_risk": "medium", "exhausted": "review"},
    "exploration": {"min_confidence": 0.3, "max_risk": "high", "exhausted": "accept"},
}


class PolicyError(ValueError):
    """A policy that cannot be used; the message lists each problem as ``path.to.key: problem``."""

    EXIT_STATUS = 1
    """What a command that reads a policy (``policy check``, ``explain``, ``tune``, ``simulate``,
    ``test --policy``) exits with when it refuses one; ``serve`` exits 2, as for every start-up
    error (docs/cli.md)."""

    def __init__(self, source: str, problems: list[str]) -> None:
        super().__init__(f"{source}: " + "; ".join(problems))
        self.source = source
        self.problems = problems


@cache
def policy_schema() -> dict[str, Any]:
    """The shipped policy schema, completed with what is written once elsewhere: ``PROVIDER_KINDS``'s
    names as the ``kind`` enum, and a module's override (``definitions.override``) as the tier
    entry's properties, none required (a tier field is written in ``definitions.tier`` only)."""
    schema = copy.deepcopy(schemas.load("policy.schema.json"))
    schema["properties"]["providers"]["additionalProperties"]["properties"]["kind"]["enum"] = list(
        PROVIDER_KINDS
    )
    definitions = schema["definitions"]
    definitions["override"] = {
        "type": "object",
        "additionalProperties": False,
        "minProperties": 1,
        "description": "A module's own values for fields of its tier's entry (definitions.tier).",
        "properties": {
            name: {k: v for k, v in prop.items() if k != "default"}
            for name, prop in definitions["tier"]["properties"].items()
        },
    }
    return schema


@cache
def _validator() -> Validator:
    return compile_schema(policy_schema())


_DECLARED: Mapping[str, Callable[[Any], Any]] = {"float": float, "int": int}
"""A tier field's declared type -> the conversion of its validated value (YAML's ``1`` for a float,
``1.0`` for an integer: the schema's ``integer`` admits it)."""


def _tier_values(raw: Mapping[str, Any]) -> dict[str, Any]:
    """The ``Thresholds`` fields a tier entry or a module override names, as their declared types."""
    return {
        f.name: _DECLARED.get(str(f.type), _as_is)(raw[f.name]) for f in fields(Thresholds) if f.name in raw
    }


def _as_is(value: Any) -> Any:
    return value


def _thresholds(raw: Mapping[str, Any]) -> Thresholds:
    """A tier entry, validated by the schema, as ``Thresholds``: every field the entry names, the
    others at their defaults."""
    return Thresholds(**_tier_values(raw))


def _breaker(raw: dict[str, Any], source: str) -> BreakerPolicy:
    defaults = BreakerPolicy()
    consecutive = raw.get("consecutive_failures")
    if "failures" in raw:  # removed key (count breaker); its meaning lives on under the new name
        log.warning(
            "proxy.policy_deprecated_key",
            source=source,
            key="failover.circuit_breaker.failures",
            use="failover.circuit_breaker.consecutive_failures",
        )
        consecutive = raw["failures"]
    return BreakerPolicy(
        failure_rate=float(raw.get("failure_rate", defaults.failure_rate)),
        min_requests=int(raw.get("min_requests", defaults.min_requests)),
        window_s=float(raw.get("window_s", defaults.window_s)),
        open_s=float(raw.get("open_s", defaults.open_s)),
        consecutive_failures=None if consecutive is None else int(consecutive),
        half_open_requests=int(raw.get("half_open_requests", defaults.half_open_requests)),
    )


def _timeouts(raw: dict[str, Any]) -> Timeouts:
    defaults = Timeouts()

    def optional(name: str) -> float | None:
        value = raw.get(name)
        return None if value is None else float(value)

    return Timeouts(
        float(raw.get("per_try_s", defaults.per_try_s)),
        float(raw.get("total_s", defaults.total_s)),
        optional("stream_idle_s"),
        optional("stream_total_s"),
    )


def _failover(raw: dict[str, Any], source: str) -> Failover:
    timeout = as_dict(raw.get("timeout"))
    backoff = as_dict(raw.get("backoff"))
    budget = as_dict(raw.get("retry_budget"))
    defaults = Failover()
    return Failover(
        retries=int(raw.get("retries", defaults.retries)),
        retry_on=frozenset(raw.get("retry_on", defaults.retry_on)),
        backoff=Backoff(
            float(backoff.get("base_ms", defaults.backoff.base_ms)),
            float(backoff.get("max_ms", defaults.backoff.max_ms)),
        ),
        timeouts=_timeouts(timeout),
        breaker=_breaker(as_dict(raw.get("circuit_breaker")), source),
        budget=RetryBudget(
            float(budget.get("percent", defaults.budget.percent)),
            int(budget.get("min_concurrency", defaults.budget.min_concurrency)),
            int(budget.get("min_per_target", defaults.budget.min_per_target)),
        ),
    )


def _provider(name: str, raw: dict[str, Any]) -> ProviderConfig:
    defaults = ProviderConfig(name, raw["kind"])
    return ProviderConfig(
        name=name,
        kind=raw["kind"],
        base_url=raw.get("base_url", defaults.base_url).rstrip("/"),
        api_key_env=raw.get("api_key_env", defaults.api_key_env),
        forward_client_key=raw.get("forward_client_key", defaults.forward_client_key),
        allow_any_model=raw.get("allow_any_model", defaults.allow_any_model),
        headers=MappingProxyType(dict(raw.get("headers", defaults.headers))),
        options=MappingProxyType(dict(raw.get("options", defaults.options))),
    )


def _passthrough(raw: dict[str, Any], providers: dict[str, Any]) -> PassthroughPolicy:
    default = raw.get("provider") or next(
        (n for n, p in providers.items() if PROVIDER_KINDS[p["kind"]].default_passthrough), None
    )
    routes = tuple(PassthroughRoute(r["prefix"], tuple(r["providers"])) for r in raw.get("routes", ()))
    return PassthroughPolicy(default, routes)


def _review(raw: dict[str, Any]) -> ReviewPolicy:
    defaults = ReviewPolicy()
    return ReviewPolicy(
        sink=raw.get("sink", defaults.sink),
        stream=str(raw.get("stream", defaults.stream)),
        maxlen=int(raw.get("maxlen", defaults.maxlen)),
        url=raw.get("url"),
        timeout_s=float(raw.get("timeout_s", defaults.timeout_s)),
        retries=int(raw.get("retries", defaults.retries)),
    )


def _feedback(raw: dict[str, Any]) -> FeedbackPolicy:
    defaults = FeedbackPolicy()
    return FeedbackPolicy(
        window_s=float(raw.get("window_s", defaults.window_s)),
        max_entries=int(raw.get("max_entries", defaults.max_entries)),
        max_per_day=int(raw.get("max_per_day", defaults.max_per_day)),
        shadow=_shadow(as_dict(raw.get("shadow"))),
    )


def _shadow(raw: dict[str, Any]) -> ShadowPolicy:
    defaults = ShadowPolicy()
    return ShadowPolicy(
        rate=float(raw.get("rate", defaults.rate)),
        judge_rung=raw.get("judge_rung", defaults.judge_rung),
        seed=raw.get("seed", defaults.seed),
        budget_usd_per_day=float(raw.get("budget_usd_per_day", defaults.budget_usd_per_day)),
        modules=tuple(raw.get("modules", defaults.modules)),
    )


def _base_url_problems(base_url: str) -> list[str]:
    """A base URL names a host and a path only: credentials belong in ``api_key_env`` (userinfo
    would be quoted in error texts, and aiohttp refuses it beside an ``Authorization`` header),
    a query in ``options.query``."""
    try:
        url = URL(base_url)
    except ValueError as exc:
        return [f"not a URL ({exc})"]
    problems = []
    if not url.host:
        problems.append("names no host")
    if url.raw_user is not None or url.raw_password is not None:
        problems.append("must not carry credentials (user:password@); put the key in api_key_env")
    if url.raw_query_string or url.raw_fragment or "?" in base_url or "#" in base_url:
        problems.append("must not carry a query or fragment; use options.query")
    return problems


def _cache_rule(raw: dict[str, Any]) -> CacheRule:
    defaults = CacheRule()
    return CacheRule(
        ttl_s=int(raw.get("ttl_s", defaults.ttl_s)),
        only_decisions=frozenset(raw.get("only_decisions", defaults.only_decisions)),
    )


def _cache(raw: dict[str, Any]) -> CachePolicy:
    defaults = CachePolicy()
    return CachePolicy(
        tiers=MappingProxyType({k: _cache_rule(v) for k, v in as_dict(raw.get("tiers")).items()}),
        modules=MappingProxyType({k: _cache_rule(v) for k, v in as_dict(raw.get("modules")).items()}),
        client_max_entries=int(raw.get("client_max_entries", defaults.client_max_entries)),
        client_max_bytes=int(raw.get("client_max_bytes", defaults.client_max_bytes)),
    )


def _media(raw: dict[str, Any]) -> MediaPolicy:
    defaults = MediaPolicy()
    return MediaPolicy(
        allow_http=bool(raw.get("allow_http", defaults.allow_http)),
        allowed_hosts=tuple(raw.get("allowed_hosts", defaults.allowed_hosts)),
        trusted_hosts=tuple(raw.get("trusted_hosts", defaults.trusted_hosts)),
        max_redirects=int(raw.get("max_redirects", defaults.max_redirects)),
        fetch_timeout_s=float(raw.get("fetch_timeout_s", defaults.fetch_timeout_s)),
        strip_metadata=bool(raw.get("strip_metadata", defaults.strip_metadata)),
        cache_max_bytes=int(raw.get("cache_max_bytes", defaults.cache_max_bytes)),
        cache_ttl_s=float(raw.get("cache_ttl_s", defaults.cache_ttl_s)),
    )


_PASSTHROUGH_KINDS = (
    f"passthrough needs kind {' or '.join(kinds_with('forward'))} "
    f"(or {' or '.join(kinds_with('local'))}, for demos)"
)


def _non_finite(value: Any, path: str) -> Iterator[str]:
    """Where the document holds ``.nan`` or ``.inf``: no threshold, price or limit means one (a NaN
    ``min_confidence`` passes ``minimum``/``maximum`` and sends every answer to review)."""
    if isinstance(value, float) and not math.isfinite(value):
        yield f"{path}: must be a finite number, not {value}"
    elif isinstance(value, dict):
        for key, item in value.items():
            yield from _non_finite(item, f"{path}.{key}" if path else str(key))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            yield from _non_finite(item, f"{path}[{index}]")


def _cross_checks(doc: dict[str, Any]) -> list[str]:
    problems = list(_non_finite(doc, ""))
    providers = as_dict(doc.get("providers"))
    rung_names = [r["name"] for r in doc["ladder"]]
    for i, rung in enumerate(doc["ladder"]):
        if rung_names.count(rung["name"]) > 1:
            problems.append(f"ladder[{i}].name: duplicate rung {rung['name']!r}")
        for j, target in enumerate(rung["targets"]):
            provider = target.split("/", 1)[0]
            if provider not in providers:
                problems.append(f"ladder[{i}].targets[{j}]: unknown provider {provider!r}")
    for name, provider in providers.items():
        if PROVIDER_KINDS[provider["kind"]].base_url_required and "base_url" not in provider:
            problems.append(f"providers.{name}.base_url: required for kind {provider['kind']}")
        elif "base_url" in provider:
            problems += [f"providers.{name}.base_url: {p}" for p in _base_url_problems(provider["base_url"])]
    for section in ("tiers", "modules"):
        for name, entry in as_dict(doc.get(section)).items():
            start = entry.get("start")
            if start is not None and start not in rung_names:
                problems.append(f"{section}.{name}.start: no rung named {start!r}")
    passthrough = as_dict(doc.get("passthrough"))
    named = [("passthrough.provider", passthrough["provider"])] if "provider" in passthrough else []
    for i, route in enumerate(passthrough.get("routes", ())):
        named += [(f"passthrough.routes[{i}].providers[{j}]", n) for j, n in enumerate(route["providers"])]
    for where, name in named:
        if name not in providers:
            problems.append(f"{where}: unknown provider {name!r}")
        elif PROVIDER_KINDS[providers[name]["kind"]].passthrough is None:
            problems.append(f"{where}: {name!r} is kind {providers[name]['kind']}; {_PASSTHROUGH_KINDS}")
    review = as_dict(doc.get("review"))
    if review.get("sink") == "webhook" and "url" not in review:
        problems.append("review.url: required when review.sink is webhook")
    breaker = as_dict(as_dict(doc.get("failover")).get("circuit_breaker"))
    if "failures" in breaker and "consecutive_failures" in breaker:
        problems.append(
            "failover.circuit_breaker.failures: removed; it is consecutive_failures now (give only that)"
        )
    timeout = as_dict(as_dict(doc.get("failover")).get("timeout"))
    defaults = Timeouts()
    if timeout.get("per_try_s", defaults.per_try_s) > timeout.get("total_s", defaults.total_s):
        problems.append("failover.timeout.per_try_s: larger than total_s (total_s bounds every try)")
    for target, entry in as_dict(doc.get("calibration")).items():
        if target.split("/", 1)[0] not in providers:
            problems.append(f"calibration.{target}: unknown provider {target.split('/', 1)[0]!r}")
        problems += [f"calibration.{target}.{p}" for p in points_problems(entry.get("points", []))]
    for key in as_dict(doc.get("modalities")):
        if key.split("/", 1)[0] not in providers:
            problems.append(f"modalities.{key}: unknown provider {key.split('/', 1)[0]!r}")
    for key in as_dict(doc.get("capabilities")):
        if key.split("/", 1)[0] not in providers:
            problems.append(f"capabilities.{key}: unknown provider {key.split('/', 1)[0]!r}")
    judge = as_dict(as_dict(as_dict(doc.get("feedback")).get("shadow"))).get("judge_rung")
    if judge is not None and judge not in rung_names:
        problems.append(f"feedback.shadow.judge_rung: no rung named {judge!r}")
    for alias, target in as_dict(doc.get("aliases")).items():
        if target not in rung_names and target.split("/", 1)[0] not in providers:
            problems.append(f"aliases.{alias}: {target!r} is neither a rung nor provider/model")
    return problems


def parse_policy(doc: Any, source: str = "<memory>") -> Policy:
    """Validate a parsed YAML document and build the ``Policy``; raise ``PolicyError``."""
    violations = check(_validator(), doc, "")
    if violations:
        raise PolicyError(source, [str(v) for v in violations])
    problems = _cross_checks(doc) + limits_checks(doc, [r["name"] for r in doc["ladder"]])
    if problems:
        raise PolicyError(source, problems)
    providers = {name: _provider(name, raw) for name, raw in doc["providers"].items()}
    ladder = tuple(
        Rung(r["name"], tuple(Target(*t.split("/", 1)) for t in r["targets"])) for r in doc["ladder"]
    )
    tiers = {
        name: _thresholds({**DEFAULT_TIERS[name], **as_dict(doc.get("tiers")).get(name, {})})
        for name in DEFAULT_TIERS
    }
    return Policy(
        providers=MappingProxyType(providers),
        ladder=ladder,
        tiers=MappingProxyType(tiers),
        modules=MappingProxyType(
            {k: MappingProxyType(_tier_values(v)) for k, v in as_dict(doc.get("modules")).items()}
        ),
        aliases=MappingProxyType(dict(as_dict(doc.get("aliases")))),
        known_targets=frozenset(
            [str(t) for rung in ladder for t in rung.targets]
            + [a for a in as_dict(doc.get("aliases")).values() if "/" in a]
        ),
        failover=_failover(as_dict(doc.get("failover")), source),
        review=_review(as_dict(doc.get("review"))),
        passthrough=_passthrough(as_dict(doc.get("passthrough")), doc["providers"]),
        cache=_cache(as_dict(doc.get("cache"))),
        media=_media(as_dict(doc.get("media"))),
        modalities=MappingProxyType({k: frozenset(v) for k, v in as_dict(doc.get("modalities")).items()}),
        capabilities=MappingProxyType(
            {key: frozenset(value) for key, value in as_dict(doc.get("capabilities")).items()}
        ),
        source=source,
        prices=parse_prices(as_dict(doc.get("prices"))),
        limits=parse_limits(as_dict(doc.get("limits"))),
        calibration=MappingProxyType(
            {target: parse_map(entry) for target, entry in as_dict(doc.get("calibration")).items()}
        ),
        feedback=_feedback(as_dict(doc.get("feedback"))),
    )


def load_policy(path: Path) -> Policy:
    """Read and parse a policy file; every failure is a ``PolicyError`` naming the file."""
    try:
        doc = yaml.load(read_small_text(path, MAX_POLICY_BYTES, "a policy"), Loader=_LOADER)
    except UnreadableFile as exc:
        raise PolicyError(str(path), [exc.reason]) from exc
    except yaml.YAMLError as exc:
        raise PolicyError(str(path), [describe(exc)]) from exc
    if doc is None:
        raise PolicyError(
            str(path), ["the file is empty; a policy is a YAML mapping (version, providers, ladder)"]
        )
    if not isinstance(doc, dict):
        raise PolicyError(
            str(path), [f"must be a YAML mapping (version, providers, ladder), not a {type(doc).__name__}"]
        )
    return parse_policy(doc, str(path))
