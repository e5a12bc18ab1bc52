"""Where the repository's files are (a leaf: the fixtures and the harness both import it)."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MODULES = ROOT / "modules"
