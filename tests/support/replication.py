"""Holding a master's next writes back from its (paused) replica, for the tests of what a master
acknowledged but no replica has: a write then dies with its master (SIGKILL).

Pausing the replica (SIGSTOP) is not enough for that: the master still writes the replication
stream into its socket, and on loopback the kernel queues several MB of it in the stopped
replica's receive buffer, which the replica reads once resumed, after the master is gone (measured:
a write acknowledged after a pause alone was on the resumed replica). :func:`stall_replication`
therefore first fills the link: it writes ``FILLER_BYTES`` values to ``key`` until the master holds
unsent replication data in its own memory; the stream is in order, so every write after it stays
in the master's memory too, and dies with it.

How it knows: Redis 7 reports as a replica client's ``omem`` the replication buffer from the block
the replica is being sent to the end. A block holds one big write (or small ones up to 16 KB), so
``omem`` past two filler values means a block after the one being sent: unsent data.
"""

from __future__ import annotations

from typing import Any

from tests.support.polling import eventually

FILLER_BYTES = 1 << 20
STALL_TIMEOUT_S = 30.0
"""A bound, not a measure: the kernel's buffers take a few MB (8 filler values here)."""


async def stall_replication(master: Any, key: str) -> int:
    """Fill the link from ``master`` (a client of the master node itself, not a cluster client)
    to its paused replica until the master keeps replication data unsent; ``key`` (one the master
    serves) takes the filler. The bytes written."""
    filler = b"x" * FILLER_BYTES
    written = 0

    async def unsent() -> bool:
        nonlocal written
        replicas = await master.client_list(_type="replica")
        if replicas and all(int(client["omem"]) > 2 * FILLER_BYTES for client in replicas):
            return True
        await master.set(key, filler)
        written += FILLER_BYTES
        return False

    await eventually(unsent, "the master keeping replication data unsent", timeout=STALL_TIMEOUT_S, step=0)
    return written
