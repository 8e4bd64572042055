"""Method registry: every module in `autofl.methods` that defines a `Method` subclass registers it.

Adding a method means adding one file in this package; nothing else changes.
"""

from __future__ import annotations

import importlib
import pkgutil

from autofl.methods.base import Method

_REGISTRY: dict[str, type[Method]] = {}
_NOT_METHODS = {"base", "registry"}
_discovered = False


def register(cls: type[Method]) -> type[Method]:
    if not cls.name:
        raise TypeError(f"{cls.__qualname__} has no name")
    _REGISTRY[cls.name] = cls
    return cls


def _discover() -> None:
    """Import every method module once (a module imported directly registers only itself)."""
    global _discovered
    if _discovered:
        return
    _discovered = True
    import autofl.methods as package

    for info in pkgutil.iter_modules(package.__path__):
        if info.name not in _NOT_METHODS and not info.name.startswith("_"):
            importlib.import_module(f"autofl.methods.{info.name}")


def method_names() -> list[str]:
    _discover()
    return sorted(_REGISTRY)


def all_methods() -> dict[str, type[Method]]:
    _discover()
    return dict(_REGISTRY)


def get_method_class(name: str) -> type[Method]:
    _discover()
    return _REGISTRY[name]
