"""While a hostile 4 MiB PDF is checked, the process keeps answering (issue #26 finding 1): the
admin port's ``/healthz`` answers many times between the moment the call is sent and the moment
the provider is asked (the check lies between the two). Before the fix the page-count regex held
the GIL for the whole check (hours at 4 MiB): no probe answered until it ended.

No latency is asserted (a loaded two-core machine stretches any clock bound); the count of probes
answered inside the check says the loop was free. The test prints the slowest probe."""

from __future__ import annotations

import asyncio
import base64
import io
import json
import shutil
import time
from pathlib import Path

import aiohttp
import yaml

from tests.conftest import MODULES
from tests.fake_upstream import FakeUpstream
from tests.proxy_server import UPSTREAM_KEY, UPSTREAM_KEY_ENV, free_port, proxy_process
from tests.security.conftest import security_policy

MB = 1024 * 1024
ANSWER = (
    '{"ok": true, "meta": {"confidence": 0.9, "risk": "low", "explain": "e"}, '
    '"data": {"rationale": "r", "description": "d"}}'
)
HOSTILE_PDF = (b"%PDF-1.4\n" + b"/Type/Pages/Count 1 " * (2 * MB // 20) + b"/Type/Pages " * MB)[: 4 * MB]
"""4 MiB: first the slowest shape for the linear scan (every stretch names the page tree and a
count), then the reported one (no ``>`` and no ``/Count`` after ``/Type/Pages``: quadratic for the
old regex)."""
MIN_PROBES_DURING_CHECK = 3


def document_module(tmp_path: Path) -> Path:
    """image-describer, declared to take documents instead (no bundled module does)."""
    root = tmp_path / "modules"
    shutil.copytree(MODULES / "image-describer", root / "image-describer")
    manifest = root / "image-describer" / "module.yaml"
    manifest.write_text(manifest.read_text().replace("input: [text, image]", "input: [text, document]"))
    return root


async def test_healthz_answers_while_a_hostile_4_mib_pdf_is_checked(
    fake_upstream: FakeUpstream, tmp_path: Path
) -> None:
    fake_upstream.set_default_reply("cheap", ANSWER)
    policy = tmp_path / "policy.yaml"
    policy.write_text(yaml.safe_dump(security_policy(fake_upstream)))
    admin = free_port()
    env = {UPSTREAM_KEY_ENV: UPSTREAM_KEY, "COGPROXY_ADMIN_PORT": str(admin)}
    args = ("--policy", str(policy), "--max-body-bytes", str(16 * MB))
    data = base64.b64encode(HOSTILE_PDF).decode()
    body = {"input": {"images": [{"type": "base64", "media_type": "application/pdf", "data": data}]}}
    async with (
        proxy_process(*args, env=env, modules=document_module(tmp_path)) as proc,
        aiohttp.ClientSession() as session,
    ):
        healthz = f"http://127.0.0.1:{admin}/healthz"
        async with session.get(healthz) as warm:
            assert warm.status == 200

        async def call() -> tuple[int, dict[str, object]]:
            url = f"{proc.url}/v1/modules/image-describer/execute"
            payload = io.BytesIO(json.dumps(body).encode())  # a large body: not raw bytes
            headers = {"Content-Type": "application/json"}
            async with session.post(url, data=payload, headers=headers) as resp:
                return resp.status, await resp.json()

        task = asyncio.create_task(call())
        during, slowest = 0, 0.0
        while not task.done():
            started = time.perf_counter()
            async with session.get(healthz) as probe:
                assert probe.status == 200
            slowest = max(slowest, time.perf_counter() - started)
            if not fake_upstream.requests and not task.done():
                during += 1
        status, env_ = await task
    print(f"\n/healthz answered {during} times during the check; slowest probe {slowest * 1000:.0f} ms")
    assert status == 200, env_
    assert fake_upstream.requests, "the check ended and the provider was asked"
    assert during >= MIN_PROBES_DURING_CHECK
