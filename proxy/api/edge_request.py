"""The headers every answer of the API gets just before it is sent (the trace id, the rate-limit
windows), and the request class the edge serves with (``EdgeRequest``), which sets them without
aiohttp's ``on_response_prepare`` signal."""

from __future__ import annotations

from aiohttp import web

from proxy.api.limits import add_ratelimit_headers
from proxy.api.middleware import RECORD_KEY, RequestRecord, echo_trace_id


def add_answer_headers(record: RequestRecord, response: web.StreamResponse) -> None:
    """The trace id and the rate-limit headers, on every answer the edge saw (it made ``record``)."""
    echo_trace_id(record, response)
    add_ratelimit_headers(record, response)


async def on_response_prepare(request: web.Request, response: web.StreamResponse) -> None:
    """The app's one ``on_response_prepare`` callback: what sets the headers where aiohttp's own
    dispatch serves the app (test servers, an embedder's runner)."""
    try:  # request.get is Mapping.get: two Python frames and the same KeyError on a miss
        record = request[RECORD_KEY]
    except KeyError:
        return
    add_answer_headers(record, response)


class EdgeRequest(web.Request):
    """The request of an app whose one ``on_response_prepare`` callback is ``on_response_prepare``
    (``proxy.server``'s ``EdgeRunner`` checks it): the headers set directly, without the signal's
    ``send`` and the callback's coroutine: about 11 k instructions an answer."""

    async def _prepare_hook(self, response: web.StreamResponse) -> None:
        if self._match_info is None:  # aiohttp's own answers before routing: no app's signal ran
            return
        record = self._state.get(RECORD_KEY)  # the request's dict, without Mapping's Python frames
        if record is not None:
            add_answer_headers(record, response)
