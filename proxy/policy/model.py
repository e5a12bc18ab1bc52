"""The routing policy as frozen, typed values (parsed once from YAML by ``loader``)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Literal, Protocol

from proxy.contract.risk import DEFAULT_RISK_SOURCE, Risk, RiskSource
from proxy.policy.calibration import CalibrationMap
from proxy.policy.limits import LimitsPolicy, Price
from proxy.policy.provider_kinds import PROVIDER_KINDS, ProviderKind

Exhausted = Literal["reject", "review", "accept"]


@dataclass(frozen=True, slots=True)
class ProviderConfig:
    name: str
    kind: str
    """A key of ``proxy.policy.provider_kinds.PROVIDER_KINDS``."""
    base_url: str = ""
    api_key_env: str | None = None
    forward_client_key: bool = False
    """Send the client's own bearer key upstream instead of ``api_key_env`` (off by default)."""
    allow_any_model: bool = False
    """Passthrough chat may name any ``<provider>/<model>`` of this provider, not only the models
    the policy names; such models share one breaker state, ``<provider>/*``."""
    headers: Mapping[str, str] = field(default_factory=dict)
    options: Mapping[str, Any] = field(default_factory=dict)
    """Provider-specific settings (the offline provider's script, an Anthropic version)."""


ANY_MODEL = "*"
"""The model part of the one breaker state an ``allow_any_model`` provider keeps for the models
the policy does not name."""


@dataclass(frozen=True, slots=True)
class Target:
    provider: str
    model: str
    state: str | None = None
    """The breaker key, when not ``provider/model`` (``provider/*`` for a model the policy does
    not name): per-target state stays bounded by the policy, whatever names clients send."""
    name: str = field(init=False, repr=False, compare=False)
    """``provider/model``, built once: labels, headers and log lines ask for it on every call."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "name", f"{self.provider}/{self.model}")

    def __str__(self) -> str:
        return self.name

    @property
    def state_key(self) -> str:
        return self.state or self.name


@dataclass(frozen=True, slots=True)
class Rung:
    name: str
    targets: tuple[Target, ...]


@dataclass(frozen=True, slots=True)
class Thresholds:
    """A tier's entry (or a module's override of it): what is accepted, where to start."""

    min_confidence: float
    max_risk: Risk
    exhausted: Exhausted = "reject"
    start: str | None = None
    reask: int = 0
    risk_source: RiskSource = DEFAULT_RISK_SOURCE
    """Which risk is routed on: the model's ``meta.risk``, the module's ``risk_rule`` over the
    data, or the higher of the two (``max``; spec v2.2 §2.4: risk SHOULD follow the rule)."""


@dataclass(frozen=True, slots=True)
class Timeouts:
    per_try_s: float = 30.0
    """Bounds one provider attempt: until its answer is read, or a stream's first chunk."""
    total_s: float = 90.0
    """Bounds the whole call, retries, backoff, re-asks, escalations and answer reads included;
    a stream only up to its first chunk."""
    stream_idle_s: float | None = None
    """Longest gap between a stream's chunks after its first one; None: ``per_try_s``."""
    stream_total_s: float | None = None
    """Bounds a stream from its request to its last byte; None: unbounded (idle gaps only)."""

    @property
    def idle_s(self) -> float:
        return self.per_try_s if self.stream_idle_s is None else self.stream_idle_s


@dataclass(frozen=True, slots=True)
class Backoff:
    base_ms: float = 100.0
    max_ms: float = 2000.0

    def wait_s(self, retry: int, rng: Callable[[], float]) -> float:
        """Full jitter: uniform in [0, min(max, base * 2**retry)] (the router's and the webhook's)."""
        return float(rng() * min(self.max_ms, self.base_ms * (2**retry)) / 1000)


