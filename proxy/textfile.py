"""Read a small UTF-8 configuration file, refusing anything that is not one.

A configuration path can point at anything: bytes in another encoding, a directory, a dangling
symlink, a FIFO that blocks a reader forever, ``/dev/zero`` or a file far too large to parse on
the event loop. Each is one ``UnreadableFile`` with a reason that reads after the file's name.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path


class UnreadableFile(Exception):
    """The file is not a readable UTF-8 text file; ``reason`` says why (after the file's name)."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def read_small_text(path: Path, limit: int, what: str) -> str:
    """The UTF-8 text of the regular file at ``path``, at most ``limit`` bytes (``what`` names
    the kind of file in the refusal: "a policy")."""
    try:
        # O_NONBLOCK: opening a FIFO for reading would otherwise wait for a writer forever.
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        raise UnreadableFile(f"cannot read: {exc.strerror or exc}") from exc
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):
        os.close(fd)
        raise UnreadableFile(
            "cannot read: " + ("is a directory" if stat.S_ISDIR(mode) else "not a regular file")
        )
    with os.fdopen(fd, "rb") as handle:
        try:
            data = handle.read(limit + 1)  # never more, though the file grows while it is read
        except OSError as exc:
            raise UnreadableFile(f"cannot read: {exc.strerror or exc}") from exc
        if len(data) > limit:
            size = max(os.fstat(fd).st_size, len(data))
            raise UnreadableFile(f"cannot read: {size} bytes, more than the {limit} {what} may have")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise UnreadableFile(f"not UTF-8 text: byte 0x{data[exc.start]:02x} at offset {exc.start}") from exc
