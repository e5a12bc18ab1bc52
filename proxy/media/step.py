"""The media step of a module call: prepare the inputs, pick the targets that can take them."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from proxy.contract.errors import error_envelope
from proxy.media.cache import ClientCache
from proxy.media.model import Media
from proxy.media.resolve import FetchWatch, MediaRequest, MemoryBudget, NoBudget, prepare
from proxy.media.types import LIMITS, MB, MediaError
from proxy.policy.model import MediaPolicy, Policy, Target


class MediaModule(Protocol):
    """What the media step reads of a module (``proxy.module.model.Module`` satisfies it): the
    media layer sits below the module layer and never imports it."""

    @property
    def path(self) -> Path: ...
    @property
    def input_modalities(self) -> frozenset[str]: ...


@dataclass(frozen=True, slots=True)
class MediaEnv:
    """What a request lends its media step: its memory budget and the fetched-media cache."""

    budget: MemoryBudget = field(default_factory=NoBudget)
    cache: ClientCache | None = None
    watch: FetchWatch | None = None
    """Wraps each URL fetch (tracing on: its span)."""


async def prepare_media(
    module: MediaModule, value: Any, settings: MediaPolicy, deadline: float, env: MediaEnv
) -> tuple[Media, ...] | dict[str, Any]:
    """The call's validated media, or the error envelope that refuses the call."""
    request = MediaRequest(
        module.path, module.input_modalities, settings, deadline, env.budget, env.cache, env.watch
    )
    try:
        return await prepare(value, request)
    except MediaError as exc:
        return error_envelope(exc.code, exc.message, details=exc.details)


def needed(media: Sequence[Media]) -> frozenset[str]:
    return frozenset(m.category for m in media)


def capable(targets: Sequence[Target], policy: Policy, media: Sequence[Media]) -> tuple[Target, ...]:
    """The targets whose declared modalities cover every media of the call."""
    want = needed(media)
    return tuple(t for t in targets if want <= policy.modalities_of(t))


def unsupported(policy: Policy, media: Sequence[Media], start: int) -> dict[str, Any] | None:
    """E4011 when no target of any rung from ``start`` can take the call's media."""
    if not media or any(capable(r.targets, policy, media) for r in policy.ladder[start:]):
        return None
    want = sorted(needed(media))
    return error_envelope(
        "E4011",
        f"No target of the policy's ladder takes {', '.join(want)} input (declare it under modalities:)",
        details={"modalities": want},
    )


def ladder_modalities(policy: Policy) -> list[str]:
    """The media modalities some target of the ladder takes (``GET /v1/capabilities``)."""
    found = frozenset().union(*(policy.modalities_of(t) for rung in policy.ladder for t in rung.targets))
    return sorted(found - {"text"})


def max_media_size_mb(modalities: Sequence[str]) -> float:
    """The largest media size limit (§4.1.3) among ``modalities``, in MB (2^20 bytes)."""
    return max((LIMITS[m].max_bytes / MB for m in LIMITS if m in modalities), default=0)
