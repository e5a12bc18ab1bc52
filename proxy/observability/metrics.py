"""Prometheus metrics (docs/observability.md), one registry per application (no module-level collectors).

Labels are bounded: module names come from the registry, providers and models from the policy,
routes from the router's path templates; anything else collapses to ``other``.

``cognitive_confidence`` carries ``attempt="final"`` (once per module answer) or
``attempt="intermediate"`` (answers on rungs that escalated, and re-asked answers).

Under ``serve --workers N`` every worker writes its values to prometheus-client's multiprocess
files (``PROMETHEUS_MULTIPROC_DIR``, set by ``proxy.supervisor``) and ``/metrics`` on any worker
renders the sum over all of them. Gauges read at scrape time (``set_function``, the collectors
below) are copied into those files every ``SHARE_INTERVAL_S`` and before each scrape; each
gauge's ``GAUGE_MODES`` entry says how the workers' values combine. One process alone keeps the
in-process registry (no files, nothing copied).
"""

from __future__ import annotations

import asyncio
import itertools
import os
import struct
from bisect import bisect_left
from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Any, Literal, cast

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, values
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.multiprocess import MultiProcessCollector
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
OUTCOME_UNANSWERED = "unanswered"  # no model answered (providers down, deadline): nothing to decide on
CONFIDENCE_BUCKETS = tuple(round(0.1 * i, 1) for i in range(1, 11))
FEEDBACK_BUCKETS = tuple(f"{0.1 * i:.1f}" for i in range(10))
"""``bucket`` label of the feedback counters: the lower edge of a 0.1-wide confidence bin
(``"0.9"`` holds [0.9, 1.0], 1.0 included)."""
SCALES = ("reported", "calibrated")
LATENCY_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 30, 60, 120)
TPS_BUCKETS = (1, 5, 10, 20, 40, 80, 160, 320, 640, 1280)
OVERHEAD_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25)


def _pin_worker_identity() -> None:
    """In a ``--workers`` worker (``PROMETHEUS_MULTIPROC_DIR`` set when prometheus-client was
    imported), the multiprocess values keyed by this process's pid taken once, not asked of the
    kernel on every update: prometheus-client checks ``os.getpid()`` on each ``inc``, ``set`` and
    ``observe`` to notice a ``fork()`` (about 10 ``getpid`` system calls a passthrough request).
    Sound because a worker is a fresh interpreter (``proxy.supervisor`` starts each with ``exec``)
    that never forks without exec; its files keep the pid in their name, as the supervisor's
    ``mark_process_dead`` expects. Runs once, at import, before any metric exists."""
    if getattr(values.ValueClass, "_multiprocess", False):
        values.ValueClass = values.MultiProcessValue(  # type: ignore[no-untyped-call]
            process_identifier=itertools.repeat(os.getpid()).__next__  # a C call: no Python frame
        )


_pin_worker_identity()


class BreakerCollector(Collector):
    """``cognitive_circuit_open{target}``, read from the breakers at scrape time."""

    NAME, DOC, LABELS = "cognitive_circuit_open", "1 while a target's circuit breaker is open.", ("target",)

    def __init__(self, snapshot: Callable[[], Iterable[tuple[str, bool]]]) -> None:
        self._snapshot = snapshot

    def collect(self) -> Iterator[Metric]:
        family = GaugeMetricFamily(self.NAME, self.DOC, labels=self.LABELS)
        for target, is_open in self._snapshot():
            family.add_metric([target], 1.0 if is_open else 0.0)
        yield family

    def describe(self) -> Iterator[Metric]:
        yield GaugeMetricFamily(self.NAME, self.DOC, labels=self.LABELS)


def feedback_bucket(confidence: float) -> str:
    """The fixed bin of ``confidence`` (clamped into [0, 1])."""
    return FEEDBACK_BUCKETS[min(9, max(0, int(confidence * 10)))]


