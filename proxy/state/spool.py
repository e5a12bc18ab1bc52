"""The outbox's spool: ``outbox.jsonl`` (one write a line, appended as it is queued) and
``outbox.offset`` (the id of the last write Redis acknowledged), in the ``--spool-dir``.

When it reaches the disk:

* an append is flushed to the OS at once: a killed process loses nothing (a host crash can lose
  the appends of its last moments);
* the offset is overwritten and fsync'ed after every delivered batch;
* the file is rewritten with only the undelivered writes (to a temporary file, fsync'ed, then
  renamed over it) when the queue empties, every ``bound`` deliveries, and on shutdown.

On start, the writes after the offset's id are replayed; when the id is not in the file (it was
rewritten since, or the offset file is missing or torn) every write is replayed. Either way a
write Redis already has is not applied twice: each carries its id, and Redis keeps the highest
sequence number applied per run (``proxy.state.outbox``'s marks). The directory is the
operator's: the proxy trusts what it finds there (see THREAT_MODEL.md).
"""

from __future__ import annotations

import fcntl
import os
import shutil
from collections.abc import Iterable
from pathlib import Path
from typing import IO

import orjson
import structlog

log = structlog.get_logger("proxy.outbox")

SPOOL_FILE = "outbox.jsonl"
OFFSET_FILE = "outbox.offset"
OFFSET_WIDTH = 128
"""Bytes of the offset file: written in place with one ``pwrite`` (well under a disk sector)."""


def spool_dir_of(base: Path, slot: int | None) -> Path:
    """The ``--spool-dir`` of worker ``slot`` of ``serve --workers`` (slot 0 and a single process
    use ``base`` itself): two processes appending to and truncating one file would lose records."""
    return base if not slot else base / f"worker-{slot}"


def adopt_spools(base: Path, workers: int) -> None:
    """Append the undelivered writes of the spools of slots this run has no worker for
    (``--workers`` went down) to slot 0's, which replays them. Called before any process of this
    run opens a spool."""
    for directory in sorted(base.glob("worker-*")):
        slot = directory.name.removeprefix("worker-")
        if not slot.isdigit() or int(slot) < workers:
            continue
        target = base / SPOOL_FILE
        if (directory / SPOOL_FILE).exists():
            with target.open("ab") as out:
                if out.tell() and not target.read_bytes().endswith(b"\n"):
                    out.write(b"\n")  # a torn last append stays its own (skipped) line
                out.writelines(line + b"\n" for line in pending_lines(directory))
            log.info("proxy.outbox_spool_adopted", source=str(directory), target=str(target))
        shutil.rmtree(directory)


def pending_lines(directory: Path) -> list[bytes]:
    """The spool's lines after the one holding the offset's id (all of them when it is absent)."""
    lines = (directory / SPOOL_FILE).read_bytes().splitlines()
    last = _read_offset(directory / OFFSET_FILE)
    if last:
        for index in range(len(lines) - 1, -1, -1):
            if _id_of(lines[index]) == last:
                return lines[index + 1 :]
    return lines


def _id_of(line: bytes) -> object:
    try:
        doc = orjson.loads(line)
    except orjson.JSONDecodeError:
        return None
    return doc.get("id") if isinstance(doc, dict) else None


def _read_offset(path: Path) -> str:
    try:
        return path.read_bytes().rstrip(b"\0 \n").decode("ascii")
    except (FileNotFoundError, UnicodeDecodeError):
        return ""


class Spool:
    """The files of one ``--spool-dir`` (one process's)."""

    def __init__(self, directory: Path) -> None:
        """ValueError naming ``directory`` when it cannot hold a spool (a start-up error: an
        OSError there would read as the listen socket's)."""
        self.directory = directory
        self.path = directory / SPOOL_FILE
        try:
            directory.mkdir(mode=0o700, parents=True, exist_ok=True)
            self._offset = os.open(directory / OFFSET_FILE, os.O_RDWR | os.O_CREAT, 0o600)
            try:
                # One process per spool: another's rewrite would rename a new file over the one
                # this appends to, losing those appends. The kernel drops the lock with the process.
                fcntl.flock(self._offset, fcntl.LOCK_EX | fcntl.LOCK_NB)
                self._file = self._open()
            except OSError:
                os.close(self._offset)
                raise
            if self._file.tell() and not self.path.read_bytes().endswith(b"\n"):
                self.append(b"")  # a torn last append stays its own (skipped) line, not the next write's
        except BlockingIOError as exc:
            raise ValueError(f"--spool-dir {directory}: another process is using this spool") from exc
        except OSError as exc:
            where = f" ({exc.filename})" if exc.filename and Path(exc.filename) != directory else ""
            raise ValueError(f"--spool-dir {directory}: {(exc.strerror or str(exc)).lower()}{where}") from exc

    def pending(self) -> list[bytes]:
        return pending_lines(self.directory)

    def append(self, line: bytes) -> None:
        self._file.write(line + b"\n")
        self._file.flush()

    def delivered(self, write_id: str) -> None:
        """Record that Redis has every write up to ``write_id`` (durably: fsync'ed)."""
        os.pwrite(self._offset, write_id.encode("ascii").ljust(OFFSET_WIDTH, b"\0"), 0)
        os.fsync(self._offset)

    def rewrite(self, lines: Iterable[bytes]) -> None:
        """Keep only ``lines`` (the undelivered writes)."""
        tmp = self.path.with_suffix(".tmp")
        with open(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "wb") as out:  # noqa: PTH123 (Path.open sets no mode)
            out.writelines(line + b"\n" for line in lines)
            out.flush()
            os.fsync(out.fileno())
        self._file.close()
        tmp.replace(self.path)
        self._file = self._open()

    def _open(self) -> IO[bytes]:
        """The spool for appending, readable by its owner only: it holds model answers."""
        return open(os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600), "ab")  # noqa: PTH123 (Path.open sets no mode)

    def close(self, lines: Iterable[bytes]) -> None:
        """Rewrite the file with ``lines`` (the undelivered writes) and close it."""
        self.rewrite(lines)
        self._file.close()
        os.close(self._offset)
