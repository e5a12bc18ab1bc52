"""One Redis round trip for a script and the keys a request reads before its answer (#32): the
limits check's ``EVALSHA`` and an ``MGET`` of the call's context and result-cache keys, pipelined.

In a Redis Cluster the two commands may live on different slots (the limits keys share the
``{cogproxy:limits}`` tag, a client's context keys its namespace's tag): the cluster pipeline sends
each node its commands in parallel, so the latency is still one round trip (to the slower node).
The keys of the ``MGET`` all share one hash tag, so it is a single-slot command.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from redis.exceptions import NoScriptError


@dataclass(frozen=True, slots=True)
class ScriptCall:
    """An ``EVALSHA`` of a script registered on the client (``client.register_script``)."""

    script: Any
    keys: Sequence[str]
    args: Sequence[Any]


@dataclass(frozen=True, slots=True)
class Pipelined:
    """What one round trip answered: the script's reply, and the values read (``None`` for a key
    that is absent) or the error that kept them from being read."""

    reply: Any
    values: dict[str, bytes | None] | BaseException


async def script_and_reads(client: Any, call: ScriptCall, reads: Sequence[str]) -> Pipelined:
    """Run ``call`` and read ``reads`` in one pipeline (``reads`` empty: the script alone). Raises
    what the script raised (``RedisError``, ``OSError``); a script unknown to Redis (restarted,
    flushed) is loaded and run again: a second round trip, once per Redis start."""
    if not reads:
        return Pipelined(await _evalsha(client, call), {})
    async with client.pipeline(transaction=False) as pipe:
        # execute_command: a cluster pipeline refuses its evalsha method (scripts without keys
        # have no slot), not the command, which it routes by the keys
        pipe.execute_command("EVALSHA", call.script.sha, len(call.keys), *call.keys, *call.args)
        pipe.execute_command("MGET", *reads)
        reply, read = await pipe.execute(raise_on_error=False)
    if isinstance(reply, NoScriptError):
        reply = await call.script(list(call.keys), list(call.args))
    elif isinstance(reply, BaseException):
        raise reply
    if isinstance(read, BaseException):
        return Pipelined(reply, read)
    return Pipelined(reply, dict(zip(reads, read, strict=True)))


async def _evalsha(client: Any, call: ScriptCall) -> Any:
    try:
        return await client.evalsha(call.script.sha, len(call.keys), *call.keys, *call.args)
    except NoScriptError:  # a restarted or flushed Redis: load it (once) and run it
        return await call.script(list(call.keys), list(call.args))
