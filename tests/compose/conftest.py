from __future__ import annotations

import pytest

from tests.fake_upstream import fake_upstream
from tests.proxy_server import UPSTREAM_KEY, UPSTREAM_KEY_ENV

__all__ = ["fake_upstream"]


@pytest.fixture(autouse=True)
def upstream_key(monkeypatch: pytest.MonkeyPatch) -> None:
    """The fake upstream's key, where the policy's providers read it."""
    monkeypatch.setenv(UPSTREAM_KEY_ENV, UPSTREAM_KEY)
