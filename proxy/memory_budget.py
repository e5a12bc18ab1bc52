"""What the proxy's memory bounds add up to, against the limit it runs under (issue #29.5).

One table: every in-process store with a bound, the bytes that bound allows, read from the same
settings, policy fields and constants the stores themselves use, plus the measured baseline of a
worker. ``cogproxy serve`` refuses to start when the bounds of all its workers exceed the memory
limit (``--memory-limit``, else the cgroup's), the manifests in ``deploy/`` are sized from this
table (``tests/deploy/test_memory_budget.py``), and docs/deployment.md shows it.

Counted per worker: each worker keeps its own stores. A policy reload may raise the policy's
bounds (``feedback.max_entries``, ``media.cache_max_bytes``) past what was checked at start.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from proxy.context.store import MEMORY_ENTRY_OVERHEAD_BYTES, MEMORY_MAX_BYTES, MEMORY_MAX_ENTRIES
from proxy.policy.model import Policy
from proxy.settings import MiB, Settings
from proxy.state.feedback import RECORD_MAX_BYTES
from proxy.state.review_queue import BOUND_BYTES as REVIEW_QUEUE_BYTES

BASELINE_BYTES = 72 * MiB
"""A worker's RSS with every store empty, after warm-up: interpreter, aiohttp, prometheus, the
policy and bundled modules, connection pools (``make bench``: 66-70 MiB)."""
SUPERVISOR_BYTES = 32 * MiB
"""The parent process under ``--workers`` (it serves nothing and keeps no store)."""
CGROUP_ROOT = Path("/sys/fs/cgroup")
CGROUP_UNLIMITED = 1 << 62
"""cgroup v1 writes "no limit" as a page-rounded 2**63 - 1; anything this large is none."""


@dataclass(frozen=True, slots=True)
class Bound:
    store: str
    setting: str
    """Where an operator changes it."""
    bytes: int


def bounds(settings: Settings, policy: Policy) -> tuple[Bound, ...]:
    """Each store's bound in one worker, in bytes, from the values the stores are built with."""
    context = 0 if settings.redis_url else MEMORY_MAX_BYTES + MEMORY_MAX_ENTRIES * MEMORY_ENTRY_OVERHEAD_BYTES
    streamed = policy.review.sink == "redis-stream" and settings.redis_url  # the console reads Redis
    review = REVIEW_QUEUE_BYTES if settings.serves_console and not streamed else 0
    return (
        Bound("baseline (measured)", "BASELINE_BYTES", BASELINE_BYTES),
        Bound("request bodies in flight", "--max-inflight-body-bytes", settings.max_inflight_body_bytes),
        Bound("stream sessions", "--stream-session-max-bytes", settings.stream_session_max_bytes),
        Bound("feedback store", "feedback.max_entries", policy.feedback.max_entries * RECORD_MAX_BYTES),
        Bound("context store and result cache (0 with Redis)", "--redis-url", context),
        Bound("media cache", "media.cache_max_bytes", policy.media.cache_max_bytes),
        Bound("review console queue (0 without it, or on the Redis stream)", "--admin-keys", review),
    )


def per_worker(settings: Settings, policy: Policy) -> int:
    return sum(bound.bytes for bound in bounds(settings, policy))


def total(settings: Settings, policy: Policy) -> int:
    """All processes of one ``cogproxy serve``: its workers and, with several, the supervisor."""
    workers = settings.workers
    return per_worker(settings, policy) * workers + (SUPERVISOR_BYTES if workers > 1 else 0)


def mib(size: int) -> str:
    return f"{size / MiB:.1f} MiB"


def over_limit(settings: Settings, policy: Policy, limit: int, source: str) -> str | None:
    """One line naming every number when the bounds exceed ``limit``, else None."""
    need = total(settings, policy)
    if need <= limit:
        return None
    parts = ", ".join(f"{b.store} {mib(b.bytes)}" for b in bounds(settings, policy) if b.bytes)
    workers = settings.workers
    how = f"{mib(per_worker(settings, policy))} per worker" + (
        f" x {workers} workers + {mib(SUPERVISOR_BYTES)} supervisor" if workers > 1 else ""
    )
    return (
        f"memory bounds need {mib(need)} ({how}: {parts}), over the memory limit of {mib(limit)} "
        f"({source}); lower the bounds, raise the limit, or pass --memory-limit 0 to start anyway"
    )


_CGROUP_VALUE = re.compile(rb"[0-9]{1,19}")


def cgroup_limit(root: Path = CGROUP_ROOT) -> int | None:
    """The memory limit of this process's cgroup (v2 ``memory.max``, v1
    ``memory/memory.limit_in_bytes``); None when there is none or it cannot be read."""
    for path in (root / "memory.max", root / "memory" / "memory.limit_in_bytes"):
        try:
            text = path.read_bytes().strip()
        except OSError:
            continue
        # The kernel writes ASCII digits of an int64 or "max"; anything else is no usable limit.
        if _CGROUP_VALUE.fullmatch(text) is None:
            return None
        value = int(text)
        return None if value >= CGROUP_UNLIMITED else value
    return None


_SIZE = re.compile(r"^\s*(\d+)\s*(|k|ki|m|mi|g|gi|kb|mb|gb)\s*$", re.IGNORECASE | re.ASCII)
_UNITS = {"": 1, "k": 1000, "kb": 1000, "m": 1000**2, "mb": 1000**2, "g": 1000**3, "gb": 1000**3}
_UNITS |= {"ki": 1 << 10, "mi": 1 << 20, "gi": 1 << 30}


def memory_size(text: str) -> int:
    """Bytes from ``268435456``, ``256Mi``, ``1Gi``, ``512M`` (Kubernetes' quantities)."""
    found = _SIZE.match(text)
    if found is None:
        raise ValueError(text)
    return int(found[1]) * _UNITS[found[2].lower()]


def refusal(settings: Settings, policy: Policy, limit: int | None, root: Path = CGROUP_ROOT) -> str | None:
    """Why ``serve`` must not start: the bounds exceed ``limit`` (``--memory-limit``), else the
    cgroup's limit; ``limit`` 0 checks nothing."""
    source = "--memory-limit"
    if limit is None:
        limit, source = cgroup_limit(root), f"the cgroup's, {root}"
    if not limit:
        return None
    return over_limit(settings, policy, limit, source)


def markdown(settings: Settings, policy: Policy) -> str:
    """The table as docs/deployment.md shows it (its test keeps the two equal)."""
    rows = [
        "| what | set by | bytes per worker |",
        "| --- | --- | --- |",
        *(f"| {b.store} | `{b.setting}` | {mib(b.bytes)} |" for b in bounds(settings, policy)),
        f"| **total** | | **{mib(per_worker(settings, policy))}** |",
    ]
    return "\n".join(rows) + "\n"
