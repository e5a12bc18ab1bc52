"""Tier defaults (spec v2.2 §4.3, v2.5 §5.2), applied where module.yaml is silent."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from proxy.contract.rules import Tier
from proxy.module.model import EnumStrategy, ResponseMode, Strictness


@dataclass(frozen=True, slots=True)
class TierDefaults:
    strictness: Strictness
    enum_strategy: EnumStrategy
    overflow_enabled: bool
    response_mode: ResponseMode


TIER_DEFAULTS: Final[dict[Tier, TierDefaults]] = {
    "exec": TierDefaults("high", "strict", False, "sync"),
    "decision": TierDefaults("medium", "extensible", True, "both"),
    "exploration": TierDefaults("low", "extensible", True, "streaming"),
}

# §4.3: overflow.max_items follows the strictness (so exec 0, decision 5, exploration 20 by
# default) and always has a value; "there is no unlimited".
MAX_ITEMS_BY_STRICTNESS: Final[dict[Strictness, int]] = {"high": 0, "medium": 5, "low": 20}

# Modules written before tiers existed (v1, v2.1 without a tier) run as decision modules.
LEGACY_TIER: Final[Tier] = "decision"
