"""Building the provider clients a policy names."""

from __future__ import annotations

from collections.abc import Mapping

import aiohttp

from proxy.policy.model import Policy
from proxy.upstream.anthropic import AnthropicProvider
from proxy.upstream.base import Provider
from proxy.upstream.offline import OfflineProvider
from proxy.upstream.openai import OpenAIProvider


def build_providers(policy: Policy, session: aiohttp.ClientSession) -> Mapping[str, Provider]:
    """One client per provider of ``policy``, sharing the application's connection pool."""
    providers: dict[str, Provider] = {}
    for name, config in policy.providers.items():
        if config.kind == "openai":
            providers[name] = OpenAIProvider(config, session)
        elif config.kind == "anthropic":
            providers[name] = AnthropicProvider(config, session)
        else:
            providers[name] = OfflineProvider(config)
    return providers
