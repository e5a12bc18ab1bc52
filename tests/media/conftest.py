from __future__ import annotations

from tests.fake_upstream import fake_upstream

__all__ = ["fake_upstream"]
