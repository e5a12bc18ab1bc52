"""Redis's own count of the commands it ran (``INFO commandstats``), to assert how many round trips a
request costs without timing anything.

Redis counts the commands a Lua script calls as well as the script's ``EVALSHA``: ``round_trips``
counts the scripts and the commands no proxy script calls (a command sent alone that a script also
calls would go uncounted: the tests also compare the whole counts)."""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path
from typing import Any

from tests.support.polling import eventually

IGNORED = frozenset({"info", "ping", "client|setinfo", "client|setname", "hello"})
"""The counting itself and connection set-up, not a request's work."""


async def command_calls(client: Any) -> Counter[str]:
    """Calls per command so far (lower case, subcommands as ``client|setinfo``), on the whole server."""
    stats = await client.info("commandstats")
    calls: Counter[str] = Counter()
    for name, fields in stats.items():
        command = name.removeprefix("cmdstat_").lower()
        if command not in IGNORED:
            calls[command] = int(fields["calls"])
    return calls


async def calls_since(client: Any, before: Counter[str]) -> Counter[str]:
    """The commands run since ``before`` was read (only those that ran)."""
    after = await command_calls(client)
    after.subtract(before)
    return +after


async def quiet(client: Any) -> Counter[str]:
    """The counts once two reads a poll step apart agree (the work under way reached Redis)."""
    last: list[Counter[str]] = [await command_calls(client)]

    async def unchanged() -> bool:
        now = await command_calls(client)
        same = now == last[0]
        last[0] = now
        return same

    await eventually(unchanged, "Redis quiet")
    return last[0]


SCRIPTS = ("proxy/limits/windows.py", "proxy/state/redis_store.py", "proxy/state/outbox.py")
_CALL = re.compile(r"redis\.call\('(\w+)'", re.IGNORECASE)


def script_commands(root: Path) -> frozenset[str]:
    """Every command a Lua script of the proxy calls (read from their sources)."""
    return frozenset(
        name.lower() for path in SCRIPTS for name in _CALL.findall((root / path).read_text(encoding="utf-8"))
    )


def round_trips(calls: Counter[str], in_scripts: frozenset[str]) -> int:
    """Scripts run plus the commands sent on their own."""
    scripts = calls["evalsha"] + calls["eval"]
    return scripts + sum(n for name, n in calls.items() if name not in in_scripts | {"evalsha", "eval"})
