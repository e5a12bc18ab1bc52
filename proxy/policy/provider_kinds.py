"""What each provider kind is: one row per ``kind:`` a policy may name.

The policy schema's ``kind`` enum, the loader's base URL and passthrough rules, the modality and
capability defaults and the clients' auth header all read this table; ``proxy.upstream.registry``
maps the same names to client classes. A new kind is a row here, a client and its registry entry.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Literal

from proxy.contract.rules import KNOWN_PREFERENCES

CAPABILITIES = ("structured_output", *KNOWN_PREFERENCES)
"""What a target may be declared to do: module.yaml's ``preferred_capabilities`` plus
``structured_output`` (``runtime_requirements.structured_output``)."""

Passthrough = Literal["forward", "local"]
"""How a kind serves the ``/v1/*`` paths the proxy does not handle itself: forwarded to its
API, or answered in-process (the offline demo)."""


@dataclass(frozen=True, slots=True)
class ProviderKind:
    modalities: frozenset[str]
    """Input modalities its chat API takes when the policy does not say (per target or provider)."""
    capabilities: frozenset[str]
    """What its targets do when the policy does not say (per target or provider)."""
    auth_header: str | None
    """The header carrying the provider key: ``Authorization`` sends ``Bearer <key>``, another
    name the raw key (``options.auth_header`` overrides it); None: no key is ever sent."""
    base_url_required: bool
    passthrough: Passthrough | None
    """None: it cannot be a passthrough provider."""
    default_passthrough: bool = False
    """The first provider of this kind is the passthrough provider when the policy names none."""


PROVIDER_KINDS: Mapping[str, ProviderKind] = MappingProxyType(
    {
        "openai": ProviderKind(
            modalities=frozenset({"text", "image", "audio", "document"}),
            capabilities=frozenset(CAPABILITIES),
            auth_header="Authorization",
            base_url_required=True,
            passthrough="forward",
            default_passthrough=True,
        ),
        "anthropic": ProviderKind(
            modalities=frozenset({"text", "image", "document"}),
            capabilities=frozenset({"structured_output", "long_context", "function_calling", "vision"}),
            auth_header="x-api-key",
            base_url_required=True,
            passthrough=None,
        ),
        "offline": ProviderKind(
            modalities=frozenset({"text", "image", "audio", "video", "document"}),
            capabilities=frozenset(CAPABILITIES),
            auth_header=None,
            base_url_required=False,
            passthrough="local",
        ),
    }
)


def kinds_with(passthrough: Passthrough) -> list[str]:
    """The kinds that serve passthrough paths that way, in table order."""
    return [name for name, kind in PROVIDER_KINDS.items() if kind.passthrough == passthrough]
