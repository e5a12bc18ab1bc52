"""Hot reload: SIGHUP and file polling rebuild the runtime and swap it in atomically.

Kubernetes mounts ConfigMaps as a ``..data`` symlink that is swapped in one rename; the
fingerprint follows symlinks (real path, inode, mtime, size), so that swap is seen. A policy
that fails to load is refused with its path and reason and the running proxy keeps its last
good runtime; a module that fails keeps its last good version.
"""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import Callable
from contextlib import suppress
from pathlib import Path

import structlog
from aiohttp import web

from proxy.api.app_keys import Runtime, RuntimeHolder
from proxy.observability.metrics import Metrics
from proxy.policy.loader import PolicyError
from proxy.settings import Settings

log = structlog.get_logger("proxy.reload")

FileStamp = tuple[str, int, int, int]
"""A file's path, and its target's inode, mtime (ns) and size: any change means the file changed
(a ConfigMap's ``..data`` swap points its links at new files: new inodes)."""
Fingerprint = tuple[FileStamp, ...]


def _stamp(path: str, st: os.stat_result) -> FileStamp:
    return (path, st.st_ino, st.st_mtime_ns, st.st_size)


def _module_stamps(directory: Path, into: list[FileStamp], seen: set[tuple[int, int]]) -> None:
    """The stamps of the files under ``directory``, symlinks followed: one ``stat`` a file (the
    directory's own listing gives the rest). Names from ``.`` are not files; directories from
    ``..`` are a ConfigMap's own (reached through its links).

    Only a link makes a loop (``ln -s .. up``): a directory reached through one is walked once
    (``seen``: its device and inode, one ``stat``), as is ``directory``; a real subdirectory needs
    no check. A stack, not a recursion: a deep tree raises no ``RecursionError`` out of the poll."""
    try:
        st = directory.stat()
    except OSError:
        return
    if (st.st_dev, st.st_ino) in seen:
        return
    seen.add((st.st_dev, st.st_ino))
    pending = [str(directory)]
    while pending:
        path = pending.pop()
        try:
            with os.scandir(path) as listing:
                entries = sorted(listing, key=lambda entry: entry.name)
        except OSError:
            continue
        below: list[str] = []
        for entry in entries:
            try:
                if entry.is_dir():
                    if entry.name.startswith(".."):
                        continue
                    if entry.is_symlink():
                        target = entry.stat()
                        if (target.st_dev, target.st_ino) in seen:
                            continue
                        seen.add((target.st_dev, target.st_ino))
                    below.append(entry.path)
                elif not entry.name.startswith("."):
                    into.append(_stamp(entry.path, entry.stat()))
            except OSError:  # a broken link, or a file gone since the listing
                continue
        pending.extend(reversed(below))


def fingerprint(settings: Settings) -> Fingerprint:
    """What changes when the policy or any module file changes (symlink swaps included)."""
    entries: list[FileStamp] = []
    with suppress(OSError):  # a policy file missing now: its reload then says why
        entries.append(_stamp(str(settings.policy_path), settings.policy_path.stat()))
    seen: set[tuple[int, int]] = set()
    for directory in settings.module_dirs:
        _module_stamps(directory, entries, seen)
    return tuple(entries)


class Reloader:
    def __init__(
        self, settings: Settings, holder: RuntimeHolder, build: Callable[[], Runtime], metrics: Metrics
    ) -> None:
        self._settings = settings
        self._holder = holder
        self._build = build
        self._metrics = metrics
        self._seen = fingerprint(settings)
        self._lock = asyncio.Lock()
        self.on_swap: Callable[[Runtime], None] | None = None

    async def reload(self, reason: str) -> bool:
        """Build a new runtime and swap it in; False (old one kept) when the policy is bad."""
        async with self._lock:
            self._seen = fingerprint(self._settings)
            old = self._holder.current
            try:
                new = self._build()
            except PolicyError as exc:
                return self._failed(reason, str(exc), old)
            except Exception as exc:
                log.exception("proxy.reload_crashed", reason=reason, path=str(self._settings.policy_path))
                return self._failed(reason, f"{type(exc).__name__}: {exc}", old)
            if old is not None:
                new = Runtime(
                    new.policy, new.registry.keeping_last_good(old.registry), new.providers, new.review
                )
            for problem in new.registry.problems:
                log.error("proxy.module_load_failed", path=str(problem.path), reason=problem.reason)
            self._holder.current = new  # one assignment: in-flight requests keep their snapshot
            self._metrics.policy_reloads.labels(result="ok").inc()
            log.info("proxy.reloaded", reason=reason, policy=new.policy.source, modules=new.registry.names())
            if self.on_swap is not None and old is not None:
                self.on_swap(old)
            return True

    def _failed(self, reason: str, error: str, old: Runtime | None) -> bool:
        self._metrics.policy_reloads.labels(result="error").inc()
        log.error(
            "proxy.reload_failed",
            reason=reason,
            path=str(self._settings.policy_path),
            error=error,
            keeping=old.policy.source if old else None,
        )
        return False

    async def poll(self) -> None:
        """Check the files every ``reload_interval_s`` and reload when they changed."""
        while True:
            await asyncio.sleep(self._settings.reload_interval_s)
            if fingerprint(self._settings) != self._seen:
                await self.reload("files changed")

    def install_sighup(self) -> bool:
        """Reload on SIGHUP (main thread only; False where signals cannot be installed)."""
        try:
            loop = asyncio.get_running_loop()
            loop.add_signal_handler(signal.SIGHUP, lambda: asyncio.ensure_future(self.reload("SIGHUP")))
        except (RuntimeError, ValueError):  # no signals here (not the main thread, or no support)
            return False
        return True


RELOADER = web.AppKey("reloader", Reloader)