class ThresholdCollector(Collector):
    """``cognitive_tier_min_confidence{tier}``, read from the current policy at scrape time."""

    NAME, DOC, LABELS = (
        "cognitive_tier_min_confidence",
        "Each tier's min_confidence in the current policy.",
        ("tier",),
    )

    def __init__(self, thresholds: Callable[[], Iterable[tuple[str, float]]]) -> None:
        self._thresholds = thresholds

    def _family(self) -> GaugeMetricFamily:
        return GaugeMetricFamily(self.NAME, self.DOC, labels=self.LABELS)

    def collect(self) -> Iterator[Metric]:
        family = self._family()
        for tier, value in self._thresholds():
            family.add_metric([tier], value)
        yield family

    def describe(self) -> Iterator[Metric]:
        yield self._family()


# The bins of the feedback counters (one row per module, target, scale and confidence bin).
FEEDBACK_LABELS = ("module", "provider", "model", "scale", "bucket")
# Every metric: (attribute, name, help, labels); histograms add their buckets. A row here is
# the whole definition: ``Metrics`` builds them on its own registry.
COUNTERS: tuple[tuple[str, str, str, tuple[str, ...]], ...] = (
    (
        "requests",
        "cognitive_requests_total",
        "HTTP requests by route template, module, status and outcome.",
        ("route", "module", "status", "outcome"),
    ),
    ("risk", "cognitive_risk_total", "meta.risk of final module answers.", ("module", "tier", "risk")),
    (
        "decisions",
        "cognitive_decisions_total",
        "Routing decisions on module answers.",
        ("module", "tier", "decision"),
    ),
    (
        "escalations",
        "cognitive_escalations_total",
        "Escalations from one rung to the next.",
        ("module", "from_rung", "to_rung"),
    ),
    ("repairs", "cognitive_repairs_total", "Repairs the contract engine made, by kind.", ("module", "kind")),
    (
        "risk_disagreements",
        "cognitive_risk_disagreements_total",
        "Answers whose meta.risk differs from the module's risk_rule over their data.",
        ("module",),
    ),
    (
        "composition_steps",
        "cognitive_composition_steps_total",
        "Steps run by composite modules, by composite, step module and the step's decision.",
        ("module", "step", "decision"),
    ),
    (
        "tools_stripped",
        "cognitive_tools_stripped_total",
        "Client tools kept out of a module's provider request by its tools policy.",
        ("module",),
    ),
    (
        "contract_errors",
        "cognitive_contract_errors_total",
        "Contract failures (model output and input), by error code.",
        ("module", "code"),
    ),
    (
        "upstream_requests",
        "cognitive_upstream_requests_total",
        "Provider attempts by outcome.",
        ("provider", "model", "outcome"),
    ),
    (
        "stream_incomplete",
        "cognitive_stream_incomplete_total",
        "Relayed answers that started but did not end complete (ended with an SSE error "
        "event), and streams with a malformed chunk (reason=malformed_chunk, forwarded as"
        " is).",
        ("provider", "model", "reason"),
    ),
    (
        "failovers",
        "cognitive_failovers_total",
        "Moves from a failed target to the next one.",
        ("from_target", "to_target", "reason"),
    ),
    ("tokens", "cognitive_tokens_total", "Tokens reported by providers.", ("provider", "model", "kind")),
    ("policy_reloads", "cognitive_policy_reloads_total", "Policy and module reloads by result.", ("result",)),
    (
        "review_sink_failures",
        "cognitive_review_sink_failures_total",
        "Review records whose delivery failed (redis-stream: kept and re-sent; webhook: logged).",
        ("sink",),
    ),
    (
        "outbox_replica_shortfalls",
        "cognitive_outbox_replica_shortfalls_total",
        "Outbox batches whose Redis replicas did not confirm them in time (--redis-durable-replicas): "
        "kept and resent.",
        (),
    ),
    (
        "review_dropped",
        "cognitive_review_dropped_total",
        "Review records dropped: the Redis outbox was full, or Redis refused the write.",
        (),
    ),
    (
        "review_console",
        "cognitive_review_console_actions_total",
        "Review console actions (login, judge, override, logout) by result (done, refused, failed).",
        ("action", "result"),
    ),
    (
        "review_queue_evicted",
        "cognitive_review_queue_evicted_total",
        "Pending review items dropped from the console's bounded queue before anyone judged them.",
        (),
    ),
    (
        "cache",
        "cognitive_cache_total",
        "Module result cache lookups: hit (no model called), miss, bypass (Cache-Control: no-cache).",
        ("module", "result"),
    ),
    (
        "cache_saved_tokens",
        "cognitive_cache_saved_tokens_total",
        "Tokens not spent because a module answer came from the result cache.",
        ("module",),
    ),
    (
        "context_redactions",
        "cognitive_context_redactions_total",
        "_context values redacted before a model saw them (credential-like names or values).",
        ("module",),
    ),
    (
        "context_evictions",
        "cognitive_context_evictions_total",
        "Context and cache entries evicted: a client past its own quota (client_quota), or the "
        "in-process store full (store_full, taken from the client holding the most bytes).",
        ("reason",),
    ),
    (
        "context_writes_dropped",
        "cognitive_context_writes_dropped_total",
        "Context and cache writes dropped: the Redis outbox was full, or Redis refused the write.",
        (),
    ),
    (
        "feedback_writes_dropped",
        "cognitive_feedback_writes_dropped_total",
        "Feedback records (answers and verdicts) not written to Redis: the outbox was full, or "
        "Redis refused the write.",
        (),
    ),
    (
        "feedback_capped",
        "cognitive_feedback_capped_total",
        "Module answers not shared through Redis: the replica reached feedback.max_per_day for "
        "the day (kept in its memory only).",
        (),
    ),
    (
        "connections_refused",
        "cognitive_connections_refused_total",
        "Client connections refused (max_connections) or closed for a slow request (read_timeout).",
        ("reason",),
    ),
    (
        "streams",
        "cognitive_streams_total",
        "Streamed module answers by how they ended (final, error, interrupted).",
        ("module", "outcome"),
    ),
    (
        "stream_resumptions",
        "cognitive_stream_resumptions_total",
        "Stream recovery requests by result (resumed, restarted, unknown, refused, disabled).",
        ("result",),
    ),
    (
        "stream_mirror_dropped",
        "cognitive_stream_mirror_dropped_total",
        "Streamed sessions dropped from the Redis copy (not resumable on another replica): the "
        "chunks waiting for Redis reached the bound (behind), or a write failed (failed).",
        ("reason",),
    ),
    (
        "trace_spans_dropped",
        "cognitive_trace_spans_dropped_total",
        "Trace spans lost on the way to the OTLP collector: the export queue was full (queue_full) "
        "or the collector refused or could not be reached (export_failed).",
        ("reason",),
    ),
    (
        "feedback",
        "cognitive_feedback_total",
        "First verdicts on module answers, by confidence bin (of the reported or calibrated scale).",
        (*FEEDBACK_LABELS, "verdict"),
    ),
    (
        "feedback_confidence",
        "cognitive_feedback_confidence_total",
        "Sum of the confidence of judged answers, per bin: mean confidence = this / count.",
        FEEDBACK_LABELS,
    ),
    (
        "feedback_score",
        "cognitive_feedback_correct_total",
        "Sum of the correctness (1, 0, or the score) of judged answers per bin: accuracy = this / count.",
        FEEDBACK_LABELS,
    ),
    (
        "feedback_brier",
        "cognitive_feedback_brier_total",
        "Sum of (confidence - correctness)^2 of judged answers: Brier score = this / count.",
        ("module", "provider", "model", "scale"),
    ),
    (
        "feedback_outcomes",
        "cognitive_feedback_outcomes_total",
        "First verdicts by tier, decision and gate (above: calibrated confidence >= min_confidence).",
        ("module", "tier", "provider", "model", "decision", "gate", "verdict"),
    ),
    (
        "feedback_replaced",
        "cognitive_feedback_replaced_total",
        "Verdicts that replaced an earlier verdict for the same answer (changed: differs from it).",
        ("module", "changed"),
    ),
    (
        "verdicts",
        "cognitive_verdicts_total",
        "Every verdict recorded on a module answer, by source (human: POST /v1/feedback; shadow: "
        "the proxy's own judge, feedback.shadow).",
        ("module", "source", "verdict"),
    ),
    (
        "shadow_judgements",
        "cognitive_shadow_judgements_total",
        "Shadow judgements by result (agree, disagree: recorded as a verdict; failed: the judge gave "
        "no usable answer; gone: the answer's record expired or was evicted meanwhile).",
        ("module", "result"),
    ),
    (
        "shadow_skipped",
        "cognitive_shadow_skipped_total",
        "Sampled answers not judged: over_budget (feedback.shadow.budget_usd_per_day or a global "
        "budget spent), busy (dropped: the judge's queue full, its 32 judgements waiting for a "
        "moment with no client request in flight).",
        ("reason",),
    ),
    (
        "shadow_spend",
        "cognitive_shadow_spend_usd_total",
        "USD the shadow judge spent (the policy's prices x the judge's usage).",
        (),
    ),
    (
        "shadow_vs_human",
        "cognitive_shadow_human_agreement_total",
        "Answers with both a shadow and a human verdict, by whether they agree.",
        ("module", "agree"),
    ),
    (
        "cost",
        "cognitive_cost_usd",
        "USD spent, from the policy's prices x each answer's usage (client: the key's name).",
        ("module", "provider", "model", "client"),
    ),
    (
        "savings",
        "cognitive_savings_usd",
        "Module calls: top-rung cost of the final answer's usage minus the call's cost, when positive.",
        ("module",),
    ),
    (
        "savings_lost",
        "cognitive_savings_lost_usd",
        "Module calls that cost more than the top rung would have (escalations): the excess.",
        ("module",),
    ),
    (
        "counterfactual",
        "cognitive_counterfactual_cost_usd",
        "Module calls: what the final answers would have cost on the top rung.",
        ("module",),
    ),
    (
        "limited",
        "cognitive_limited_total",
        "Requests refused by a limit (429), by scope (client, team, global) and kind.",
        ("scope", "kind", "client"),
    ),
)
HISTOGRAMS: tuple[tuple[str, str, str, tuple[str, ...], tuple[float, ...]], ...] = (
    (
        "confidence",
        "cognitive_confidence",
        "meta.confidence of module answers.",
        ("module", "tier", "attempt"),
        CONFIDENCE_BUCKETS,
    ),
    (
        "upstream_latency",
        "cognitive_upstream_latency_seconds",
        "Provider attempt latency.",
        ("provider", "model"),
        LATENCY_BUCKETS,
    ),
    (
        "overhead",
        "cognitive_proxy_overhead_seconds",
        "Time spent in the proxy itself per request, upstream time excluded.",
        ("route",),
        OVERHEAD_BUCKETS,
    ),
    (
        "stream_ttfd",
        "cognitive_stream_ttfd_seconds",
        "Time from the start of a streamed module call to its first delta chunk.",
        ("module",),
        LATENCY_BUCKETS,
    ),
    (
        "confidence_calibrated",
        "cognitive_confidence_calibrated",
        "meta.confidence of final module answers through the target's calibration map.",
        ("module", "tier"),
        CONFIDENCE_BUCKETS,
    ),
    (
        "context_mark_wait",
        "cognitive_context_mark_wait_seconds",
        "A session call's wait for another replica's session writes still in flight (its pending-"
        "write marks): seen (gone within the context timeout) or not_seen (the call went on).",
        ("result",),
        OVERHEAD_BUCKETS,
    ),
    (
        "ttft",
        "cognitive_ttft_seconds",
        "Streams: time from the request to the first byte from the provider.",
        ("provider", "model"),
        LATENCY_BUCKETS,
    ),
    (
        "output_tps",
        "cognitive_output_tokens_per_second",
        "Output tokens per second of an answer (streams: after the first token).",
        ("provider", "model"),
        TPS_BUCKETS,
    ),
)
GAUGES: tuple[tuple[str, str, str, tuple[str, ...]], ...] = (
    (
        "inflight_body_bytes",
        "cognitive_inflight_body_bytes",
        "Memory reserved by request bodies in flight, buffered and parsed (the body budget in use).",
        (),
    ),
    (
        "open_connections",
        "cognitive_open_connections",
        "Open client connections, by listener (api, admin).",
        ("listener",),
    ),
    (
        "stream_sessions",
        "cognitive_stream_sessions",
        "Streamed answers still being produced in this process.",
        (),
    ),
    ("info", "cognitive_proxy_info", "Build information.", ("version",)),
    (
        "limits_degraded",
        "cognitive_limits_degraded",
        "1 while limits are enforced per replica (Redis unreachable), 0 while shared.",
        (),
    ),
)
REDIS_UP = "cognitive_redis_up"
OUTBOX_PENDING = "cognitive_outbox_pending"
GaugeMode = Literal["livesum", "livemax", "livemin"]
GAUGE_MODES: dict[str, GaugeMode] = {
    "cognitive_inflight_body_bytes": "livesum",
    "cognitive_open_connections": "livesum",
    "cognitive_stream_sessions": "livesum",
    "cognitive_proxy_info": "livemax",
    "cognitive_limits_degraded": "livemax",
    REDIS_UP: "livemin",
    OUTBOX_PENDING: "livesum",
    BreakerCollector.NAME: "livemax",
    ThresholdCollector.NAME: "livemax",
}
"""How each gauge combines over the workers of ``serve --workers N``: counts add up, a flag is
1 when any worker has it (Redis: 0 when any worker cannot reach it). ``live``: a worker that
exited no longer counts (the supervisor marks it dead)."""
SHARE_INTERVAL_S = 1.0
_SLOT_BYTES = 16
_pack_slot = struct.Struct("dd").pack
"""A multiprocess value's slot in its file: the value and its timestamp (prometheus-client's
``mmap_dict`` layout)."""
"""How often a worker copies its scrape-time gauges into the shared files."""


