"""Every provider kind of the table has a client, and the client sends the kind's auth header."""

from __future__ import annotations

import aiohttp
import pytest

from proxy.policy.loader import parse_policy
from proxy.policy.model import ProviderConfig
from proxy.policy.provider_kinds import PROVIDER_KINDS
from proxy.upstream.base import CallInfo
from proxy.upstream.http import auth_headers
from proxy.upstream.registry import CLIENTS, build_providers

URL = "http://127.0.0.1:1/v1"


def test_every_kind_in_the_table_has_a_client_and_no_client_lacks_a_kind() -> None:
    assert set(CLIENTS) == set(PROVIDER_KINDS)


async def test_a_policy_naming_every_kind_builds_one_client_of_that_kind_each() -> None:
    providers = {name: {"kind": name, "base_url": URL} for name in PROVIDER_KINDS}
    policy = parse_policy(
        {"version": 1, "providers": providers, "ladder": [{"name": "r", "targets": ["offline/m"]}]}
    )
    async with aiohttp.ClientSession() as session:
        built = build_providers(policy, session)
    assert {name: client.config.kind for name, client in built.items()} == {n: n for n in PROVIDER_KINDS}


@pytest.mark.parametrize("name", sorted(PROVIDER_KINDS))
def test_the_key_goes_in_the_kinds_auth_header(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PROVIDER_KEY", "sk-provider")
    config = ProviderConfig("p", name, URL, api_key_env="PROVIDER_KEY")
    header = PROVIDER_KINDS[name].auth_header
    expected = (
        {}
        if header is None
        else {"Authorization": "Bearer sk-provider"}
        if header == "Authorization"
        else {header: "sk-provider"}
    )
    assert auth_headers(config, CallInfo()) == expected


def test_options_auth_header_puts_the_raw_key_in_that_header(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PROVIDER_KEY", "sk-provider")
    config = ProviderConfig(
        "p", "openai", URL, api_key_env="PROVIDER_KEY", options={"auth_header": "api-key"}
    )
    assert auth_headers(config, CallInfo()) == {"api-key": "sk-provider"}
