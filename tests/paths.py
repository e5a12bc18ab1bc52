"""Where the repository's files are (a leaf: the fixtures and the harness both import it).

The suite runs against its own copy of the modules the project ships (``BUNDLED_MODULES``), made once
per test process: a module a user adds to ``modules/`` (as the authoring guide says) changes no test
outcome, and no test writes into the user's directory.
"""

from __future__ import annotations

import atexit
import shutil
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SHIPPED_MODULES = ROOT / "modules"
BUNDLED_MODULES = (
    "code-analyzer",
    "code-review-pipeline",
    "code-reviewer",
    "code-simplifier",
    "config-patcher",
    "idea-explorer",
    "image-describer",
    "interactive-reviewer",
    "security-scanner",
    "style-checker",
    "text-summarizer",
)


def _private_copy() -> Path:
    root = Path(tempfile.mkdtemp(prefix="cogproxy-test-modules-"))
    atexit.register(shutil.rmtree, root, True)
    target = root / "modules"
    target.mkdir()
    for name in BUNDLED_MODULES:
        shutil.copytree(SHIPPED_MODULES / name, target / name)
    return target


MODULES = _private_copy()
