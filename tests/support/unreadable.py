"""Every way a configuration path can fail to be a readable UTF-8 file, and the reason given."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path


def _non_utf8(path: Path) -> None:
    path.write_bytes(b"version: 1\nproviders: \xff\xfe\x80 {}\n")


def _directory(path: Path) -> None:
    path.mkdir()


def _dangling_symlink(path: Path) -> None:
    path.symlink_to(path.parent / "gone.yaml")


def _huge(path: Path) -> None:
    with path.open("wb") as out:  # sparse: 100 MB on paper, nothing on disk
        out.truncate(100 * 1024 * 1024)


def _fifo(path: Path) -> None:
    os.mkfifo(path)  # opening it for reading would wait for a writer forever


def _endless_device(path: Path) -> None:
    path.symlink_to("/dev/zero")


UNREADABLE_SHAPES: dict[str, tuple[Callable[[Path], None], str]] = {
    "not UTF-8": (_non_utf8, "not UTF-8 text: byte 0xff at offset 22"),
    "a directory": (_directory, "cannot read: is a directory"),
    "a dangling symlink": (_dangling_symlink, "cannot read: No such file or directory"),
    "100 MB": (_huge, "cannot read: 104857600 bytes, more than the 1048576 a policy may have"),
    "a FIFO": (_fifo, "cannot read: not a regular file"),
    "an endless device": (_endless_device, "cannot read: not a regular file"),
}
"""Every way a policy path can fail to be a readable UTF-8 file, and the reason given for it."""
