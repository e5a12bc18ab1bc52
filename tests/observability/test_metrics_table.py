"""``Metrics`` is built from its tables: every annotated metric attribute exists, is of its
declared kind, and is registered on the app's own registry under its row's name."""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

from proxy.observability.metrics import COUNTERS, GAUGES, HISTOGRAMS, Metrics


def test_every_row_becomes_its_attribute_on_the_own_registry() -> None:
    metrics = Metrics()
    kinds = {"Counter": Counter, "Histogram": Histogram, "Gauge": Gauge}
    declared = {attr: kind for attr, kind in Metrics.__annotations__.items() if kind in kinds}
    rows = {str(row[0]): str(row[1]) for row in (*COUNTERS, *HISTOGRAMS, *GAUGES)}
    assert set(declared) == set(rows)
    registered = {m.name for m in metrics.registry.collect()}
    for attr, kind in declared.items():
        assert isinstance(getattr(metrics, attr), kinds[kind]), attr
        assert rows[attr].removesuffix("_total") in registered, attr
    assert len(rows) == len(COUNTERS) + len(HISTOGRAMS) + len(GAUGES)  # no attribute twice
