"""The route table (``proxy.api.routes``): every route's scope and methods enforced by the edge."""

from __future__ import annotations

from pathlib import Path

import aiohttp

from tests.fake_upstream import FakeUpstream
from tests.proxy_server import running_proxy, upstream_policy

CLIENT = "sk-client-key"
ADMIN = "sk-admin-key"


async def test_another_method_on_the_admin_route_is_no_way_past_client_auth(
    fake_upstream: FakeUpstream, tmp_path: Path
) -> None:
    """``POST /v1/usage`` is the passthrough's (the admin route is GET): it needs a client key
    like every passthrough path, and never reaches the provider without one."""
    async with (
        running_proxy(
            tmp_path,
            upstream_policy(fake_upstream),
            api_keys=frozenset({CLIENT}),
            admin_keys=frozenset({ADMIN}),
        ) as px,
        aiohttp.ClientSession() as session,
    ):
        for method in ("POST", "PUT", "DELETE"):
            answer = await session.request(method, px.url + "/v1/usage")
            assert answer.status == 401, method
            assert (await answer.json())["error"]["code"] == "invalid_api_key"
    assert fake_upstream.requests == []