Amount = Callable[[float], None]
"""A remembered child's ``inc`` or ``observe``."""


def adding(value: Any) -> Amount:
    """``value.inc`` (a prometheus-client value) without its lock and its per-call checks: the hot
    children are written on the event loop's thread only, and read there too (``/metrics`` renders
    on the loop), so the lock guards nothing. A value of this process alone (``MutexValue``) is
    added to in place (its lock costs about 3 k instructions an increment, callgrind); a worker's
    value (``--workers``: prometheus-client's multiprocess value) is added to and written to its
    slot of the shared file at once, as its own ``inc`` writes it, without its lock, its fork check
    (the worker's identity is pinned: ``_pin_worker_identity``) and the file's key lookup: 2-3 k
    instructions less an update, about 20 updates a request."""
    if not hasattr(value, "_value"):
        inc: Amount = value.inc
        return inc
    if not getattr(value, "_multiprocess", True):

        def add(amount: float) -> None:
            value._value += amount

        return add
    shared = value._file
    start = shared._positions[value._key]  # made when the value was created (it reads its slot)
    end = start + _SLOT_BYTES

    def add_and_share(amount: float) -> None:
        total = value._value = value._value + amount
        # shared._m: read per write, the file's mapping is replaced when it grows. A slice
        # assignment, as prometheus-client writes it (its note: pack_into could be read as 0).
        shared._m[start:end] = _pack_slot(total, 0.0)

    return add_and_share


