from __future__ import annotations

from tests.context.helpers import redis_db
from tests.fake_upstream import fake_upstream

__all__ = ["fake_upstream", "redis_db"]
