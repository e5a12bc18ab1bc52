"""The module registry: every module under one or more directories, loaded once."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType

from proxy.module.loader import ModuleLoadError, is_module_dir, load_module, valid_module_name
from proxy.module.model import Module


@dataclass(frozen=True, slots=True)
class LoadProblem:
    path: Path
    reason: str

    def __str__(self) -> str:
        return f"{self.path}: {self.reason}"


@dataclass(frozen=True, slots=True)
class ModuleRegistry:
    """Loaded modules by name, and the modules that could not be loaded (with the reason)."""

    modules: Mapping[str, Module]
    problems: tuple[LoadProblem, ...] = ()

    @classmethod
    def load(cls, directories: Iterable[Path]) -> ModuleRegistry:
        """Load every module under ``directories``; a broken module never stops the others.

        A directory may itself be a module, or hold modules as subdirectories. When two
        directories define the same name, the first one wins and the second is a problem.
        """
        modules: dict[str, Module] = {}
        problems: list[LoadProblem] = []
        for directory in directories:
            if not directory.is_dir():
                problems.append(LoadProblem(directory, "not a directory"))
                continue
            candidates = (
                [directory]
                if is_module_dir(directory)
                else sorted(p for p in directory.iterdir() if p.is_dir() and not p.name.startswith("."))
            )
            for path in candidates:
                try:
                    module = load_module(path)
                except ModuleLoadError as exc:
                    problems.append(LoadProblem(exc.path, exc.reason))
                    continue
                if module.name in modules:
                    first = modules[module.name].path
                    problems.append(
                        LoadProblem(
                            path, f"duplicate module name {module.name!r} (first loaded from {first})"
                        )
                    )
                    continue
                modules[module.name] = module
        return cls(MappingProxyType(modules), tuple(problems))

    def get(self, name: str) -> Module | None:
        """The module called ``name``; None for unknown or unsafe names."""
        if not valid_module_name(name):
            return None
        return self.modules.get(name)

    def names(self) -> list[str]:
        return sorted(self.modules)