def _own(value: Any) -> bool:
    """Whether ``value`` is this process's own (``MutexValue``): added to without its lock."""
    return not getattr(value, "_multiprocess", True) and hasattr(value, "_value")


def counting(child: Counter) -> Amount:
    """A counter child's ``inc`` without ``Counter.inc``'s checks on every call (is it a child,
    is the amount negative, an exemplar): its value's own addition (``adding``). For amounts that
    cannot be negative (counts, durations, prices)."""
    return adding(cast(Any, child)._value)


def observing(child: Histogram) -> Amount:
    """A histogram child's ``observe``, as ``Histogram.observe`` counts it (the sum, then the first
    bucket whose bound is >= the amount; a NaN in no bucket), without its per-call checks and its
    walk over the bounds (``bisect``, in C)."""
    raw = cast(Any, child)
    add_to_sum = adding(raw._sum)
    buckets: tuple[Amount, ...] = tuple(adding(bucket) for bucket in raw._buckets)
    bounds: tuple[float, ...] = tuple(raw._upper_bounds)

    def observe(amount: float) -> None:
        add_to_sum(amount)
        if amount == amount:  # not NaN: bisect would put it in the first bucket
            buckets[bisect_left(bounds, amount)](1)

    return observe


def counting_observing(counter: Counter, histogram: Histogram) -> Amount:
    """``counting(counter)(1)`` and ``observing(histogram)(amount)`` in one call, without a call
    per value when every value is this process's own (``_own``): a request's (or an attempt's)
    count and duration, one Python frame instead of four."""
    raw = cast(Any, histogram)
    count, total = cast(Any, counter)._value, raw._sum
    buckets = tuple(raw._buckets)
    if not all(_own(value) for value in (count, total, *buckets)):
        inc, observe = counting(counter), observing(histogram)

        def through(amount: float) -> None:
            inc(1)
            observe(amount)

        return through
    bounds: tuple[float, ...] = tuple(raw._upper_bounds)

    def both(amount: float) -> None:
        count._value += 1
        total._value += amount
        if amount == amount:  # not NaN (as ``observing``)
            buckets[bisect_left(bounds, amount)]._value += 1

    return both


