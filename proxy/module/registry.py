"""The module registry: every module under one or more directories, loaded once."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType

from proxy.module.loader import ModuleLoadError, is_module_dir, load_module, valid_module_name
from proxy.module.model import Module
from proxy.module.resolve import Unavailable, resolve


@dataclass(frozen=True, slots=True)
class LoadProblem:
    path: Path
    reason: str
    module_dir: Path | None = None
    """The module directory that failed (None for a missing modules directory)."""

    def __str__(self) -> str:
        return f"{self.path}: {self.reason}"


@dataclass(frozen=True, slots=True)
class ModuleRegistry:
    """Loaded modules by name, and the modules that could not be loaded (with the reason)."""

    modules: Mapping[str, Module]
    problems: tuple[LoadProblem, ...] = ()
    unavailable: Mapping[str, Unavailable] = field(default_factory=lambda: MappingProxyType({}))
    """Composites that loaded but cannot run (a missing dependency, a cycle, too deep)."""

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
                    problems.append(LoadProblem(exc.path, exc.reason, path))
                    continue
                if module.name in modules:
                    first = modules[module.name].path
                    problems.append(
                        LoadProblem(  # the duplicate's own directory is not a module to keep
                            path, f"duplicate module name {module.name!r} (first loaded from {first})"
                        )
                    )
                    continue
                modules[module.name] = module
        return cls.resolved(modules, problems)

    @classmethod
    def resolved(cls, modules: Mapping[str, Module], problems: Iterable[LoadProblem] = ()) -> ModuleRegistry:
        """A registry of ``modules`` with each composite's dependencies resolved."""
        runnable, unavailable = resolve(modules)
        problems = [
            *problems,
            *(
                LoadProblem(u.module.path, f"{u.code}: {u.reason}", u.module.path)
                for u in unavailable.values()
            ),
        ]
        return cls(MappingProxyType(runnable), tuple(problems), MappingProxyType(unavailable))

    def keeping_last_good(self, previous: ModuleRegistry) -> ModuleRegistry:
        """This registry, plus each module of ``previous`` whose directory now fails to load:
        a broken edit keeps the last good version serving (its problem is still reported)."""
        broken = {
            p.module_dir
            for p in self.problems
            if p.module_dir is not None
            and not any(u.module.path == p.module_dir for u in self.unavailable.values())
        }
        kept = {
            name: m for name, m in previous.modules.items() if m.path in broken and name not in self.modules
        }
        if not kept:
            return self
        return ModuleRegistry(MappingProxyType({**self.modules, **kept}), self.problems, self.unavailable)

    def get(self, name: str) -> Module | None:
        """The module called ``name``; None for unknown or unsafe names."""
        if not valid_module_name(name):
            return None
        return self.modules.get(name)

    def unavailable_module(self, name: str) -> Unavailable | None:
        return self.unavailable.get(name) if valid_module_name(name) else None

    def names(self) -> list[str]:
        return sorted(self.modules)
