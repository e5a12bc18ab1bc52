"""Policy YAML: shipped policies load; bad files are refused with path.to.key: problem."""

from __future__ import annotations

import json
from dataclasses import fields
from pathlib import Path
from typing import Any

import pytest
import yaml
from structlog.testing import capture_logs

import proxy.schemas
from proxy.policy.loader import PolicyError, load_policy, parse_policy
from proxy.policy.model import Timeouts
from proxy.schemas import load
from tests.conftest import ROOT
from tests.support.unreadable import UNREADABLE_SHAPES

MINIMAL: dict[str, Any] = {
    "version": 1,
    "providers": {"p": {"kind": "openai", "base_url": "http://127.0.0.1:1/v1"}},
    "ladder": [{"name": "fast", "targets": ["p/small"]}, {"name": "strong", "targets": ["p/big"]}],
}


@pytest.mark.parametrize("name", ["default.yaml", "demo.yaml"])
def test_shipped_policies_load(name: str) -> None:
    policy = load_policy(ROOT / "policies" / name)
    assert [r.name for r in policy.ladder] == ["fast", "strong"]
    assert set(policy.tiers) == {"exec", "decision", "exploration"}


def test_default_policy_is_not_offline() -> None:
    policy = load_policy(ROOT / "policies" / "default.yaml")
    assert {p.kind for p in policy.providers.values()} == {"openai", "anthropic"}


def test_missing_tiers_get_documented_defaults() -> None:
    policy = parse_policy(MINIMAL)
    exec_tier = policy.tiers["exec"]
    assert (exec_tier.min_confidence, exec_tier.max_risk, exec_tier.exhausted) == (0.9, "low", "reject")
    assert policy.timeouts.per_try_s == 30 and policy.timeouts.total_s == 90


def test_module_override_replaces_only_the_fields_it_names() -> None:
    doc = {
        **MINIMAL,
        "tiers": {"decision": {"min_confidence": 0.7, "max_risk": "medium", "exhausted": "review"}},
        "modules": {"code-simplifier": {"min_confidence": 0.8}},
    }
    policy = parse_policy(doc)
    merged = policy.thresholds_for("code-simplifier", "decision")
    assert (merged.min_confidence, merged.max_risk, merged.exhausted) == (0.8, "medium", "review")
    assert policy.thresholds_for("other", "decision").min_confidence == 0.7


def test_risk_source_defaults_to_max_per_tier_and_module() -> None:
    doc = {
        **MINIMAL,
        "tiers": {"exec": {"min_confidence": 0.9, "max_risk": "low", "risk_source": "rule"}},
        "modules": {"config-patcher": {"risk_source": "model"}},
    }
    policy = parse_policy(doc)
    assert policy.tiers["decision"].risk_source == "max"
    assert policy.thresholds_for("other", "exec").risk_source == "rule"
    assert policy.thresholds_for("config-patcher", "exec").risk_source == "model"
    with pytest.raises(PolicyError, match=r"modules.x.risk_source"):
        parse_policy({**MINIMAL, "modules": {"x": {"risk_source": "vibes"}}})


@pytest.mark.parametrize(
    ("change", "problem"),
    [
        ({"version": 2}, "version"),
        ({"ladder": []}, "ladder"),
        (
            {"ladder": [{"name": "fast", "targets": ["nobody/x"]}]},
            "ladder[0].targets[0]: unknown provider 'nobody'",
        ),
        ({"providers": {"p": {"kind": "openai"}}}, "providers.p.base_url: required"),
        ({"providers": {"p": {"kind": "grpc", "base_url": "http://x"}}}, "providers.p.kind"),
        ({"tiers": {"exec": {"min_confidence": 1.5, "max_risk": "low"}}}, "tiers.exec.min_confidence"),
        ({"tiers": {"exec": {"min_confidence": 0.9, "max_risk": "severe"}}}, "tiers.exec.max_risk"),
        (
            {"tiers": {"exec": {"min_confidence": 0.9, "max_risk": "low", "start": "warp"}}},
            "tiers.exec.start: no rung",
        ),
        ({"aliases": {"gpt": "nowhere"}}, "aliases.gpt"),
        ({"surprise": 1}, "surprise"),
    ],
)
def test_bad_policy_names_the_key(change: dict[str, Any], problem: str) -> None:
    with pytest.raises(PolicyError) as info:
        parse_policy({**MINIMAL, **change}, "p.yaml")
    assert problem in str(info.value)
    assert str(info.value).startswith("p.yaml: ")


