"""The runtime snapshot a call runs on: policy, modules, providers and the review sink."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from proxy.module.registry import ModuleRegistry
from proxy.policy.model import Policy
from proxy.review import ReviewSink
from proxy.upstream.base import Provider


@dataclass(frozen=True, slots=True)
class Runtime:
    """An immutable snapshot; a reload builds a new one and swaps it in whole, so a request
    finishes on the policy and modules it started with."""

    policy: Policy
    registry: ModuleRegistry
    providers: Mapping[str, Provider]
    review: ReviewSink