@dataclass(frozen=True, slots=True)
class BreakerPolicy:
    """When a target's breaker opens (resilience4j/Hystrix rate breaker, optionally Envoy's
    consecutive-failure outlier detection) and how it closes again."""

    failure_rate: float = 0.5
    """Open when failures / outcomes in the window reach this share (and ``min_requests``)."""
    min_requests: int = 20
    """Outcomes the window must hold before its failure rate can open the breaker."""
    window_s: float = 30.0
    """The sliding window over which outcomes are counted."""
    open_s: float = 30.0
    """How long an open breaker skips the target before its half-open trial."""
    consecutive_failures: int | None = None
    """Also open after this many failures in a row (None: off)."""
    half_open_requests: int = 1
    """Trial requests let through after ``open_s``; all must succeed to close the breaker."""


@dataclass(frozen=True, slots=True)
class RetryBudget:
    """Envoy-style: retries in flight may be at most ``percent`` of requests in flight, but
    ``min_concurrency`` retries are always allowed; and a request's first ``min_per_target``
    retries on each target are outside the shared budget, so a burst of failures cannot use it
    up (#29.3)."""

    percent: float = 20.0
    min_concurrency: int = 3
    min_per_target: int = 1
    """Retries a request may make on each target whatever the shared budget holds (0: none)."""


RetryOn = Literal["connect", "timeout", "429", "5xx", "malformed"]


@dataclass(frozen=True, slots=True)
class Failover:
    retries: int = 2
    """Retries per target (first try not counted), for failures listed in ``retry_on``."""
    retry_on: frozenset[RetryOn] = frozenset({"connect", "timeout", "429", "5xx"})
    backoff: Backoff = Backoff()
    timeouts: Timeouts = Timeouts()
    breaker: BreakerPolicy = BreakerPolicy()
    budget: RetryBudget = RetryBudget()


ReviewSinkKind = Literal["log", "redis-stream", "webhook"]


@dataclass(frozen=True, slots=True)
class ReviewPolicy:
    sink: ReviewSinkKind = "log"
    stream: str = "cognitive:review"
    """redis-stream: the stream key (the Redis of ``--redis-url``)."""
    maxlen: int = 10000
    """redis-stream: approximate MAXLEN of the stream."""
    url: str | None = None
    """webhook: where records are POSTed."""
    timeout_s: float = 5.0
    retries: int = 3


CacheDecision = Literal["accept", "escalated"]


@dataclass(frozen=True, slots=True)
class CacheRule:
    """``cache.tiers.<tier>`` or ``cache.modules.<module>``: how accepted answers are reused."""

    ttl_s: int = 3600
    """Seconds an entry is served; -1 never expires; 0 turns caching off."""
    only_decisions: frozenset[CacheDecision] = frozenset({"accept"})


DEFAULT_CLIENT_MAX_ENTRIES = 10_000
DEFAULT_CLIENT_MAX_BYTES = 8 * 1024 * 1024
"""Half the in-process store (16 MiB): one client never holds it all, and a busy client's
answers and contexts (about 1-10 KB each) still number in the thousands."""


@dataclass(frozen=True, slots=True)
class CachePolicy:
    tiers: Mapping[str, CacheRule] = field(default_factory=dict)
    modules: Mapping[str, CacheRule] = field(default_factory=dict)
    client_max_entries: int = DEFAULT_CLIENT_MAX_ENTRIES
    """Per client, in the context store (memory and Redis): cached answers and context items,
    persistent ones included; past it the client's own least recently used go first."""
    client_max_bytes: int = DEFAULT_CLIENT_MAX_BYTES

    def rule_for(self, module: str, tier: str) -> CacheRule | None:
        """The module's rule, else its tier's; None when neither is configured."""
        return self.modules.get(module) or self.tiers.get(tier)


@dataclass(frozen=True, slots=True)
class PassthroughRoute:
    prefix: str
    providers: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class PassthroughPolicy:
    """Where ``/v1/*`` paths the proxy does not handle itself go (embeddings, files, audio...)."""

    provider: str | None = None
    routes: tuple[PassthroughRoute, ...] = ()


DEFAULT_FEEDBACK_WINDOW_S = 7 * 24 * 3600.0
DEFAULT_FEEDBACK_MAX_ENTRIES = 10_000
"""At most ``RECORD_MAX_BYTES`` (2.25 KiB) a record, the in-process store stays within 22.0 MiB
(100,000 did not fit the shipped container with the other bounds; issue #29.5). Each worker
keeps its own; a sidecar that judges more answers later shares a Redis (``--redis-url``)."""


