"""One Redis round trip for a script and the keys a request reads before its answer (#32): the
limits check's ``EVALSHA`` and an ``MGET`` of the call's context and result-cache keys, pipelined.

In a Redis Cluster the two commands may live on different slots (the limits keys share the
``{cogproxy:limits}`` tag, a client's context keys its namespace's tag): the cluster pipeline sends
each node its commands in parallel, so the latency is still one round trip (to the slower node).
The keys of the ``MGET`` all share one hash tag, so it is a single-slot command.

A session call's pending-write mark (``proxy.context.store.Mark``, on the same tag) rides along:
the marks alive are read before the ``MGET``, and the call's own is added after it
(``queue_marked_read``), in the same round trip.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from redis.exceptions import NoScriptError

from proxy.context.store import MARK_TTL_S, Mark


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


def queue_marked_read(pipe: Any, reads: Sequence[str], mark: Mark | None, *, add: bool = True) -> None:
    """Queue on ``pipe`` the read of ``reads``: with ``mark``, the marks alive first, and (``add``)
    the mark itself after (its set expires with its last mark)."""
    if mark is not None:
        pipe.execute_command("ZRANGEBYSCORE", mark.key, mark.deadline_ms - MARK_TTL_S * 1000, "+inf")
    pipe.execute_command("MGET", *reads)
    if mark is not None and add:
        pipe.execute_command("ZADD", mark.key, mark.deadline_ms, mark.member)
        pipe.execute_command("PEXPIRE", mark.key, MARK_TTL_S * 1000)


def marked_values(
    replies: Sequence[Any], reads: Sequence[str], mark: Mark | None
) -> dict[str, bytes | None] | BaseException:
    """What ``queue_marked_read``'s commands answered: the values, and with ``mark`` the marks
    alive under ``mark.key`` (newline-separated, ``proxy.context.store.marks_of``), left out when
    a mark command failed (the mark then not known to be there); or the error of the ``MGET``."""
    if mark is None:
        (read,) = replies
        return read if isinstance(read, BaseException) else dict(zip(reads, read, strict=True))
    alive, read, *added = replies
    if isinstance(read, BaseException):
        return read
    values: dict[str, bytes | None] = dict(zip(reads, read, strict=True))
    if not any(isinstance(reply, BaseException) for reply in (alive, *added)):
        values[mark.key] = b"\n".join(alive)
    return values


async def script_and_reads(
    client: Any, call: ScriptCall, reads: Sequence[str], mark: Mark | None = None
) -> Pipelined:
    """Run ``call`` and read ``reads`` (with ``mark``: ``queue_marked_read``) in one pipeline
    (``reads`` empty: the script alone). Raises what the script raised (``RedisError``,
    ``OSError``); a script unknown to Redis (restarted, flushed) is loaded and run again: a second
    round trip, once per Redis start."""
    if not reads:
        return Pipelined(await _evalsha(client, call), {})
    async with client.pipeline(transaction=False) as pipe:
        # execute_command: a cluster pipeline refuses its evalsha method (scripts without keys
        # have no slot), not the command, which it routes by the keys
        pipe.execute_command("EVALSHA", call.script.sha, len(call.keys), *call.keys, *call.args)
        queue_marked_read(pipe, reads, mark)
        reply, *read = await pipe.execute(raise_on_error=False)
    if isinstance(reply, NoScriptError):
        reply = await call.script(list(call.keys), list(call.args))
    elif isinstance(reply, BaseException):
        raise reply
    return Pipelined(reply, marked_values(read, reads, mark))


async def _evalsha(client: Any, call: ScriptCall) -> Any:
    try:
        return await client.evalsha(call.script.sha, len(call.keys), *call.keys, *call.args)
    except NoScriptError:  # a restarted or flushed Redis: load it (once) and run it
        return await call.script(list(call.keys), list(call.args))
