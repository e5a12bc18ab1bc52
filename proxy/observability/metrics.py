"""Prometheus metrics (DESIGN §5), one registry per application (no module-level collectors).

Labels are bounded: module names come from the registry, providers and models from the policy,
routes from the router's path templates; anything else collapses to ``other``.

``cognitive_confidence`` carries ``attempt="final"`` (once per module answer) or
``attempt="intermediate"`` (answers on rungs that escalated, and re-asked answers).

The server runs one process per sidecar (one event loop; scale with replicas, not workers), so
the default in-process registry counts correctly; prometheus-client's multiprocess mode is not
needed.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

if TYPE_CHECKING:
    from prometheus_client.metrics_core import Metric

OTHER = "other"
NO_MODULE = "none"
# cognitive_requests_total{outcome}: what became of a request, from a fixed set.
OUTCOME_NONE = "none"  # not a module call (passthrough, catalogue, health)
OUTCOME_DECIDED = "decided"  # a module answer that got a decision
OUTCOME_INVALID_INPUT = "invalid_input"  # the caller's input broke the module's input contract
OUTCOME_UNKNOWN_MODULE = "unknown_module"  # the caller named a module that is not installed
OUTCOME_UNAVAILABLE = "unavailable"  # an installed composite whose dependencies did not resolve
CONFIDENCE_BUCKETS = tuple(round(0.1 * i, 1) for i in range(1, 11))
FEEDBACK_BUCKETS = tuple(f"{0.1 * i:.1f}" for i in range(10))
"""``bucket`` label of the feedback counters: the lower edge of a 0.1-wide confidence bin
(``"0.9"`` holds [0.9, 1.0], 1.0 included)."""
SCALES = ("reported", "calibrated")
LATENCY_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 30, 60, 120)
TPS_BUCKETS = (1, 5, 10, 20, 40, 80, 160, 320, 640, 1280)
OVERHEAD_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25)


class BreakerCollector(Collector):
    """``cognitive_circuit_open{target}``, read from the breakers at scrape time."""

    def __init__(self, snapshot: Callable[[], Iterable[tuple[str, bool]]]) -> None:
        self._snapshot = snapshot

    def collect(self) -> Iterator[Metric]:
        family = GaugeMetricFamily(
            "cognitive_circuit_open", "1 while a target's circuit breaker is open.", labels=["target"]
        )
        for target, is_open in self._snapshot():
            family.add_metric([target], 1.0 if is_open else 0.0)
        yield family

    def describe(self) -> Iterator[Metric]:
        yield GaugeMetricFamily(
            "cognitive_circuit_open", "1 while a target's circuit breaker is open.", labels=["target"]
        )


def feedback_bucket(confidence: float) -> str:
    """The fixed bin of ``confidence`` (clamped into [0, 1])."""
    return FEEDBACK_BUCKETS[min(9, max(0, int(confidence * 10)))]


class ThresholdCollector(Collector):
    """``cognitive_tier_min_confidence{tier}``, read from the current policy at scrape time."""

    def __init__(self, thresholds: Callable[[], Iterable[tuple[str, float]]]) -> None:
        self._thresholds = thresholds

    def _family(self) -> GaugeMetricFamily:
        return GaugeMetricFamily(
            "cognitive_tier_min_confidence",
            "Each tier's min_confidence in the current policy.",
            labels=["tier"],
        )

    def collect(self) -> Iterator[Metric]:
        family = self._family()
        for tier, value in self._thresholds():
            family.add_metric([tier], value)
        yield family

    def describe(self) -> Iterator[Metric]:
        yield self._family()


class Metrics:
    """Every metric the proxy exports, on its own registry."""

    def __init__(self) -> None:
        r = self.registry = CollectorRegistry(auto_describe=True)
        self.requests = Counter(
            "cognitive_requests_total",
            "HTTP requests by route template, module, status and outcome.",
            ["route", "module", "status", "outcome"],
            registry=r,
        )
        self.confidence = Histogram(
            "cognitive_confidence",
            "meta.confidence of module answers.",
            ["module", "tier", "attempt"],
            buckets=CONFIDENCE_BUCKETS,
            registry=r,
        )
        self.risk = Counter(
            "cognitive_risk_total",
            "meta.risk of final module answers.",
            ["module", "tier", "risk"],
            registry=r,
        )
        self.decisions = Counter(
            "cognitive_decisions_total",
            "Routing decisions on module answers.",
            ["module", "tier", "decision"],
            registry=r,
        )
        self.escalations = Counter(
            "cognitive_escalations_total",
            "Escalations from one rung to the next.",
            ["module", "from_rung", "to_rung"],
            registry=r,
        )
        self.repairs = Counter(
            "cognitive_repairs_total",
            "Repairs the contract engine made, by kind.",
            ["module", "kind"],
            registry=r,
        )
        self.risk_disagreements = Counter(
            "cognitive_risk_disagreements_total",
            "Answers whose meta.risk differs from the module's risk_rule over their data.",
            ["module"],
            registry=r,
        )
        self.composition_steps = Counter(
            "cognitive_composition_steps_total",
            "Steps run by composite modules, by composite, step module and the step's decision.",
            ["module", "step", "decision"],
            registry=r,
        )
        self.tools_stripped = Counter(
            "cognitive_tools_stripped_total",
            "Client tools kept out of a module's provider request by its tools policy.",
            ["module"],
            registry=r,
        )
        self.contract_errors = Counter(
            "cognitive_contract_errors_total",
            "Contract failures (model output and input), by error code.",
            ["module", "code"],
            registry=r,
        )
        self.upstream_requests = Counter(
            "cognitive_upstream_requests_total",
            "Provider attempts by outcome.",
            ["provider", "model", "outcome"],
            registry=r,
        )
        self.upstream_latency = Histogram(
            "cognitive_upstream_latency_seconds",
            "Provider attempt latency.",
            ["provider", "model"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.stream_incomplete = Counter(
            "cognitive_stream_incomplete_total",
            "Relayed answers that started but did not end complete (ended with an SSE error event), "
            "and streams with a malformed chunk (reason=malformed_chunk, forwarded as is).",
            ["provider", "model", "reason"],
            registry=r,
        )
        self.failovers = Counter(
            "cognitive_failovers_total",
            "Moves from a failed target to the next one.",
            ["from_target", "to_target", "reason"],
            registry=r,
        )
        self.overhead = Histogram(
            "cognitive_proxy_overhead_seconds",
            "Time spent in the proxy itself per request, upstream time excluded.",
            ["route"],
            buckets=OVERHEAD_BUCKETS,
            registry=r,
        )
        self.tokens = Counter(
            "cognitive_tokens_total",
            "Tokens reported by providers.",
            ["provider", "model", "kind"],
            registry=r,
        )
        self.policy_reloads = Counter(
            "cognitive_policy_reloads_total", "Policy and module reloads by result.", ["result"], registry=r
        )
        self.review_sink_failures = Counter(
            "cognitive_review_sink_failures_total",
            "Review records whose delivery failed (redis-stream: kept and re-sent; webhook: logged).",
            ["sink"],
            registry=r,
        )
        self.review_dropped = Counter(
            "cognitive_review_dropped_total",
            "Review records dropped: the Redis outbox was full, or Redis refused the write.",
            registry=r,
        )
        self.cache = Counter(
            "cognitive_cache_total",
            "Module result cache lookups: hit (no model called), miss, bypass (Cache-Control: no-cache).",
            ["module", "result"],
            registry=r,
        )
        self.cache_saved_tokens = Counter(
            "cognitive_cache_saved_tokens_total",
            "Tokens not spent because a module answer came from the result cache.",
            ["module"],
            registry=r,
        )
        self.context_redactions = Counter(
            "cognitive_context_redactions_total",
            "_context values redacted before a model saw them (credential-like names or values).",
            ["module"],
            registry=r,
        )
        self.context_writes_dropped = Counter(
            "cognitive_context_writes_dropped_total",
            "Context and cache writes dropped: the Redis outbox was full, or Redis refused the write.",
            registry=r,
        )
        self.inflight_body_bytes = Gauge(
            "cognitive_inflight_body_bytes",
            "Memory reserved by request bodies in flight, buffered and parsed (the body budget in use).",
            registry=r,
        )
        self.connections_refused = Counter(
            "cognitive_connections_refused_total",
            "Client connections refused (max_connections) or closed for a slow request (read_timeout).",
            ["reason"],
            registry=r,
        )
        self.open_connections = Gauge(
            "cognitive_open_connections",
            "Open client connections, by listener (api, admin).",
            ["listener"],
            registry=r,
        )
        self.stream_ttfd = Histogram(
            "cognitive_stream_ttfd_seconds",
            "Time from the start of a streamed module call to its first delta chunk.",
            ["module"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.streams = Counter(
            "cognitive_streams_total",
            "Streamed module answers by how they ended (final, error, interrupted).",
            ["module", "outcome"],
            registry=r,
        )
        self.stream_resumptions = Counter(
            "cognitive_stream_resumptions_total",
            "Stream recovery requests by result (resumed, restarted, unknown, refused, disabled).",
            ["result"],
            registry=r,
        )
        self.stream_sessions = Gauge(
            "cognitive_stream_sessions", "Streamed answers still being produced in this process.", registry=r
        )
        self.confidence_calibrated = Histogram(
            "cognitive_confidence_calibrated",
            "meta.confidence of final module answers through the target's calibration map.",
            ["module", "tier"],
            buckets=CONFIDENCE_BUCKETS,
            registry=r,
        )
        feedback = ["module", "provider", "model", "scale", "bucket"]
        self.feedback = Counter(
            "cognitive_feedback_total",
            "First verdicts on module answers, by confidence bin (of the reported or calibrated scale).",
            [*feedback, "verdict"],
            registry=r,
        )
        self.feedback_confidence = Counter(
            "cognitive_feedback_confidence_total",
            "Sum of the confidence of judged answers, per bin: mean confidence = this / count.",
            feedback,
            registry=r,
        )
        self.feedback_score = Counter(
            "cognitive_feedback_correct_total",
            "Sum of the correctness (1, 0, or the score) of judged answers per bin: accuracy = this / count.",
            feedback,
            registry=r,
        )
        self.feedback_brier = Counter(
            "cognitive_feedback_brier_total",
            "Sum of (confidence - correctness)^2 of judged answers: Brier score = this / count.",
            ["module", "provider", "model", "scale"],
            registry=r,
        )
        self.feedback_outcomes = Counter(
            "cognitive_feedback_outcomes_total",
            "First verdicts by tier, decision and gate (above: calibrated confidence >= min_confidence).",
            ["module", "tier", "provider", "model", "decision", "gate", "verdict"],
            registry=r,
        )
        self.feedback_replaced = Counter(
            "cognitive_feedback_replaced_total",
            "Verdicts that replaced an earlier verdict for the same answer (changed: differs from it).",
            ["module", "changed"],
            registry=r,
        )
        self.info = Gauge("cognitive_proxy_info", "Build information.", ["version"], registry=r)
        self.cost = Counter(
            "cognitive_cost_usd",
            "USD spent, from the policy's prices x each answer's usage (client: the key's name).",
            ["module", "provider", "model", "client"],
            registry=r,
        )
        self.savings = Counter(
            "cognitive_savings_usd",
            "Module calls: top-rung cost of the final answer's usage minus the call's cost, when positive.",
            ["module"],
            registry=r,
        )
        self.savings_lost = Counter(
            "cognitive_savings_lost_usd",
            "Module calls that cost more than the top rung would have (escalations): the excess.",
            ["module"],
            registry=r,
        )
        self.counterfactual = Counter(
            "cognitive_counterfactual_cost_usd",
            "Module calls: what the final answers would have cost on the top rung.",
            ["module"],
            registry=r,
        )
        self.limited = Counter(
            "cognitive_limited_total",
            "Requests refused by a limit (429), by scope (client, team, global) and kind.",
            ["scope", "kind", "client"],
            registry=r,
        )
        self.limits_degraded = Gauge(
            "cognitive_limits_degraded",
            "1 while limits are enforced per replica (Redis unreachable), 0 while shared.",
            registry=r,
        )
        self.ttft = Histogram(
            "cognitive_ttft_seconds",
            "Streams: time from the request to the first byte from the provider.",
            ["provider", "model"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.output_tps = Histogram(
            "cognitive_output_tokens_per_second",
            "Output tokens per second of an answer (streams: after the first token).",
            ["provider", "model"],
            buckets=TPS_BUCKETS,
            registry=r,
        )

        # labels() takes a lock and validates on every call; the hot path keeps its children.
        self._request_children: dict[tuple[str, str, int, str], Any] = {}
        self._overhead_children: dict[str, Any] = {}
        self._upstream_children: dict[tuple[str, str, str], tuple[Any, Any]] = {}

    def count_request(self, route: str, module: str, status: int, outcome: str = OUTCOME_NONE) -> None:
        key = (route, module, status, outcome)
        child = self._request_children.get(key)
        if child is None:
            child = self._request_children[key] = self.requests.labels(route, module, str(status), outcome)
        child.inc()

    def observe_overhead(self, route: str, seconds: float) -> None:
        child = self._overhead_children.get(route)
        if child is None:
            child = self._overhead_children[route] = self.overhead.labels(route)
        child.observe(seconds)

    def observe_upstream(self, provider: str, model: str, outcome: str, seconds: float) -> None:
        key = (provider, model, outcome)
        children = self._upstream_children.get(key)
        if children is None:
            children = self._upstream_children[key] = (
                self.upstream_requests.labels(provider, model, outcome),
                self.upstream_latency.labels(provider, model),
            )
        children[0].inc()
        children[1].observe(seconds)

    def watch_redis(self, up: Callable[[], bool]) -> None:
        """``cognitive_redis_up``: 1 while Redis answers (only with ``--redis-url``)."""
        gauge = Gauge(
            "cognitive_redis_up", "1 while the Redis of --redis-url answers.", registry=self.registry
        )
        gauge.set_function(lambda: 1.0 if up() else 0.0)

    def watch_thresholds(self, thresholds: Callable[[], Iterable[tuple[str, float]]]) -> None:
        self.registry.register(ThresholdCollector(thresholds))

    def watch_breakers(self, snapshot: Callable[[], Iterable[tuple[str, bool]]]) -> None:
        self.registry.register(BreakerCollector(snapshot))