@dataclass(frozen=True, slots=True)
class ShadowPolicy:
    """``feedback.shadow``: verdicts without humans. A sampled share of accepted answers of a rung
    below ``judge_rung`` is asked again there after the client has its answer; agreement on the
    module's decision fields is recorded as a verdict with ``source: shadow``."""

    rate: float = 0.0
    """Share of eligible answers judged (0: off), sampled by a keyed hash of the trace id."""
    judge_rung: str | None = None
    """The rung that judges (None: the ladder's top rung)."""
    seed: str | None = None
    """Keys the sample (the same answers judged on every replica, reproducibly); None: a key of
    each process's own, drawn at start. Clients choose trace ids: one that knew the key could
    choose which of its answers are judged."""
    budget_usd_per_day: float = 1.0
    """The judge's spend per UTC day, all replicas together with ``--redis-url``; past it answers
    are not judged (``cognitive_shadow_skipped_total{reason="over_budget"}``)."""
    modules: tuple[str, ...] = ()
    """Modules judged (empty: every module)."""

    @property
    def enabled(self) -> bool:
        return self.rate > 0

    def judges(self, module: str) -> bool:
        return self.enabled and (not self.modules or module in self.modules)


@dataclass(frozen=True, slots=True)
class FeedbackPolicy:
    """How long module answers are remembered for ``POST /v1/feedback``."""

    window_s: float = DEFAULT_FEEDBACK_WINDOW_S
    max_entries: int = DEFAULT_FEEDBACK_MAX_ENTRIES
    """The in-process store's bound (least recently written dropped first); Redis expires by time."""
    max_per_day: int = 0
    """Records one replica adds to Redis in a UTC day (0: no cap); past it an answer stays in
    this replica's memory only (``cognitive_feedback_capped_total``)."""
    shadow: ShadowPolicy = ShadowPolicy()


MB = 1024 * 1024


@dataclass(frozen=True, slots=True)
class MediaPolicy:
    """How module media inputs are fetched and prepared (spec v2.5 §4.3, §11.1)."""

    allow_http: bool = False
    """Fetch ``http://`` URLs too (https only by default)."""
    allowed_hosts: tuple[str, ...] = ()
    """When set, only these hosts (``*.example.com`` for subdomains) are fetched from."""
    trusted_hosts: tuple[str, ...] = ()
    """``host:port`` entries that may resolve to private addresses (an internal asset server);
    a bare host stands for ports 80 and 443 only. Other hosts and ports, redirects included,
    are still held to ordinary global addresses."""
    max_redirects: int = 3
    fetch_timeout_s: float = 10.0
    """Bounds one fetch, redirects included; never beyond the call's own deadline."""
    strip_metadata: bool = False
    """Re-encode images without EXIF/metadata before they are sent (decodes the image)."""
    cache_max_bytes: int = 32 * MB
    """Fetched media kept for a client's retry; 0 turns the cache off."""
    cache_ttl_s: float = 300.0


Modalities = frozenset[str]
Capabilities = frozenset[str]


class NeedsCapabilities(Protocol):
    @property
    def structured_output(self) -> bool: ...

    @property
    def preferred_capabilities(self) -> tuple[str, ...]: ...


def required_capabilities(runtime: NeedsCapabilities) -> Capabilities:
    """What a target must have to serve a module: ``structured_output`` when the module's
    ``runtime_requirements`` ask for it (its default). ``preferred_capabilities`` only order."""
    return frozenset({"structured_output"}) if runtime.structured_output else frozenset()


