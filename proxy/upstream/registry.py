"""Building the provider clients a policy names: one client class per provider kind."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from types import MappingProxyType

import aiohttp

from proxy.policy.model import Policy, ProviderConfig
from proxy.upstream.anthropic import AnthropicProvider
from proxy.upstream.base import Provider
from proxy.upstream.offline import OfflineProvider
from proxy.upstream.openai import OpenAIProvider

ClientFactory = Callable[[ProviderConfig, aiohttp.ClientSession], Provider]


def _offline(config: ProviderConfig, _session: aiohttp.ClientSession) -> Provider:
    return OfflineProvider(config)  # no network: the pool is not needed


CLIENTS: Mapping[str, ClientFactory] = MappingProxyType(
    {
        # Keyed by the names of proxy.policy.provider_kinds.PROVIDER_KINDS (a test checks both agree).
        "openai": OpenAIProvider,
        "anthropic": AnthropicProvider,
        "offline": _offline,
    }
)


def build_providers(policy: Policy, session: aiohttp.ClientSession) -> Mapping[str, Provider]:
    """One client per provider of ``policy``, sharing the application's connection pool."""
    return {name: CLIENTS[config.kind](config, session) for name, config in policy.providers.items()}
