"""Running the docs' examples as written: the code block after a marker, and a shell snippet run
by bash against a test proxy (only ``localhost:8080`` rewritten to its address)."""

from __future__ import annotations

import asyncio
from pathlib import Path

from tests.paths import ROOT

DOCUMENTED_ADDRESS = "localhost:8080"


def block_after(page: Path, marker: str, lang: str) -> str:
    """The first ```lang block of ``page`` after ``marker``."""
    text = page.read_text(encoding="utf-8")
    return text.split(marker, 1)[1].split(f"```{lang}\n", 1)[1].split("```", 1)[0]


async def run_snippet(script: str, proxy_url: str) -> bytes:
    """``script`` run by ``bash -euo pipefail`` from the repository root against the proxy at
    ``proxy_url``; its standard output (a failing snippet fails the test with it)."""
    assert DOCUMENTED_ADDRESS in script, "the snippet does not talk to the documented address"
    proc = await asyncio.create_subprocess_exec(
        "bash",
        "-euo",
        "pipefail",
        "-c",
        script.replace(DOCUMENTED_ADDRESS, proxy_url.removeprefix("http://")),
        cwd=ROOT,
        stdout=asyncio.subprocess.PIPE,
    )
    out, _ = await proc.communicate()
    assert proc.returncode == 0, out
    return out
