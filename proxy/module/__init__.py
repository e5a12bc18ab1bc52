"""Cognitive Modules: the value object, loaders for v2.2/v2.1/v1, and the registry."""

from proxy.module.loader import ModuleLoadError, load_module
from proxy.module.model import Module, ModuleFormat
from proxy.module.registry import LoadProblem, ModuleRegistry

__all__ = ["LoadProblem", "Module", "ModuleFormat", "ModuleLoadError", "ModuleRegistry", "load_module"]
