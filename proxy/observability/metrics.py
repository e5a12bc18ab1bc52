"""Prometheus metrics, one registry per application (no module-level collectors)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter


class Metrics:
    """Every metric the proxy exports (DESIGN §5), on its own registry."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.policy_reloads = Counter(
            "cognitive_policy_reloads_total",
            "Policy and module reloads by result (ok, error).",
            ["result"],
            registry=self.registry,
        )
