"""Cost counts: how many lines of a module run during a call, a measure of work that, unlike a
timing, is exact and the same on a busy machine (for "flat per request" and "linear" claims)."""

from __future__ import annotations

import sys
from collections.abc import Callable
from types import FrameType, ModuleType
from typing import Any


def lines_run(module: ModuleType, call: Callable[[], Any]) -> int:
    """Line events in ``module``'s code (its comprehensions and nested functions included) while
    ``call()`` runs."""
    filename = module.__file__
    count = 0

    def local(frame: FrameType, event: str, arg: Any) -> Any:
        nonlocal count
        if event == "line":
            count += 1
        return local

    def scope(frame: FrameType, event: str, arg: Any) -> Any:
        return local if frame.f_code.co_filename == filename else None

    previous = sys.gettrace()
    sys.settrace(scope)
    try:
        call()
    finally:
        sys.settrace(previous)
    return count
