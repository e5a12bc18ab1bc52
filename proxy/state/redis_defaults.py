"""Defaults of ``serve``'s Redis flags, in a leaf: the command line states them in its help without
importing the Redis client."""

from __future__ import annotations

LIMITS_TIMEOUT_S = 0.25
"""A limit check waits this long for Redis at most (loopback or in-cluster answers in < 1 ms);
``--redis-limits-timeout`` sets it."""
DURABLE_REPLICAS = 0
"""``--redis-durable-replicas``'s default: pop a write on its master's answer (no WAIT), as before:
N > 0 holds every record while a replica is down, a choice for a deployment that runs them."""
