"""Human-readable policy summaries and decision explanations for ``cogproxy policy``."""

from __future__ import annotations

from dataclasses import fields

from proxy.policy.calibration import CalibrationMap
from proxy.policy.decide import Meta, decide
from proxy.policy.model import BreakerPolicy, CacheRule, Policy, Thresholds


def _thresholds(t: Thresholds) -> str:
    """Every field of a tier entry that is set, in declaration order (a new field shows itself)."""
    values = ((f.name, getattr(t, f.name)) for f in fields(t))
    return ", ".join(
        f"{name} {value:g}" if isinstance(value, float) else f"{name} {value}"
        for name, value in values
        if value is not None
    )


def summary(policy: Policy) -> list[str]:
    """The policy as an operator reads it: providers, rungs and targets, tiers, overrides."""
    f = policy.failover
    lines = [f"policy {policy.source}: valid", "providers:"]
    for p in policy.providers.values():
        key = f"key from ${p.api_key_env}" if p.api_key_env else "no key"
        if p.forward_client_key:
            key = "client's own key"
        where = f" {p.base_url}" if p.base_url else ""
        lines.append(f"  {p.name}: {p.kind}{where} ({key})")
    lines.append("ladder (cheapest first; targets in failover order):")
    lines += [f"  {i}. {r.name}: {', '.join(str(t) for t in r.targets)}" for i, r in enumerate(policy.ladder)]
    lines.append("tiers:")
    lines += [f"  {name}: {_thresholds(t)}" for name, t in policy.tiers.items()]
    if policy.modules:
        lines.append("module overrides:")
        lines += [
            f"  {name}: {', '.join(f'{k} {v}' for k, v in o.items())}" for name, o in policy.modules.items()
        ]
    if policy.aliases:
        lines.append("aliases: " + ", ".join(f"{a} -> {t}" for a, t in sorted(policy.aliases.items())))
    lines.append(
        f"failover: {f.retries} retries per target on {', '.join(sorted(f.retry_on))}; backoff "
        f"{f.backoff.base_ms:g}-{f.backoff.max_ms:g} ms; per try {f.timeouts.per_try_s:g}s, total "
        f"{f.timeouts.total_s:g}s; breaker {_breaker(f.breaker)}; retry budget {f.budget.percent:g}% "
        f"(min {f.budget.min_concurrency}; {f.budget.min_per_target} per target outside it)"
    )
    lines.append(f"review: {policy.review.sink}")
    routes = "".join(f"; {r.prefix} -> {', '.join(r.providers)}" for r in policy.passthrough.routes)
    lines.append(f"passthrough (/v1/* not handled here): {policy.passthrough.provider or 'none'}{routes}")
    lines += _quota(policy)
    lines += _calibration_and_cache(policy)
    return lines


def _calibration_map(mapping: CalibrationMap) -> str:
    if mapping.xs:
        return "points " + ", ".join(f"{x:g} -> {y:g}" for x, y in zip(mapping.xs, mapping.ys, strict=True))
    return f"platt a {mapping.a:g}, b {mapping.b:g}"


def _cache_rule(rule: CacheRule) -> str:
    ttl = "off" if rule.ttl_s == 0 else "never expires" if rule.ttl_s < 0 else f"{rule.ttl_s}s"
    return f"{ttl} (decisions: {', '.join(sorted(rule.only_decisions))})"


def _calibration_and_cache(policy: Policy) -> list[str]:
    lines = []
    if policy.calibration:
        lines.append("calibration (reported -> decided confidence):")
        lines += [f"  {t}: {_calibration_map(m)}" for t, m in sorted(policy.calibration.items())]
    rules = [(f"tier {n}", r) for n, r in policy.cache.tiers.items()]
    rules += [(f"module {n}", r) for n, r in policy.cache.modules.items()]
    if rules:
        lines.append("cache:")
        lines += [f"  {name}: {_cache_rule(rule)}" for name, rule in rules]
    return lines


def _quota(policy: Policy) -> list[str]:
    lines = []
    if policy.prices:
        lines.append("prices (USD per million tokens in/out):")
        lines += [
            f"  {target}: {p.input_per_mtok:g}/{p.output_per_mtok:g}"
            for target, p in sorted(policy.prices.items())
        ]
    limits = policy.limits
    if limits.active:
        scopes = [(f"client {n}", s) for n, s in limits.clients.items()]
        scopes += [(f"team {n}", s) for n, s in limits.teams.items()]
        scopes += [("global", limits.global_)] if limits.global_ else []
        lines.append(f"limits (window {limits.window_s}s; over a budget: {limits.on_budget}):")
        for name, spec in scopes:
            parts = [
                f"{label} {value:g}" if isinstance(value, float) else f"{label} {value}"
                for label, value in (
                    ("rpm", spec.rpm),
                    ("tpm", spec.tpm),
                    ("usd/day", spec.usd_per_day),
                    ("usd/month", spec.usd_per_month),
                )
                if value is not None
            ]
            lines.append(f"  {name}: {', '.join(parts)}")
    return lines


def _breaker(b: BreakerPolicy) -> str:
    consecutive = f" or {b.consecutive_failures} in a row" if b.consecutive_failures else ""
    return (
        f"opens at {b.failure_rate:.0%} failures of >= {b.min_requests} in {b.window_s:g}s{consecutive}, "
        f"open {b.open_s:g}s, {b.half_open_requests} trial(s)"
    )


def explain(
    policy: Policy,
    thresholds: Thresholds,
    meta: Meta,
    rung: int,
    label: str,
    *,
    module: str = "",
    tier: str = "",
) -> list[str]:
    """What the router does with an answer carrying ``meta`` on rung ``rung``, and why: the
    confidence decided on is the one the rung's first target's ``calibration:`` map gives, and the
    module's (or tier's) ``cache:`` rule says whether the answer is reused."""
    here = policy.ladder[rung]
    target = str(here.targets[0]) if here.targets else ""
    decided = Meta(policy.calibrate(target, meta.confidence), meta.risk)
    decision = decide(thresholds, decided, rung, len(policy.ladder))
    lines = [
        f"{label}: {_thresholds(thresholds)}",
        f"answer on rung {rung} ({here.name}): confidence {meta.confidence:g}, risk {meta.risk}",
    ]
    if target in policy.calibration:
        lines.append(
            f"calibration.{target}: reported {meta.confidence:g} -> calibrated {decided.confidence:.3g}"
        )
    lines.append(f"decision: {decision.action} ({decision.reason})")
    rule = policy.cache.rule_for(module, tier)
    if rule is not None and rule.ttl_s != 0:
        stored = "this answer is stored" if decision.action in rule.only_decisions else "not this one"
        lines.append(f"cache: accepted answers reused for {_cache_rule(rule)}; {stored}")
    if decision.next_rung is not None:
        lines.append(f"next: rung {decision.next_rung} ({policy.ladder[decision.next_rung].name})")
    elif decision.action == "reject":
        lines.append("answer: ok=false, E2001 LOW_CONFIDENCE, last data in partial_data")
    elif decision.action == "review":
        lines.append(
            f"answer: the envelope as is, decision review, recorded in the {policy.review.sink} sink"
        )
    return lines
