"""Where the review queue is, for the console and for ``POST /v1/feedback``'s verdicts."""

from __future__ import annotations

from aiohttp import web

from proxy.api.app_keys import REVIEW_QUEUE, REVIEW_STREAMS, runtime_of
from proxy.state.review_queue import MemoryItems, ReviewItems


def review_items(request: web.Request) -> ReviewItems | None:
    """The policy's Redis review stream when that is its sink and the proxy has ``--redis-url``
    (every replica's items: any replica closes one on a verdict), else this process's console
    queue; None where there is neither."""
    review = runtime_of(request).policy.review
    if review.sink == "redis-stream" and REVIEW_STREAMS in request.app:
        return request.app[REVIEW_STREAMS].items(review.stream)
    if REVIEW_QUEUE in request.app:
        return MemoryItems(request.app[REVIEW_QUEUE])
    return None