Usage = Callable[[int, int, float], None]
"""``(prompt, completion, speed)``: tokens of one answer and its output speed; 0 adds nothing."""


def usage_adding(prompts: Counter, completions: Counter, speed: Histogram) -> Usage:
    """The ``tokens`` counters (prompt, completion) and the ``output_tps`` histogram of one
    (provider, model) in one call; each amount 0 (or less) is left out. Without a call per value
    when every value is this process's own (``_own``)."""
    raw = cast(Any, speed)
    prompt, completion = cast(Any, prompts)._value, cast(Any, completions)._value
    total, buckets = raw._sum, tuple(raw._buckets)
    if not all(_own(value) for value in (prompt, completion, total, *buckets)):
        add_prompt, add_completion, observe = counting(prompts), counting(completions), observing(speed)

        def through(prompt_n: int, completion_n: int, tps: float) -> None:
            if prompt_n > 0:
                add_prompt(prompt_n)
            if completion_n > 0:
                add_completion(completion_n)
            if tps:
                observe(tps)

        return through
    bounds: tuple[float, ...] = tuple(raw._upper_bounds)

    def add(prompt_n: int, completion_n: int, tps: float) -> None:
        if prompt_n > 0:
            prompt._value += prompt_n
        if completion_n > 0:
            completion._value += completion_n
        if tps:
            total._value += tps
            if tps == tps:  # not NaN (as ``observing``)
                buckets[bisect_left(bounds, tps)]._value += 1

    return add


