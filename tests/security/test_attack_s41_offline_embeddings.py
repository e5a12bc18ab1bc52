"""Session 41 adversarial pass (outside attacker): `make run`'s offline provider answering
``/v1/embeddings`` through a live proxy."""

from __future__ import annotations

from pathlib import Path

import aiohttp

from proxy.upstream.offline_api import MAX_DIMENSIONS, MAX_INPUTS, MAX_VALUES
from tests.api.test_offline_demo import demo_policy
from tests.proxy_server import running_proxy


async def test_an_embeddings_request_whose_answer_would_dwarf_it_is_refused(tmp_path: Path) -> None:
    """Finding (low, demo): a 15 KB body (2,048 short inputs, ``dimensions: 4096``) made the
    offline provider build 8.4 million floats in the event loop, ~8 s of CPU with every other
    request waiting, and answer 180 MB (about 12,000 times the body, none of it in the body
    budget); a few at once exhaust a small container's memory. Expected: past ``MAX_VALUES``
    values in all (inputs x dimensions) the request is the caller's 400, nothing built; a request
    at the bound still answers."""
    assert MAX_INPUTS * MAX_DIMENSIONS > MAX_VALUES
    async with running_proxy(tmp_path, demo_policy()) as px, aiohttp.ClientSession() as session:
        huge = {"input": [str(i) for i in range(MAX_INPUTS)], "dimensions": MAX_DIMENSIONS}
        async with session.post(px.base + "/embeddings", json=huge) as resp:
            answer = await resp.json()
            assert resp.status == 400, resp.status
            assert answer["error"]["code"] == "invalid_value"
        at_bound = {"input": ["a"] * (MAX_VALUES // MAX_DIMENSIONS), "dimensions": MAX_DIMENSIONS}
        async with session.post(px.base + "/embeddings", json=at_bound) as resp:
            assert resp.status == 200
            assert len((await resp.json())["data"]) == MAX_VALUES // MAX_DIMENSIONS