def test_unreadable_and_invalid_yaml_files(tmp_path: Path) -> None:
    with pytest.raises(PolicyError, match="cannot read"):
        load_policy(tmp_path / "absent.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("version: [1")
    with pytest.raises(PolicyError, match="invalid YAML"):
        load_policy(bad)
    good = tmp_path / "good.yaml"
    good.write_text(yaml.safe_dump(MINIMAL))
    assert load_policy(good).source == str(good)


def test_breaker_defaults_are_the_documented_rate_breaker() -> None:
    breaker = parse_policy(MINIMAL).failover.breaker
    assert (breaker.failure_rate, breaker.min_requests, breaker.window_s, breaker.open_s) == (0.5, 20, 30, 30)
    assert (breaker.consecutive_failures, breaker.half_open_requests) == (None, 1)


def test_removed_breaker_failures_key_is_read_as_consecutive_failures_with_a_warning() -> None:
    doc = {**MINIMAL, "failover": {"circuit_breaker": {"failures": 4, "open_s": 10}}}
    with capture_logs() as logs:
        breaker = parse_policy(doc).failover.breaker
    assert (breaker.consecutive_failures, breaker.open_s, breaker.min_requests) == (4, 10, 20)
    (warning,) = [e for e in logs if e["event"] == "proxy.policy_deprecated_key"]
    assert warning["use"] == "failover.circuit_breaker.consecutive_failures"
    both = {**MINIMAL, "failover": {"circuit_breaker": {"failures": 4, "consecutive_failures": 4}}}
    with pytest.raises(PolicyError, match=r"circuit_breaker\.failures: removed; it is consecutive_failures"):
        parse_policy(both)


@pytest.mark.parametrize(
    ("base_url", "problem"),
    [
        ("http://user:secret@127.0.0.1:1/v1", "credentials"),
        ("http://user@127.0.0.1:1/v1", "credentials"),
        ("http://127.0.0.1:1/v1?key=secret", "query"),
        ("http://127.0.0.1:1/v1#x", "query"),
        ("http:///v1", "host"),
        ("http://[::1/v1", "not a URL"),
    ],
)
def test_a_base_url_with_credentials_a_query_or_no_host_is_refused(base_url: str, problem: str) -> None:
    """userinfo in ``base_url`` made every call a 500 (aiohttp refuses it beside an
    ``Authorization`` header) and would be quoted in error texts; a query is ``options.query``."""
    doc = {**MINIMAL, "providers": {"p": {"kind": "openai", "base_url": base_url}}}
    with pytest.raises(PolicyError, match=rf"providers\.p\.base_url: .*{problem}"):
        parse_policy(doc)


def test_timeout_schema_defaults_are_the_dataclass_defaults() -> None:
    schema = load("policy.schema.json")["properties"]["failover"]["properties"]["timeout"]["properties"]
    assert {f.name: f.default for f in fields(Timeouts)} == {k: v["default"] for k, v in schema.items()}
    assert parse_policy(MINIMAL).timeouts == Timeouts()


def test_stream_bounds_load_and_idle_defaults_to_per_try() -> None:
    timeouts = parse_policy({**MINIMAL, "failover": {"timeout": {"per_try_s": 4}}}).timeouts
    assert (timeouts.idle_s, timeouts.stream_total_s) == (4, None)
    doc = {**MINIMAL, "failover": {"timeout": {"stream_idle_s": 2.5, "stream_total_s": 600}}}
    timeouts = parse_policy(doc).timeouts
    assert (timeouts.idle_s, timeouts.stream_total_s) == (2.5, 600)
    with pytest.raises(PolicyError, match="stream_idle_s"):
        parse_policy({**MINIMAL, "failover": {"timeout": {"stream_idle_s": 0}}})


def test_cache_schema_defaults_are_the_dataclass_defaults() -> None:
    from proxy.policy.model import CacheRule

    rule = load("policy.schema.json")["definitions"]["cache_rule"]["properties"]
    defaults = CacheRule()
    assert rule["ttl_s"]["default"] == defaults.ttl_s
    assert frozenset(rule["only_decisions"]["default"]) == defaults.only_decisions


def test_a_cache_section_parses_per_tier_and_module() -> None:
    doc = {
        "version": 1,
        "providers": {"o": {"kind": "offline"}},
        "ladder": [{"name": "r", "targets": ["o/m"]}],
        "cache": {
            "tiers": {"exec": {"ttl_s": 60}},
            "modules": {"m1": {"ttl_s": 0, "only_decisions": ["escalated"]}},
        },
    }
    policy = parse_policy(doc)
    assert policy.cache.rule_for("other", "exec").ttl_s == 60  # type: ignore[union-attr]
    assert policy.cache.rule_for("m1", "exec").only_decisions == {"escalated"}  # type: ignore[union-attr]
    assert policy.cache.rule_for("x", "decision") is None
    with pytest.raises(PolicyError, match="cache"):
        parse_policy({**doc, "cache": {"modules": {"m1": {"only_decisions": ["review"]}}}})


def test_prices_and_limits_parse_with_their_defaults() -> None:
    from proxy.policy.limits import LimitSpec, LimitsPolicy, Price

    doc = {
        "version": 1,
        "providers": {"p": {"kind": "offline"}},
        "ladder": [{"name": "fast", "targets": ["p/a"]}, {"name": "strong", "targets": ["p/b"]}],
        "prices": {
            "p/a": {"input_per_mtok": 1, "output_per_mtok": 2, "cached_input_per_mtok": 0.5},
            "p/b": {},
        },
        "limits": {"clients": {"alice": {"rpm": 10, "usd_per_day": 5}}, "teams": {"default": {"tpm": 1000}}},
    }
    policy = parse_policy(doc)
    assert policy.prices["p/a"] == Price(1.0, 2.0, 0.5)
    assert policy.prices["p/b"] == Price()
    assert policy.limits.clients["alice"] == LimitSpec(rpm=10, usd_per_day=5.0)
    assert policy.limits.for_team("anyone") == LimitSpec(tpm=1000)
    defaults = LimitsPolicy()
    assert (policy.limits.window_s, policy.limits.on_budget) == (defaults.window_s, defaults.on_budget)
    schema = json.loads((Path(proxy.schemas.__file__).parent / "policy.schema.json").read_text())
    limits = schema["properties"]["limits"]["properties"]
    assert (
        limits["window_s"]["default"] == defaults.window_s
        and limits["on_budget"]["default"] == defaults.on_budget
    )
    price = schema["properties"]["prices"]["additionalProperties"]["properties"]
    assert price["input_per_mtok"]["default"] == Price().input_per_mtok
    assert price["output_per_mtok"]["default"] == Price().output_per_mtok
    usage = {"prompt_tokens": 1000, "completion_tokens": 100, "prompt_tokens_details": {"cached_tokens": 400}}
    assert policy.prices["p/a"].cost(usage) == pytest.approx((600 * 1 + 400 * 0.5 + 100 * 2) / 1e6)


@pytest.mark.parametrize(
    ("extra", "problem"),
    [
        ({"prices": {"q/a": {"input_per_mtok": 1}}}, "prices.q/a: unknown provider 'q'"),
        ({"prices": {"p/a": {"input_per_mtok": -1}}}, "prices.p/a.input_per_mtok"),
        ({"limits": {"downgrade_to": "nowhere"}}, "limits.downgrade_to: no rung named 'nowhere'"),
        ({"limits": {"clients": {"a": {"rpm": 0}}}}, "limits.clients.a.rpm"),
        ({"limits": {"on_budget": "ignore"}}, "limits.on_budget"),
        ({"limits": {"clients": {"a": {"rpms": 3}}}}, "limits.clients.a"),
    ],
)
def test_bad_prices_and_limits_are_refused_with_their_path(extra: dict[str, Any], problem: str) -> None:
    doc = {
        "version": 1,
        "providers": {"p": {"kind": "offline"}},
        "ladder": [{"name": "fast", "targets": ["p/a"]}],
    }
    with pytest.raises(PolicyError) as caught:
        parse_policy({**doc, **extra})
    assert any(problem in p for p in caught.value.problems), caught.value.problems


@pytest.mark.parametrize("entry", ["localhost:8081", "assets.internal", "[::1]:8081", "[::1]", "10.0.0.5:90"])
def test_trusted_hosts_take_host_and_port_entries(entry: str) -> None:
    assert parse_policy({**MINIMAL, "media": {"trusted_hosts": [entry]}}).media.trusted_hosts == (entry,)


@pytest.mark.parametrize("entry", ["http://x", "::1", "x:port", "x/path", "a b", "x:123456"])
def test_a_trusted_host_that_is_not_host_or_host_port_is_refused(entry: str) -> None:
    with pytest.raises(PolicyError, match=r"media.trusted_hosts"):
        parse_policy({**MINIMAL, "media": {"trusted_hosts": [entry]}})


@pytest.mark.parametrize("shape", UNREADABLE_SHAPES)
def test_an_unreadable_policy_file_is_a_policy_error_naming_it(shape: str, tmp_path: Path) -> None:
    make, reason = UNREADABLE_SHAPES[shape]
    path = tmp_path / "policy.yaml"
    make(path)
    with pytest.raises(PolicyError) as info:
        load_policy(path)
    assert info.value.source == str(path)
    assert info.value.problems == [reason]


def test_a_control_character_is_one_line_naming_its_offset(tmp_path: Path) -> None:
    path = tmp_path / "policy.yaml"
    path.write_text("version: 1\n\x00")
    with pytest.raises(PolicyError) as info:
        load_policy(path)
    assert info.value.problems == [
        "character 11: invalid YAML: unacceptable character #x0000: control characters are not allowed"
    ]
