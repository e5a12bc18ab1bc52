"""The ``cogproxy`` command as the tests run it: ``python -m proxy`` in a subprocess."""

from __future__ import annotations

import subprocess
import sys

from tests.paths import ROOT


def cogproxy(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """``python -m proxy ARGS`` from the repository root, its output captured as text."""
    return subprocess.run(
        [sys.executable, "-m", "proxy", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
        cwd=ROOT,
    )
