from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from tests.fake_upstream import FakeUpstream, fake_upstream
from tests.proxy_server import UPSTREAM_KEY, UPSTREAM_KEY_ENV, RunningProxy, running_proxy, upstream_policy

__all__ = ["fake_upstream"]


@pytest.fixture
async def px(
    fake_upstream: FakeUpstream, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[RunningProxy]:
    """The proxy in front of the fake upstream, on the suite's routing policy."""
    monkeypatch.setenv(UPSTREAM_KEY_ENV, UPSTREAM_KEY)
    async with running_proxy(tmp_path, upstream_policy(fake_upstream)) as running:
        yield running
