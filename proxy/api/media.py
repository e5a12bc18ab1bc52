"""What a module request lends its media step: its body-budget reservation and the app's cache
of fetched media (one cache per policy cache setting: a reload that changes it starts anew)."""

from __future__ import annotations

from aiohttp import web

from proxy.api.budget import RESERVATION, Reservation
from proxy.api.errors import ApiError
from proxy.media.cache import MediaCache
from proxy.media.step import MediaEnv
from proxy.media.types import MediaError
from proxy.policy.model import MediaPolicy


class MediaCaches:
    """The app's one media cache, rebuilt when the policy's cache settings change."""

    def __init__(self) -> None:
        self._cache: MediaCache | None = None
        self._key: tuple[int, float] | None = None

    def for_policy(self, media: MediaPolicy) -> MediaCache | None:
        if media.cache_max_bytes <= 0:
            return None
        key = (media.cache_max_bytes, media.cache_ttl_s)
        if self._cache is None or self._key != key:
            self._cache, self._key = MediaCache(*key), key
        return self._cache


MEDIA_CACHES = web.AppKey("media_caches", MediaCaches)


class ReservationBudget:
    """Media bytes reserved in the request's share of the in-flight body budget. A media that
    alone would overflow the whole budget is E1011; a busy budget stays the edge's 503."""

    def __init__(self, reservation: Reservation) -> None:
        self._reservation = reservation

    async def grow(self, size: int) -> None:
        try:
            await self._reservation.grow(size)
        except ApiError as exc:
            if exc.status != 413:
                raise
            raise MediaError(
                "E1011",
                "The media of this call would take more memory than the proxy's in-flight body budget "
                f"({self._reservation.budget.capacity} bytes)",
                {"max_inflight_bytes": self._reservation.budget.capacity},
            ) from None


def media_env(request: web.Request, media: MediaPolicy) -> MediaEnv:
    return MediaEnv(ReservationBudget(request[RESERVATION]), request.app[MEDIA_CACHES].for_policy(media))
