"""The table of provider kinds drives the schema's enum, the loader's rules and the kind defaults."""

from __future__ import annotations

from typing import Any

import pytest

from proxy.policy.loader import PolicyError, parse_policy, policy_schema
from proxy.policy.model import Target
from proxy.policy.provider_kinds import PROVIDER_KINDS, kinds_with
from proxy.schemas import load

KINDS = sorted(PROVIDER_KINDS)
URL = "http://127.0.0.1:1/v1"


def doc_with(provider: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {
        "version": 1,
        "providers": {"p": provider},
        "ladder": [{"name": "fast", "targets": ["p/m"]}],
        **extra,
    }


def kind_property(schema: dict[str, Any]) -> dict[str, Any]:
    kind: dict[str, Any] = schema["properties"]["providers"]["additionalProperties"]["properties"]["kind"]
    return kind


def test_the_schemas_kind_enum_is_the_tables_names_and_the_file_names_none() -> None:
    assert kind_property(policy_schema())["enum"] == list(PROVIDER_KINDS)
    assert "enum" not in kind_property(load("policy.schema.json"))  # written once, in the table


def test_a_kind_outside_the_table_is_refused_by_the_schema() -> None:
    with pytest.raises(PolicyError, match=r"providers\.p\.kind"):
        parse_policy(doc_with({"kind": "grpc", "base_url": URL}))


@pytest.mark.parametrize("name", KINDS)
def test_base_url_is_required_exactly_for_the_kinds_that_say_so(name: str) -> None:
    if PROVIDER_KINDS[name].base_url_required:
        with pytest.raises(PolicyError, match=rf"providers\.p\.base_url: required for kind {name}"):
            parse_policy(doc_with({"kind": name}))
    else:
        assert parse_policy(doc_with({"kind": name})).providers["p"].kind == name
    assert parse_policy(doc_with({"kind": name, "base_url": URL})).providers["p"].base_url == URL


@pytest.mark.parametrize("name", KINDS)
def test_a_kind_is_a_passthrough_provider_only_when_the_table_says_so(name: str) -> None:
    doc = doc_with({"kind": name, "base_url": URL}, passthrough={"provider": "p"})
    if PROVIDER_KINDS[name].passthrough is None:
        with pytest.raises(PolicyError) as info:
            parse_policy(doc)
        assert info.value.problems == [
            f"passthrough.provider: 'p' is kind {name}; passthrough needs kind openai (or offline, for demos)"
        ]
    else:
        assert parse_policy(doc).passthrough.provider == "p"


def test_the_refusal_names_the_kinds_that_forward_and_those_that_answer_locally() -> None:
    assert (kinds_with("forward"), kinds_with("local")) == (["openai"], ["offline"])


def test_the_default_passthrough_provider_is_the_first_of_a_default_kind() -> None:
    default_kinds = [n for n, k in PROVIDER_KINDS.items() if k.default_passthrough]
    others = [n for n in PROVIDER_KINDS if n not in default_kinds]
    providers = {f"{n}-x": {"kind": n, "base_url": URL} for n in others + default_kinds}
    doc = {**doc_with({"kind": "offline"}), "providers": providers}
    doc["ladder"] = [{"name": "fast", "targets": [f"{others[0]}-x/m"]}]
    assert parse_policy(doc).passthrough.provider == f"{default_kinds[0]}-x"


@pytest.mark.parametrize("name", KINDS)
def test_a_target_without_declarations_gets_its_kinds_modalities_and_capabilities(name: str) -> None:
    policy = parse_policy(doc_with({"kind": name, "base_url": URL}))
    target = Target("p", "m")
    kind = PROVIDER_KINDS[name]
    assert (policy.modalities_of(target), policy.capabilities_of(target)) == (
        kind.modalities,
        kind.capabilities,
    )
    assert "text" in kind.modalities  # every kind takes a plain prompt
