"""Policy defaults have one source, the dataclasses of ``proxy.policy``: every ``default`` in
``policy.schema.json`` equals its field's, and a policy that leaves a section out loads it as the
dataclass builds it (the loader reads the dataclass, never a literal of its own)."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import pytest

from proxy.policy.limits import LimitsPolicy, Price
from proxy.policy.loader import parse_policy
from proxy.policy.model import (
    Backoff,
    BreakerPolicy,
    CachePolicy,
    CacheRule,
    Failover,
    FeedbackPolicy,
    MediaPolicy,
    ProviderConfig,
    RetryBudget,
    ReviewPolicy,
    ShadowPolicy,
    Thresholds,
    Timeouts,
)
from proxy.schemas import load
from tests.policy.test_loader import MINIMAL

# Where each schema object with defaults lives: its JSON pointer -> the dataclass instance built
# with no arguments but the required ones. A default with no owner here fails the test below.
OWNERS: dict[str, Any] = {
    "": parse_policy(MINIMAL),  # top-level sections: the Policy a minimal document loads to
    "/properties/providers/additionalProperties": ProviderConfig("p", "openai"),
    "/properties/failover": Failover(),
    "/properties/failover/properties/backoff": Backoff(),
    "/properties/failover/properties/timeout": Timeouts(),
    "/properties/failover/properties/circuit_breaker": BreakerPolicy(),
    "/properties/failover/properties/retry_budget": RetryBudget(),
    "/properties/review": ReviewPolicy(),
    "/properties/prices/additionalProperties": Price(),
    "/properties/limits": LimitsPolicy(),
    "/properties/feedback": FeedbackPolicy(),
    "/properties/feedback/properties/shadow": ShadowPolicy(),
    "/properties/media": MediaPolicy(),
    "/properties/cache": CachePolicy(),
    "/definitions/tier": Thresholds(0.0, "high"),
    "/definitions/cache_rule": CacheRule(),
}


def schema_defaults(node: Any, pointer: str = "") -> Iterator[tuple[str, str, Any]]:
    """(owner pointer, property, default) for every property of the schema with a default."""
    if not isinstance(node, dict):
        return
    for name, prop in (node.get("properties") or {}).items():
        if isinstance(prop, dict) and "default" in prop:
            yield pointer, name, prop["default"]
    for key, child in node.items():
        if key == "properties":
            for name, prop in child.items():
                yield from schema_defaults(prop, f"{pointer}/properties/{name}")
        elif key in ("additionalProperties", "items") and isinstance(child, dict):
            yield from schema_defaults(child, f"{pointer}/{key}")
        elif key == "definitions":
            for name, sub in child.items():
                yield from schema_defaults(sub, f"/definitions/{name}")


def normal(value: Any) -> Any:
    if isinstance(value, (frozenset, set)):
        return sorted(value)
    if isinstance(value, tuple):
        return list(value)
    if isinstance(value, Mapping):
        return dict(value)
    return value


DEFAULTS = sorted(schema_defaults(load("policy.schema.json")))


def test_every_schema_default_has_an_owner() -> None:
    assert len(DEFAULTS) > 30
    assert {owner for owner, _, _ in DEFAULTS} <= set(OWNERS)


@pytest.mark.parametrize(("owner", "name", "default"), DEFAULTS, ids=[f"{o}/{n}" for o, n, _ in DEFAULTS])
def test_the_schema_default_is_the_dataclass_default(owner: str, name: str, default: Any) -> None:
    actual = getattr(OWNERS[owner], name)
    if isinstance(actual, frozenset):  # a set in the dataclass, a list in the schema
        default = frozenset(default)
    assert normal(actual) == normal(default)


def test_a_policy_without_its_optional_sections_loads_the_dataclass_defaults() -> None:
    policy = parse_policy(MINIMAL)
    assert policy.failover == Failover()
    assert policy.review == ReviewPolicy()
    assert policy.feedback == FeedbackPolicy()
    assert policy.media == MediaPolicy()
    provider, bare = policy.providers["p"], ProviderConfig("p", "openai")
    assert (provider.forward_client_key, provider.allow_any_model) == (
        bare.forward_client_key,
        bare.allow_any_model,
    )
    assert (dict(provider.headers), dict(provider.options)) == (dict(bare.headers), dict(bare.options))


def test_a_tier_without_exhausted_reask_or_risk_source_takes_the_dataclass_defaults() -> None:
    doc = {**MINIMAL, "modules": {"m": {"min_confidence": 0.5, "max_risk": "low"}}}
    defaults = Thresholds(0.0, "high")
    thresholds = parse_policy(doc).thresholds_for("m", "exec")
    assert (thresholds.exhausted, thresholds.reask, thresholds.risk_source) == (
        defaults.exhausted,
        defaults.reask,
        defaults.risk_source,
    )