class Hot:
    """A remembered child (``Metrics.child``): ``inc(amount)`` of a counter, ``observe(amount)``
    of a histogram, each without prometheus-client's per-call checks (``counting``,
    ``observing``)."""

    __slots__ = ("inc", "observe")

    def __init__(self, child: Counter | Histogram) -> None:
        if isinstance(child, Histogram):
            self.observe = observing(child)
        else:
            self.inc = counting(child)


class Metrics:
    """Every metric the proxy exports, on its own registry (built from the tables above)."""

    requests: Counter
    risk: Counter
    decisions: Counter
    escalations: Counter
    repairs: Counter
    risk_disagreements: Counter
    composition_steps: Counter
    tools_stripped: Counter
    contract_errors: Counter
    upstream_requests: Counter
    stream_incomplete: Counter
    failovers: Counter
    tokens: Counter
    policy_reloads: Counter
    review_sink_failures: Counter
    review_dropped: Counter
    outbox_replica_shortfalls: Counter
    review_console: Counter
    review_queue_evicted: Counter
    cache: Counter
    cache_saved_tokens: Counter
    context_redactions: Counter
    context_evictions: Counter
    context_writes_dropped: Counter
    feedback_writes_dropped: Counter
    feedback_capped: Counter
    connections_refused: Counter
    streams: Counter
    stream_resumptions: Counter
    stream_mirror_dropped: Counter
    trace_spans_dropped: Counter
    feedback: Counter
    feedback_confidence: Counter
    feedback_score: Counter
    feedback_brier: Counter
    feedback_outcomes: Counter
    feedback_replaced: Counter
    verdicts: Counter
    shadow_judgements: Counter
    shadow_skipped: Counter
    shadow_spend: Counter
    shadow_vs_human: Counter
    cost: Counter
    savings: Counter
    savings_lost: Counter
    counterfactual: Counter
    limited: Counter
    confidence: Histogram
    upstream_latency: Histogram
    overhead: Histogram
    stream_ttfd: Histogram
    confidence_calibrated: Histogram
    context_mark_wait: Histogram
    ttft: Histogram
    output_tps: Histogram
    inflight_body_bytes: Gauge
    open_connections: Gauge
    stream_sessions: Gauge
    info: Gauge
    limits_degraded: Gauge

    def __init__(self, *, multiprocess: bool = False) -> None:
        """``multiprocess``: this process is one of ``--workers`` (prometheus-client must have
        been imported with ``PROMETHEUS_MULTIPROC_DIR`` set)."""
        r = self.registry = CollectorRegistry(auto_describe=True)
        for attr, name, doc, labels in COUNTERS:
            setattr(self, attr, Counter(name, doc, labels, registry=r))
        for attr, name, doc, labels, buckets in HISTOGRAMS:
            setattr(self, attr, Histogram(name, doc, labels, buckets=buckets, registry=r))
        for attr, name, doc, labels in GAUGES:
            setattr(self, attr, Gauge(name, doc, labels, registry=r, multiprocess_mode=GAUGE_MODES[name]))
        self._all_workers: CollectorRegistry | None = None
        self._live: list[tuple[Collector, Gauge]] = []
        """Scrape-time sources and the gauge their values are copied into (workers only)."""
        if multiprocess:
            self._all_workers = CollectorRegistry()
            MultiProcessCollector(self._all_workers)  # type: ignore[no-untyped-call]
            self._live = [(gauge, gauge) for gauge in (getattr(self, attr) for attr, *_ in GAUGES)]

        # labels() takes a lock and validates on every call; the hot path keeps its children.
        self._request_children: dict[tuple[str, str, int, str], Amount] = {}
        self._upstream_children: dict[tuple[str, str, str], Amount] = {}
        self._children: dict[tuple[int, tuple[str, ...]], Hot] = {}
        self._usage_children: dict[tuple[str, str], Usage] = {}

    def child(self, metric: Counter | Histogram, *labels: str) -> Hot:
        """``metric.labels(*labels)``, remembered, as a ``Hot`` child. Label values are bounded
        (``target_labels``, client labels), so the cache is too."""
        key = (id(metric), labels)
        found = self._children.get(key)
        if found is None:
            found = self._children[key] = Hot(metric.labels(*labels))
        return found

    def usage_children(self, provider: str, model: str) -> Usage:
        """The prompt and completion ``tokens`` counters and the ``output_tps`` histogram of one
        (provider, model), remembered together as one call (``usage_adding``)."""
        key = (provider, model)
        found = self._usage_children.get(key)
        if found is None:
            found = self._usage_children[key] = usage_adding(
                self.tokens.labels(provider, model, "prompt"),
                self.tokens.labels(provider, model, "completion"),
                self.output_tps.labels(provider, model),
            )
        return found

    def observe_request(self, route: str, module: str, status: int, outcome: str, overhead_s: float) -> None:
        """One finished request: ``cognitive_requests_total`` and its proxy overhead, through one
        remembered call (``counting_observing``)."""
        key = (route, module, status, outcome)
        count = self._request_children.get(key)
        if count is None:
            count = self._request_children[key] = counting_observing(
                self.requests.labels(route, module, str(status), outcome), self.overhead.labels(route)
            )
        count(overhead_s)

    def upstream_child(self, provider: str, model: str, outcome: str) -> Amount:
        """``cognitive_upstream_requests_total`` and the upstream latency of one (provider, model,
        outcome), remembered as one call (``counting_observing``): called with the seconds."""
        key = (provider, model, outcome)
        count = self._upstream_children.get(key)
        if count is None:
            count = self._upstream_children[key] = counting_observing(
                self.upstream_requests.labels(provider, model, outcome),
                self.upstream_latency.labels(provider, model),
            )
        return count

    def observe_upstream(self, provider: str, model: str, outcome: str, seconds: float) -> None:
        self.upstream_child(provider, model, outcome)(seconds)

    def watch_redis(self, up: Callable[[], bool]) -> None:
        """``cognitive_redis_up``: 1 while Redis answers (only with ``--redis-url``)."""
        gauge = Gauge(
            REDIS_UP,
            "1 while the Redis of --redis-url answers.",
            registry=self.registry,
            multiprocess_mode=GAUGE_MODES[REDIS_UP],
        )
        gauge.set_function(lambda: 1.0 if up() else 0.0)
        if self._all_workers is not None:
            self._live.append((gauge, gauge))

    def watch_outbox(self, pending: Callable[[], int]) -> None:
        """``cognitive_outbox_pending``: records the Redis outbox holds (only with ``--redis-url``)."""
        gauge = Gauge(
            OUTBOX_PENDING,
            "Records the Redis outbox holds: not yet written, or (--redis-durable-replicas) not yet "
            "confirmed by the replicas.",
            registry=self.registry,
            multiprocess_mode=GAUGE_MODES[OUTBOX_PENDING],
        )
        gauge.set_function(lambda: float(pending()))
        if self._all_workers is not None:
            self._live.append((gauge, gauge))

    def watch_thresholds(self, thresholds: Callable[[], Iterable[tuple[str, float]]]) -> None:
        self._watch(ThresholdCollector(thresholds))

    def watch_breakers(self, snapshot: Callable[[], Iterable[tuple[str, bool]]]) -> None:
        self._watch(BreakerCollector(snapshot))

    def _watch(self, collector: BreakerCollector | ThresholdCollector) -> None:
        self.registry.register(collector)
        if self._all_workers is not None:  # a gauge outside the registry: it only writes the files
            mirror = Gauge(
                collector.NAME,
                collector.DOC,
                collector.LABELS,
                registry=None,
                multiprocess_mode=GAUGE_MODES[collector.NAME],
            )
            self._live.append((collector, mirror))

    def exposed(self) -> CollectorRegistry:
        """What ``/metrics`` renders: this process's registry, or, in a worker, every worker's
        values (this one's scrape-time gauges copied first, so they are current)."""
        if self._all_workers is None:
            return self.registry
        self.share_live_values()
        return self._all_workers

    def share_live_values(self) -> None:
        """Copy the scrape-time gauges into the shared files (workers only)."""
        for source, gauge in self._live:
            for family in source.collect():
                for sample in family.samples:
                    (gauge.labels(**sample.labels) if sample.labels else gauge).set(sample.value)

    async def share_every(self, seconds: float = SHARE_INTERVAL_S) -> None:
        """``share_live_values`` every ``seconds``, so a scrape on another worker sees this one's."""
        while True:
            self.share_live_values()
            await asyncio.sleep(seconds)
