"""The practical floor of this stack: a bare aiohttp + uvloop + orjson relay.

It parses the JSON body, rewrites ``model``, forwards it with one pooled ``ClientSession`` and
returns the upstream's bytes (streamed answers chunk by chunk). No validation, metrics, logs,
auth or limits: ``make bench`` measures the proxy against it in the same run, so the ratio says
what every feature on top of the bare relay costs.

Run by hand: ``python tests/perf/floor_relay.py --port 9000 --upstream http://127.0.0.1:9001/v1``.
"""

from __future__ import annotations

import argparse
from collections.abc import AsyncIterator

import orjson
import uvloop
from aiohttp import ClientSession, TCPConnector, web

UPSTREAM_KEY = web.AppKey("upstream", str)
SESSION_KEY = web.AppKey("session", ClientSession)
MODEL = "m"


async def relay(request: web.Request) -> web.StreamResponse:
    payload = orjson.loads(await request.read())
    payload["model"] = MODEL
    session = request.app[SESSION_KEY]
    url = request.app[UPSTREAM_KEY] + "/chat/completions"
    async with session.post(
        url, data=orjson.dumps(payload), headers={"Content-Type": "application/json"}
    ) as upstream:
        content_type = upstream.headers.get("Content-Type", "application/json")
        if not payload.get("stream"):
            body = await upstream.read()
            return web.Response(status=upstream.status, body=body, headers={"Content-Type": content_type})
        response = web.StreamResponse(status=upstream.status, headers={"Content-Type": content_type})
        await response.prepare(request)
        async for chunk in upstream.content.iter_any():
            await response.write(chunk)
        await response.write_eof()
        return response


async def _session(app: web.Application) -> AsyncIterator[None]:
    app[SESSION_KEY] = ClientSession(connector=TCPConnector(limit=0), auto_decompress=False)
    yield
    await app[SESSION_KEY].close()


def build(upstream: str) -> web.Application:
    app = web.Application()
    app[UPSTREAM_KEY] = upstream.rstrip("/")
    app.cleanup_ctx.append(_session)
    app.router.add_post("/v1/chat/completions", relay)
    return app


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--upstream", required=True, help="base URL, e.g. http://127.0.0.1:9001/v1")
    args = parser.parse_args()
    web.run_app(
        build(args.upstream),
        host="127.0.0.1",
        port=args.port,
        access_log=None,
        print=None,
        loop=uvloop.new_event_loop(),
    )


if __name__ == "__main__":
    main()
