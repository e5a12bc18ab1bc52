"""Routing policy: YAML -> typed Policy, and the pure decision function."""

from proxy.policy.decide import Decision, Meta, decide
from proxy.policy.loader import PolicyError, load_policy, parse_policy
from proxy.policy.model import Policy, Rung, Target, Thresholds

__all__ = [
    "Decision",
    "Meta",
    "Policy",
    "PolicyError",
    "Rung",
    "Target",
    "Thresholds",
    "decide",
    "load_policy",
    "parse_policy",
]
