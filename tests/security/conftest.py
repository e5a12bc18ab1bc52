"""Fixtures of the security suite: a canary listener and a served proxy in front of the fake."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.fake_upstream import FakeUpstream
from tests.proxy_server import UPSTREAM_KEY, UPSTREAM_KEY_ENV, ServedProcess, proxy_process, upstream_policy
from tests.security.harness import Canary


@pytest.fixture
async def canary() -> AsyncIterator[Canary]:
    """A listener nothing may connect to; asserted untouched when the test ends."""
    listener = await Canary().start()
    try:
        yield listener
    finally:
        await listener.stop()
    listener.assert_untouched()


def security_policy(fake: FakeUpstream, **extra: Any) -> dict[str, Any]:
    """The test policy with the fake as the passthrough provider."""
    policy = upstream_policy(fake, **extra)
    policy.setdefault("passthrough", {"provider": "up"})
    return policy


@pytest.fixture
async def served(fake_upstream: FakeUpstream, tmp_path: Path) -> AsyncIterator[ServedProcess]:
    """``cogproxy serve`` as a real process in front of the fake upstream."""
    path = tmp_path / "policy.yaml"
    path.write_text(yaml.safe_dump(security_policy(fake_upstream)))
    async with proxy_process("--policy", str(path), env={UPSTREAM_KEY_ENV: UPSTREAM_KEY}) as proc:
        yield proc
