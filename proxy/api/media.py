"""What a module request lends its media step: its body-budget reservation and its client's view
of the app's cache of fetched media (one cache per media policy: a reload that changes any media
setting — trusted hosts, allowlists, limits — starts anew)."""

from __future__ import annotations

from aiohttp import web

from proxy.api.body import reservation_of
from proxy.api.budget import Reservation
from proxy.api.errors import ApiError
from proxy.api.limits import caller
from proxy.media.cache import ClientCache, MediaCache
from proxy.media.step import MediaEnv
from proxy.media.types import MediaError
from proxy.policy.model import MediaPolicy


class MediaCaches:
    """The app's one media cache, rebuilt (emptied) whenever the policy's media section changes."""

    def __init__(self) -> None:
        self._cache: MediaCache | None = None
        self._policy: MediaPolicy | None = None

    def for_policy(self, media: MediaPolicy) -> MediaCache | None:
        if media.cache_max_bytes <= 0:
            self._cache = self._policy = None
            return None
        if self._cache is None or self._policy != media:
            self._cache, self._policy = MediaCache(media.cache_max_bytes, media.cache_ttl_s), media
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
    cache = request.app[MEDIA_CACHES].for_policy(media)
    client = ClientCache(cache, caller(request).id) if cache is not None else None
    return MediaEnv(ReservationBudget(reservation_of(request)), client)
