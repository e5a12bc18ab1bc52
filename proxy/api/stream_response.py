"""A streamed response whose head leaves with its first body bytes."""

from __future__ import annotations

from aiohttp import web


class HeldHeadResponse(web.StreamResponse):
    """``web.StreamResponse`` whose status line and headers are held at ``prepare`` and sent with
    the first ``write`` (or ``write_eof``) in one socket write, as aiohttp's own ``Response`` does:
    one wake-up of the client, not two. Only for a response written right after it is prepared: a
    handler that prepares and then waits would hold the head back (tests/test_server_aiohttp_internals.py
    pins the aiohttp attribute this sets)."""

    _send_headers_immediately = False
