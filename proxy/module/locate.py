"""Finding the module a command means: a module directory, or a name under the module dirs."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

from proxy.module.loader import ModuleLoadError, is_module_dir
from proxy.module.registry import ModuleRegistry


def _looks_like_path(text: str) -> bool:
    return os.sep in text or (os.altsep or os.sep) in text or text.startswith(".")


def locate_module(name_or_path: str, directories: Sequence[Path]) -> Path:
    """The directory of the module ``name_or_path`` names.

    An existing directory is taken as the module itself; otherwise a bare name is looked up in
    ``directories`` (by directory name, then by the ``name`` its manifest declares). Raises
    ``ModuleLoadError`` saying what could not be found: the directory, the module directory,
    or the module among the known ones.
    """
    path = Path(name_or_path)
    if path.is_dir():
        return path
    if path.exists():
        raise ModuleLoadError(path, "not a directory (a module is a directory)")
    if _looks_like_path(name_or_path):
        raise ModuleLoadError(path, "no such directory")
    missing = [d for d in directories if not d.is_dir()]
    if missing and len(missing) == len(directories):
        listed = ", ".join(str(d) for d in missing)
        raise ModuleLoadError(
            path, f"no such module: the module directory {listed} does not exist (--modules)"
        )
    for directory in directories:
        candidate = directory / name_or_path
        if candidate.is_dir():
            return candidate  # loading it says "not a module" if it is not one
        if directory.name == name_or_path and is_module_dir(directory):
            return directory
    registry = ModuleRegistry.load(directories)
    module = registry.get(name_or_path)
    if module is not None:
        return module.path
    searched = ", ".join(str(d) for d in directories)
    known = ", ".join(registry.names()) or "none"
    raise ModuleLoadError(path, f"no such module in {searched} (known: {known})")