@dataclass(frozen=True, slots=True)
class Policy:
    providers: Mapping[str, ProviderConfig]
    ladder: tuple[Rung, ...]
    tiers: Mapping[str, Thresholds]
    modules: Mapping[str, Mapping[str, Any]]
    """Per-module overrides: the fields they name replace those of the module's tier entry."""
    aliases: Mapping[str, str]
    failover: Failover = Failover()
    review: ReviewPolicy = ReviewPolicy()
    passthrough: PassthroughPolicy = PassthroughPolicy()
    cache: CachePolicy = CachePolicy()
    media: MediaPolicy = MediaPolicy()
    modalities: Mapping[str, Modalities] = field(default_factory=dict)
    """Input modalities per ``provider/model`` or per ``provider``, as the policy declares them."""
    capabilities: Mapping[str, Capabilities] = field(default_factory=dict)
    """Capabilities per ``provider/model`` or per ``provider``, as the policy declares them."""
    source: str = "<memory>"
    known_targets: frozenset[str] = frozenset()
    """Every ``provider/model`` the policy names (ladder and aliases): the bounded label set."""
    prices: Mapping[str, Price] = field(default_factory=dict)
    """USD per million tokens, by ``provider/model`` target; unpriced targets cost 0."""
    limits: LimitsPolicy = field(default_factory=LimitsPolicy)

    def price_of(self, target: str) -> Price | None:
        return self.prices.get(target)

    calibration: Mapping[str, CalibrationMap] = field(default_factory=dict)
    """Per target: reported -> calibrated confidence, applied before ``decide()``."""
    feedback: FeedbackPolicy = FeedbackPolicy()

    def calibrate(self, target: str, confidence: float) -> float:
        """The confidence decided on for ``target``'s answer (the reported one without a map)."""
        mapping = self.calibration.get(target)
        return confidence if mapping is None else mapping(confidence)

    @property
    def timeouts(self) -> Timeouts:
        return self.failover.timeouts

    def _kind_of(self, target: Target) -> ProviderKind | None:
        provider = self.providers.get(target.provider)
        return PROVIDER_KINDS.get(provider.kind) if provider else None

    def modalities_of(self, target: Target) -> Modalities:
        """What ``target`` accepts: its own entry, else its provider's, else its kind's default."""
        declared = self.modalities.get(str(target)) or self.modalities.get(target.provider)
        if declared is not None:
            return declared
        kind = self._kind_of(target)
        return kind.modalities if kind else frozenset({"text"})

    def capabilities_of(self, target: Target) -> Capabilities:
        """What ``target`` can do: its own entry, else its provider's, else its kind's default."""
        declared = self.capabilities.get(str(target))
        if declared is None:
            declared = self.capabilities.get(target.provider)
        if declared is not None:
            return declared
        kind = self._kind_of(target)
        return kind.capabilities if kind else frozenset()

    def capable(self, targets: tuple[Target, ...], runtime: NeedsCapabilities) -> tuple[Target, ...]:
        """The targets that have every capability the module requires; those that also have all
        of its ``preferred_capabilities`` first when the policy declares capabilities (a stable
        sort: the failover order is otherwise kept)."""
        needed = required_capabilities(runtime)
        preferred = frozenset(runtime.preferred_capabilities)
        able = [t for t in targets if needed <= self.capabilities_of(t)]
        if not preferred or not self.capabilities:  # kind defaults never reorder a ladder
            return tuple(able)
        return tuple(sorted(able, key=lambda t: not preferred <= self.capabilities_of(t)))

    def missing_capabilities(self, runtime: NeedsCapabilities) -> list[str]:
        """The required capabilities that no target of the ladder has."""
        offered: set[str] = set()
        for rung in self.ladder:
            for target in rung.targets:
                offered |= self.capabilities_of(target)
        missing = sorted(required_capabilities(runtime) - offered)
        if missing:
            return missing
        return sorted(required_capabilities(runtime))  # each is somewhere, never all on one target

    def rung_index(self, name: str) -> int | None:
        for i, rung in enumerate(self.ladder):
            if rung.name == name:
                return i
        return None

    def thresholds_for(self, module: str, tier: str) -> Thresholds:
        """The module's tier entry with the module's overrides applied."""
        base = self.tiers[tier]
        override = self.modules.get(module)
        return replace(base, **override) if override else base

    def start_rung(self, thresholds: Thresholds) -> int:
        if thresholds.start is None:
            return 0
        index = self.rung_index(thresholds.start)
        return 0 if index is None else index
