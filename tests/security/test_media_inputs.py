"""Media inputs against a real ``cogproxy serve``: oversize and over-budget media are refused
before any upstream call, and a 20 MB image passes with bounded memory (VmHWM of the process)."""

from __future__ import annotations

import io
import json
import os
import shutil
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml
from aiohttp import web
from PIL import Image

from tests.conftest import MODULES
from tests.fake_upstream import FakeUpstream
from tests.media import samples
from tests.proxy_server import UPSTREAM_KEY, UPSTREAM_KEY_ENV, ServedProcess, proxy_process
from tests.security.conftest import security_policy

MB = 1024 * 1024
ANSWER = (
    '{"ok": true, "meta": {"confidence": 0.9, "risk": "low", "explain": "e"}, '
    '"data": {"rationale": "r", "description": "d"}}'
)


def noise_png(path: Path, side: int) -> int:
    """A PNG of random pixels (incompressible: its size is about side*side*3 bytes)."""
    Image.frombytes("RGB", (side, side), os.urandom(side * side * 3)).save(path, "PNG", compress_level=0)
    return path.stat().st_size


def module_copy(tmp_path: Path) -> Path:
    root = tmp_path / "modules"
    shutil.copytree(MODULES / "image-describer", root / "image-describer")
    return root


@asynccontextmanager
async def serve(
    fake: FakeUpstream,
    tmp_path: Path,
    *args: str,
    modules: Path = MODULES,
    media: dict[str, Any] | None = None,
) -> AsyncIterator[ServedProcess]:
    path = tmp_path / "policy.yaml"
    path.write_text(yaml.safe_dump(security_policy(fake, media=media or {})))
    env = {UPSTREAM_KEY_ENV: UPSTREAM_KEY}
    async with proxy_process("--policy", str(path), *args, env=env, modules=modules) as proc:
        yield proc


async def describe(proc: ServedProcess, image: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    body = io.BytesIO(json.dumps({"input": {"images": [image]}}).encode())  # large bodies: not raw bytes
    headers = {"Content-Type": "application/json"}
    async with (
        aiohttp.ClientSession() as session,
        session.post(f"{proc.url}/v1/modules/image-describer/execute", data=body, headers=headers) as resp,
    ):
        return resp.status, await resp.json()


def memory_kb(pid: int, field: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1])
    raise AssertionError(f"no {field} in /proc/{pid}/status")


async def test_oversize_inline_media_is_refused_before_decoding_or_any_upstream_call(
    fake_upstream: FakeUpstream, tmp_path: Path
) -> None:
    over = "A" * ((20 * MB // 3 + 1) * 4)  # decodes to just over 20 MB
    args = ("--max-body-bytes", str(40 * MB), "--max-inflight-body-bytes", str(256 * MB))
    async with serve(fake_upstream, tmp_path, *args) as proc:
        status, env = await describe(proc, {"type": "base64", "media_type": "image/png", "data": over})
        assert (status, env["error"]["code"]) == (413, "E1011")
        assert env["error"]["details"]["max_bytes"] == 20 * MB
        for image, code in (
            ({"type": "base64", "media_type": "image/png", "data": samples.b64(samples.JPEG)}, "E1014"),
            ({"type": "base64", "media_type": "image/gif", "data": samples.b64(samples.PNG)}, "E1014"),
            (
                {
                    "type": "base64",
                    "media_type": "image/png",
                    "data": samples.b64(samples.png_header(8193, 64)),
                },
                "E1015",
            ),
        ):
            status, env = await describe(proc, image)
            assert env["error"]["code"] == code
    assert fake_upstream.requests == []


async def test_media_over_the_in_flight_budget_is_e1011(fake_upstream: FakeUpstream, tmp_path: Path) -> None:
    modules = module_copy(tmp_path)
    size = noise_png(modules / "image-describer" / "big.png", 1000)  # ~3 MB
    budget = 2 * MB
    async with serve(
        fake_upstream, tmp_path, "--max-inflight-body-bytes", str(budget), modules=modules
    ) as proc:
        status, env = await describe(proc, {"type": "file", "path": "big.png"})
    assert size > budget
    assert (status, env["error"]["code"]) == (413, "E1011")
    assert env["error"]["details"]["max_inflight_bytes"] == budget
    assert fake_upstream.requests == []


@pytest.mark.parametrize("form", ["file", "url"])
async def test_a_20_mb_image_passes_with_peak_memory_growth_under_twice_its_size(
    fake_upstream: FakeUpstream, tmp_path: Path, form: str
) -> None:
    modules = module_copy(tmp_path)
    big = modules / "image-describer" / "big.png"
    size = noise_png(big, 2600)
    assert 20 * 10**6 < size <= 20 * MB
    fake_upstream.set_default_reply("cheap", ANSWER)
    origin = web.Application()

    async def serve_big(_: web.Request) -> web.FileResponse:
        return web.FileResponse(big)

    origin.router.add_get("/big.png", serve_big)
    runner = web.AppRunner(origin, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    image = (
        {"type": "file", "path": "big.png"}
        if form == "file"
        else {"type": "url", "url": f"http://localhost:{runner.addresses[0][1]}/big.png"}
    )
    media = {"allow_http": True, "trusted_hosts": [f"localhost:{runner.addresses[0][1]}"]}
    try:
        async with serve(fake_upstream, tmp_path, modules=modules, media=media) as proc:
            pid = proc.proc.pid
            small = {"type": "base64", "media_type": "image/png", "data": samples.b64(samples.PNG)}
            warm, _ = await describe(proc, small)
            assert warm == 200  # imports and first-call allocations are part of the baseline
            before = memory_kb(pid, "VmRSS")
            status, env = await describe(proc, image)
            peak = memory_kb(pid, "VmHWM")
    finally:
        await runner.cleanup()
    assert status == 200 and env["meta"]["media_validation"]["validated"][0]["size_bytes"] == size, env
    growth = (peak - before) * 1024
    print(f"\n20 MB image as {form} ({size} B): peak RSS growth {growth / MB:.1f} MiB = {growth / size:.2f}x")
    assert growth < 2 * size
    url = fake_upstream.requests[-1].json["messages"][1]["content"][1]["image_url"]["url"]
    assert url == "data:image/png;base64," + samples.b64(big.read_bytes())
